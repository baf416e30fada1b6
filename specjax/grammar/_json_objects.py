"""Objects of the JSON Schema compiler: member chains, counts, dependencies, and the keys of extra members."""

from __future__ import annotations

import functools

from specjax.grammar import _charsets as cs
from specjax.grammar import _json_schema_logic as logic
from specjax.grammar import regex as rx
from specjax.grammar._json_names import KeyFilter, key_filter, other_key_dfa
from specjax.grammar._json_schema_logic import EmptySchemaError, SchemaError
from specjax.grammar._json_text import _pointer, _trie, json_string_terminal, lark_literal
from specjax.grammar._regex_fsm import TooLarge, fsm_rules, key_region_rules, key_regions
from specjax.grammar.terminals import remember_terminal

_MAX_PATTERNS = 8  # patternProperties next to extra keys (19 disjoint ones: 16 s of interegular products)
_KEY_CHARS = ((0x20, 0x7E),)  # extra keys next to patternProperties: printable ASCII (see _pattern_tail)


class ObjectEmitter:
    """The object part of :class:`~specjax.grammar._json_schema_types.TypeEmitter` (a mixin: ``self.c`` is the
    owning compiler; ``comma`` and ``_repeat_group`` come from the TypeEmitter)."""

    # ---------------------------------------------------------------------------------- objects
    def object(self, node: dict, path: str) -> str:
        props, required = node.get("properties", {}), node.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise SchemaError("properties", path, "properties must be an object and required an array")
        extra = node.get("additionalProperties", True)
        patterns = node.get("patternProperties", {})
        if not isinstance(patterns, dict):
            raise SchemaError("patternProperties", path, "must be an object (pattern → schema)")
        members = []  # (name, schema, schema path, required, memo key)
        for name, sub in props.items():
            if sub is False:
                if name in required:
                    raise EmptySchemaError("required", path, f"property {name!r} is required but its schema is false")
                continue
            members.append((name, *self._matched(name, sub, f"{path}/properties/{_pointer(name)}", patterns),
                            name in required))
        for name in dict.fromkeys(required):
            if name not in props:
                if extra is False and not any(logic._search(p, name) for p in patterns):
                    raise EmptySchemaError("required", path, f"property {name!r} is required but not in properties and "
                                                        "additionalProperties is false (empty language)")
                members.append((name, *self._matched(name, None if patterns else extra, f"{path}/additionalProperties",
                                                     patterns, extra), True))
        members = [(n, s, p, req, key) for n, s, key, p, req in members]
        extras = not self.c.options.strict_objects and (extra is not False or bool(patterns))
        filt = None  # the keys propertyNames allows (None: all)
        if "propertyNames" in node:
            names = node["propertyNames"]
            if isinstance(names, dict):
                names, _ = self.c.flatten(names, f"{path}/propertyNames")
            filt = key_filter(self.c, names, path) if extras else None
            members = self._named_members(path, members, names)
        pairs, names = [], []
        for n, s, p, req, key in members:
            try:
                pairs.append((self._pair(logic.canonical(n), s, p, key), req))
                names.append(n)
            except EmptySchemaError:
                if req:
                    raise
                # an optional property whose schema nothing satisfies can only be absent (exact)
        tail, listed = None, [n for n, *_ in members] + list(props)
        if extras:
            tail = self._pattern_tail(extra, patterns, listed, path, filt) if patterns else \
                self._extra_tail(extra, listed, path, filt)
        count = self._property_counts(node, path)
        deps, dead = self._dependencies(node, path, names, tail is not None, listed)
        if dead:  # a member whose dependency cannot appear can only be absent
            if dead & {n for n, (_, req) in zip(names, pairs, strict=True) if req}:
                raise EmptySchemaError("dependencies", path, f"required property {sorted(dead)[0]!r} depends on a "
                                                             "property that cannot appear (empty language)")
            pairs = [p for n, p in zip(names, pairs, strict=True) if n not in dead]
            names = [n for n in names if n not in dead]
        body = self._members(pairs, tail, path) if count == (0, None) and not deps else \
            self._counted_members(pairs, tail, path, *count, names=names, deps=deps)
        w = self.c.ws
        return f'"{{"{w} {body}{w} "}}"' if body else f'"{{"{w} "}}"'

    def _matched(self, name: str, sub, spath: str, patterns: dict, extra=True) -> tuple:
        """(schema, memo key, schema path) of a listed name: its own schema (None: none, so additionalProperties
        unless a pattern matches) and the schemas of the patterns that match it (as validators match: re.search)."""
        matching = [p for p in patterns if logic._search(p, name)]
        if not matching:
            schema = extra if sub is None else sub
            # an allOf here may be made by merging (its pointer also names the unmerged schema, which a $ref may
            # reach): memoized by content too
            key = f"{spath}|{logic.canonical(schema)}" if isinstance(schema, dict) and "allOf" in schema else None
            return schema, key, spath
        parts = ([] if sub is None else [sub]) + [patterns[p] for p in matching]
        return {"allOf": parts}, None, f"{spath}/(with patternProperties)"  # a merged schema: its own location

    def _extra_tail(self, extra, listed: list[str], path: str, filt: KeyFilter | None = None) -> str | None:
        if filt is None:
            key = self._key_not_in(listed)
        else:  # the keys propertyNames allows, minus the listed names
            try:
                key = self._add_rules(f"{path}/key", lambda n: key_region_rules(
                    list(filt.regexes), listed, n, cs.ANY, lo=filt.lo, hi=filt.hi))[0]
            except TooLarge as e:
                raise SchemaError("propertyNames", path, f"the extra keys need {e}; pass strict_objects") from None
            if key is None:
                return None
        try:
            value = self.c.rule(extra, f"{path}/additionalProperties")
        except EmptySchemaError:
            return None
        return self.c.rule_text(f"{path}/extra", f'{key}{self.c.ws} ":"{self.c.ws} {value}')

    def _pattern_tail(self, extra, patterns: dict, listed: list[str], path: str,
                      filt: KeyFilter | None = None) -> str | None:
        """Extra members next to patternProperties: one key language per set of matching patterns (regex
        intersection and difference on DFAs, `key_regions`), its value the allOf of their schemas (none:
        additionalProperties).

        Extra keys are printable ASCII: there ECMA-262, Python's re (the validators') and the regex front-end
        agree on every class (``\\d``, ``\\w``, ``\\s``, ``.``, ``$``), so a key's region is the validator's.
        """
        if len(patterns) > _MAX_PATTERNS:
            raise SchemaError("patternProperties", path, f"{len(patterns)} patterns next to extra keys (compiled up "
                                                         f"to {_MAX_PATTERNS}: the key regions are built with "
                                                         "interegular, seconds per pattern); pass strict_objects")
        regex = {}
        for p in patterns:
            try:
                regex[p] = rx.translate(p, cs.class_text, search=True)
            except rx.RegexError as e:
                raise SchemaError("patternProperties", f"{path}/patternProperties/{_pointer(p)}", str(e)) from None
        ps, w, alts = list(patterns), self.c.ws, []
        try:
            filt = filt or KeyFilter()
            regions = key_regions([regex[p] for p in ps], listed, _KEY_CHARS, within=filt.regexes)
        except TooLarge as e:
            raise SchemaError("patternProperties", path, f"the keys of {len(ps)} patterns need {e}; pass "
                                                         "strict_objects") from None
        for fsm, members in regions:
            inside = [ps[i] for i in sorted(members)]
            if not inside and extra is False:
                continue
            # several patterns: a merged schema, its own location (member rules are memoized by path)
            spath = f"{path}/additionalProperties" if not inside else \
                f"{path}/patternProperties/{_pointer(inside[0])}" if len(inside) == 1 else \
                f"{path}/patternProperties/({' & '.join(_pointer(p) for p in inside)})"
            schema = extra if not inside else patterns[inside[0]] if len(inside) == 1 else \
                {"allOf": [patterns[p] for p in inside]}
            name, added = self._add_rules(f"{path}/key", lambda n, fsm=fsm: fsm_rules(fsm, filt.lo, filt.hi, n))
            if name is None:
                continue
            try:
                value = self.c.rule(schema, spath, key=None if len(inside) < 2 else f"{spath}|{sorted(members)}")
            except EmptySchemaError:  # keys of this region cannot appear (exact)
                for r in added:
                    del self.c.rules[r]
                continue
            alts.append(f'{name}{w} ":"{w} {value}')
        return self.c.rule_text(f"{path}/extra", " | ".join(alts)) if alts else None

    def _add_rules(self, path: str, make) -> tuple[str | None, list[str]]:
        """Adds the rules ``make(name)`` writes (``{name}_s`` its start; {} when empty) under a fresh name; returns
        the name (None when empty) and the rule names added."""
        name = self.c._new_name(path)
        rules = make(name)
        while any(r in self.c.rules for r in rules):  # "{name}_{q}_0" met another rule's name
            name = self.c._new_name(f"{path}/{len(self.c.rules)}")
            rules = make(name)
        if not rules:
            return None, []
        self.c.rules.update(rules)
        self.c.rules[name] = f"{name}_s"  # reserves the name
        return name, [*rules, name]

    def _pair(self, key_json: str, sub, spath: str, key: str | None = None) -> str:
        return f'{lark_literal(key_json)}{self.c.ws} ":"{self.c.ws} {self.c.rule(sub, spath, key)}'

    def _members(self, pairs: list[tuple[str, bool]], tail: str | None, path: str) -> str:
        """Members in schema order; optional ones may be skipped; commas only between present ones."""
        comma, n = self.comma, len(pairs)
        after = [""] * (n + 1)  # after[k]: members k.. once something was written (each preceded by a comma)
        bound = self.c.options.max_repeat
        after[n] = (f"({comma} {tail})*" if bound is None else self._repeat_group(f"{comma} {tail}", 0, bound, path)) \
            if tail else ""
        for k in range(n - 1, -1, -1):
            pair, req = pairs[k]
            head = f"{comma} {pair}" if req else f"({comma} {pair})?"
            after[k] = self._fresh(path, "more", f"{head} {after[k + 1]}".strip())
        first = "" if not tail else f"({tail} ({comma} {tail})*)?" if bound is None else \
            f"({tail} {self._repeat_group(f'{comma} {tail}', 0, bound - 1, path)})?"
        for k in range(n - 1, -1, -1):
            pair, req = pairs[k]
            written = f"{pair} {after[k + 1]}".strip()
            if not req:  # skipping member k leaves the members after it, still with nothing written
                written = f"{written} | {first}" if first else f"({written})?"
            first = written
            first = self._fresh(path, "members", first)
        return first

    @staticmethod
    def _named_members(path: str, members: list, names) -> list:
        """propertyNames (flattened): a listed name it refuses can only be absent (extra keys: `key_filter`)."""
        kept = []
        for member in members:
            try:
                ok = names is True or names is not False and isinstance(names, dict) and \
                    logic.value_ok(member[0], {"type": "string", **names}, f"{path}/propertyNames")
            except SchemaError as e:
                raise SchemaError("propertyNames", path, f"the key constraint {e.keyword!r} is not checked "
                                                         "against the listed property names") from None
            if ok:
                kept.append(member)
            elif member[3]:
                raise EmptySchemaError("propertyNames", path, f"required property {member[0]!r} is not a valid "
                                                              "property name (empty language)")
        return kept

    @staticmethod
    def _property_counts(node: dict, path: str) -> tuple[int, int | None]:
        lo, hi = node.get("minProperties", 0), node.get("maxProperties")
        for kw, v in (("minProperties", lo), ("maxProperties", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(kw, path, f"must be a non-negative integer, got {v!r}")
            if v is not None and v > 64:
                raise SchemaError(kw, path, f"{v} properties: the member count is automaton state, compiled up to 64")
        if hi is not None and lo > hi:
            raise EmptySchemaError("minProperties", path, "minProperties > maxProperties (empty language)")
        return lo, hi

    def _dependencies(self, node: dict, path: str, names: list[str], extras: bool,
                      listed: list[str]) -> tuple[dict[str, set[str]], set[str]]:
        """dependencies (drafts <= 7, array form) / dependentRequired (2019-09+) as {name: names it requires}, and
        the members that can only be absent (they require a name that cannot appear). ``listed``: names no extra
        key can be (with ``extras``)."""
        out: dict[str, set[str]] = {}
        kw = "dependencies" if self.c.draft <= 7 else "dependentRequired"  # the other is no keyword of the draft
        for a, need in (node.get(kw) or {}).items():
            if not isinstance(need, list):  # json_schema.py splits the schema form into cases before this
                raise SchemaError(kw, f"{path}/{kw}/{_pointer(a)}", "a schema-valued dependency is not compiled "
                                                                    "(only the array form: required names)")
            if a not in names:
                if extras and a not in listed and set(need) - set(node.get("required", [])):
                    raise SchemaError(kw, path, f"a dependency of key {a!r}, which only an extra key can be, is "
                                                "not compiled (pass strict_objects)")
                continue  # a key that never appears triggers nothing
            out.setdefault(a, set()).update(b for b in need if b != a)
        dead: set[str] = set()
        while True:  # a member requiring a name that cannot appear (or a dead member) is dead too
            more = {a for a, need in out.items() if a not in dead and any(b not in names or b in dead for b in need)}
            for a in more:
                if extras and any(b not in names and b not in listed for b in out[a]):
                    raise SchemaError(kw, path, f"key {a!r} requires a key only an extra key can be, which is not "
                                                "compiled (pass strict_objects)")
            if not more:
                break
            dead |= more
        return {a: need for a, need in out.items() if need and a not in dead}, dead

    def _counted_members(self, pairs: list[tuple[str, bool]], tail: str | None, path: str, lo: int,
                         hi: int | None, names: list[str] | None = None,
                         deps: dict[str, set[str]] | None = None) -> str | None:
        """Members as in :meth:`_members`, counting those written (up to ``max(lo, hi)``): min/maxProperties;
        and with ``deps``, a member is written only with the members it requires (dependentRequired)."""
        comma, n, cap = self.comma, len(pairs), lo if hi is None else hi
        names, deps = names or [""] * len(pairs), deps or {}
        index = {name: i for i, name in enumerate(names)}
        targets = set().union(*deps.values()) if deps else set()
        memo: dict[tuple, str | None] = {}

        def extras(c: int, written: bool) -> str | None:  # extra members once c members are written
            a, b = max(lo - c, 0), (None if hi is None else hi - c)
            if self.c.options.max_repeat is not None:
                b = max(a, self.c.options.max_repeat if b is None else min(b, self.c.options.max_repeat))
            if b is not None and b < a:
                return None
            if tail is not None and a >= 2:  # nothing keeps two extra keys distinct, and a duplicate counts once
                raise SchemaError("minProperties", path, f"reaching {lo} members may need {a} extra keys, and the "
                                                         "grammar cannot keep extra keys distinct")
            if tail is None:
                return "" if a == 0 else None
            item = f"{comma} {tail}"
            if written or a == 0 and b == 0:
                return self._repeat_group(item, a, b, path) if b is None or b >= a else None
            body = f"{tail} {self._repeat_group(item, max(a - 1, 0), None if b is None else b - 1, path)}".strip()
            return body if a else f"({body})?"

        def rest(k: int, c: int, written: bool, must: frozenset = frozenset(), have: frozenset = frozenset()):
            """Members k.. with c written so far, ``must`` still to come, ``have`` the targets written."""
            key = (k, min(c, cap), written, must, have)
            if key not in memo:
                if k == n:
                    memo[key] = extras(min(c, cap), written) if not must else None
                else:
                    (pair, req), name = pairs[k], names[k]
                    need = deps.get(name, set())
                    sep = f"{comma} " if written else ""
                    alts = []
                    if (hi is None or c < hi) and all(b in have or index[b] > k for b in need):
                        gain = have | ({name} & targets)
                        after = rest(k + 1, c + 1, True, (must - {name}) | {b for b in need if index[b] > k}, gain)
                        if after is not None:
                            alts.append(f"{sep}{pair} {after}".strip())
                    if not req and name not in must:
                        skip = rest(k + 1, c, written, must, have)
                        if skip is not None:
                            alts.append(skip or "")
                    body = " | ".join(f"({a})" if a else "" for a in alts if a) if alts else None
                    if body is not None and "" in alts:
                        body = f"({body})?" if body else ""
                    memo[key] = None if body is None else self._fresh(path, "members", body) if body else ""
            return memo[key]

        body = rest(0, 0, False)
        if body is None:
            raise EmptySchemaError("minProperties", path, "no object with these properties has that many "
                                                          "members (empty language)")
        return body

    def _fresh(self, path: str, kind: str, body: str) -> str:
        return self.c.rule_text(f"{path}/{kind}", body) if body else ""

    def _key_not_in(self, names: list[str]) -> str:
        """A JSON string terminal for any key except `names` (canonical encoding, so no aliases); its DFA is built
        directly (``other_key_dfa``), the regex is its definition and the way to it elsewhere."""
        text = self._key_not_in_text(names)
        remember_terminal(text, functools.partial(other_key_dfa, tuple(names)))
        return text

    def _key_not_in_text(self, names: list[str]) -> str:
        """The regex of :meth:`_key_not_in`.

        A key that is not a name either stops inside the trie of the names (a proper prefix that is not a
        name), or leaves it: by a raw character no name continues with, or by an escaped character (names
        hold none, see below). After leaving, anything may follow, written once at the end rather than
        at every trie node (that made the regex, and interegular's work, grow with nodes x ~60 positions).
        """
        if any(cs.intersect(cs.of_chars(n), cs.difference(cs.ANY, cs.JSON_RAW)) for n in names):
            return self._key_not_in_per_node(names)  # a name with an escaped character: the general form
        trie = _trie(names)
        escaped = cs.json_class_text(cs.difference(cs.ANY, cs.JSON_RAW))

        def leave(node: dict) -> str:  # a trie path, then a raw character off the trie
            kids = [k for k in node if k]
            alts = [cs.json_class_text(cs.difference(cs.JSON_RAW, cs.of_chars("".join(kids))))]
            alts += [cs.json_class_text(cs.of_chars(k)) + leave(node[k]) for k in kids]
            return "(?:" + "|".join(alts) + ")"

        def prefix(node: dict, names_too: bool) -> str | None:  # a trie path (ending at a name if names_too)
            kids = [(k, prefix(node[k], names_too)) for k in node if k]
            alts = [""] if names_too or not node.get("") else []
            alts += [cs.json_class_text(cs.of_chars(k)) + p for k, p in kids if p is not None]
            return "(?:" + "|".join(alts) + ")" if alts else None

        ended = prefix(trie, False)
        tail = f"(?:{leave(trie)}|{prefix(trie, True)}{escaped}){cs.json_class_text(cs.ANY)}*"
        return json_string_terminal(f"(?:{tail}|{ended})" if ended is not None else tail)

    def _key_not_in_per_node(self, names: list[str]) -> str:
        """The same language, "anything" written at every trie node (names with escaped characters)."""
        trie = _trie(names)
        any_char = cs.json_class_text(cs.ANY)

        def walk(node: dict) -> str:
            kids = [k for k in node if k]
            alts = [] if node.get("") else [""]
            other = cs.difference(cs.ANY, cs.of_chars("".join(kids)))
            alts.append(f"{cs.json_class_text(other)}{any_char}*")
            alts += [cs.json_class_text(cs.of_chars(k)) + walk(node[k]) for k in kids]
            return "(?:" + "|".join(alts) + ")"

        return json_string_terminal(walk(trie))
