"""Per-type grammar for one flattened JSON Schema node: values, objects, arrays, strings, numbers."""

from __future__ import annotations

import math

from specjax.grammar import _charsets as cs
from specjax.grammar import _json_schema_logic as logic
from specjax.grammar import regex as rx
from specjax.grammar._json_formats import FORMATS
from specjax.grammar._json_schema_logic import EmptySchemaError, SchemaError
from specjax.grammar._json_text import (
    _MAX_SAFE,
    NUMBER_REGEX,
    _check_count,
    _pointer,
    _repeat,
    _trie,
    json_string_terminal,
    lark_literal,
)
from specjax.grammar._regex_fsm import TooLarge, length_bounded_rules
from specjax.grammar._regex_ranges import int_range, number_range


class TypeEmitter:
    """Writes the Lark expression for each type a node admits; `c` is the owning compiler."""

    def __init__(self, compiler):
        self.c = compiler

    @property
    def comma(self) -> str:
        return f'{self.c.ws} ","{self.c.ws}'

    def typed(self, node: dict, path: str) -> str:
        types = logic.type_set(node, path)
        if "enum" in node or "const" in node:
            return self.values(node, path)
        alts = []
        if "null" in types:
            alts.append('"null"')
        if "boolean" in types:
            alts.append('"true" | "false"')
        for kind, emit in (("object", self.object), ("array", self.array), ("string", self.string)):
            if kind in types:
                alts.append(emit(node, path))
        if "integer" in types:
            alts.append(self.number(node, path, integer="number" not in types))
        alts = [a for a in alts if a]
        if not alts:
            raise EmptySchemaError("type", path, "no value satisfies the schema (empty language)")
        return " | ".join(alts)

    # ----------------------------------------------------------------------------------- values
    def values(self, node: dict, path: str) -> str:
        kw = "enum" if "enum" in node else "const"
        vals = node["enum"] if kw == "enum" else [node["const"]]
        if not isinstance(vals, list):
            raise SchemaError("enum", path, "must be an array")
        if kw == "enum" and "const" in node:
            vals = [v for v in vals if logic.canonical(v) == logic.canonical(node["const"])]
        texts = list(dict.fromkeys(logic.canonical(v) for v in vals if logic.value_ok(v, node, path)))
        if not texts:
            raise EmptySchemaError(kw, path, "no listed value satisfies the rest of the schema (empty language)")
        return " | ".join(lark_literal(t) for t in texts)

    # ---------------------------------------------------------------------------------- objects
    def object(self, node: dict, path: str) -> str:
        props, required = node.get("properties", {}), node.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise SchemaError("properties", path, "properties must be an object and required an array")
        extra = node.get("additionalProperties", True)
        members = []  # (name, schema, schema path, required)
        for name, sub in props.items():
            if sub is False:
                if name in required:
                    raise EmptySchemaError("required", path, f"property {name!r} is required but its schema is false")
                continue
            members.append((name, sub, f"{path}/properties/{_pointer(name)}", name in required))
        for name in dict.fromkeys(required):
            if name not in props:
                if extra is False:
                    raise EmptySchemaError("required", path, f"property {name!r} is required but not in properties and "
                                                        "additionalProperties is false (empty language)")
                members.append((name, extra, f"{path}/additionalProperties", True))
        if "propertyNames" in node:
            members = self._named_members(node, path, members, extra)
        pairs, names = [], []
        for n, s, p, req in members:
            try:
                pairs.append((self._pair(logic.canonical(n), s, p), req))
                names.append(n)
            except EmptySchemaError:
                if req:
                    raise
                # an optional property whose schema nothing satisfies can only be absent (exact)
        tail = None
        if extra is not False and not self.c.options.strict_objects:
            key = self._key_not_in([n for n, *_ in members] + list(props))
            try:
                value = self.c.rule(extra, f"{path}/additionalProperties")
                tail = self.c.rule_text(f"{path}/extra", f'{key}{self.c.ws} ":"{self.c.ws} {value}')
            except EmptySchemaError:
                tail = None
        count = self._property_counts(node, path)
        deps = self._dependencies(node, path, names, tail is not None)
        body = self._members(pairs, tail, path) if count == (0, None) and not deps else \
            self._counted_members(pairs, tail, path, *count, names=names, deps=deps)
        w = self.c.ws
        return f'"{{"{w} {body}{w} "}}"' if body else f'"{{"{w} "}}"'

    def _pair(self, key_json: str, sub, spath: str) -> str:
        return f'{lark_literal(key_json)}{self.c.ws} ":"{self.c.ws} {self.c.rule(sub, spath)}'

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

    def _named_members(self, node: dict, path: str, members: list, extra) -> list:
        """propertyNames: a listed name it refuses can only be absent; extra keys would need the intersection
        of two regular languages in the key terminal, so they must be off (strict_objects or
        additionalProperties false)."""
        names = node["propertyNames"]
        if extra is not False and not self.c.options.strict_objects and names is not True:
            raise SchemaError("propertyNames", path, "key constraints on extra keys are not compiled (pass "
                              "strict_objects, or set additionalProperties false)")
        kept = []
        for member in members:
            ok = names is True or names is not False and isinstance(names, dict) and \
                logic.value_ok(member[0], {"type": "string", **names}, f"{path}/propertyNames")
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

    def _dependencies(self, node: dict, path: str, names: list[str], extras: bool) -> dict[str, set[str]]:
        """dependencies (drafts <= 7, array form) / dependentRequired (2019-09+) as {name: names it requires}."""
        out: dict[str, set[str]] = {}
        kw = "dependencies" if self.c.draft <= 7 else "dependentRequired"  # the other is no keyword of the draft
        for _ in (0,):
            for a, need in (node.get(kw) or {}).items():
                if not isinstance(need, list):
                    raise SchemaError(kw, f"{path}/{kw}/{_pointer(a)}", "a schema-valued dependency is not compiled "
                                                                        "(only the array form: required names)")
                if a not in names:
                    if extras and set(need) - set(node.get("required", [])):
                        raise SchemaError(kw, path, f"a dependency of key {a!r}, which only an extra key can be, is "
                                                    "not compiled (pass strict_objects)")
                    continue  # a key that never appears triggers nothing
                for b in need:
                    if b not in names and b != a:
                        raise SchemaError(kw, path, f"key {a!r} requires {b!r}, which is not a property of the schema")
                out.setdefault(a, set()).update(b for b in need if b != a)
        return {a: need for a, need in out.items() if need}

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
        """A JSON string terminal for any key except `names` (canonical encoding, so no aliases).

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

    # ----------------------------------------------------------------------------------- arrays
    def array(self, node: dict, path: str) -> str | None:
        prefix, rest, rest_path, prefix_kw = self._item_schemas(node, path)
        lo, hi = node.get("minItems", 0), node.get("maxItems")
        for kw, v in (("minItems", lo), ("maxItems", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(kw, path, f"must be a non-negative integer, got {v!r}")
        _check_count("minItems", path, lo, "items")
        if node.get("uniqueItems") is True and (hi is None or hi > 1):
            raise SchemaError("uniqueItems", path, "item uniqueness is not context-free (only with maxItems <= 1)")
        for i, p in enumerate(prefix):
            if p is False:
                hi, prefix = (i if hi is None else min(hi, i)), prefix[:i]
                break
        if rest is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is None and self.c.options.max_repeat is not None and not self.c.has_refs:
            # free repetition bounded by option; not where $ref may recurse: a counter per nesting level would
            # multiply the automaton (a 3-level tree: 61 states unbounded, 5,444 with 16 items)
            hi = max(lo, len(prefix) + self.c.options.max_repeat)
        if hi is not None and lo > hi:
            return None
        elems, more = [], None
        try:  # an item schema nothing satisfies ends the array before that position (exact)
            for i, p in enumerate(prefix):
                elems.append(self.c.rule(p, f"{path}/{prefix_kw}/{i}"))
            more = None if rest is False else self.c.rule(rest, rest_path)
        except EmptySchemaError:
            hi = len(elems) if hi is None else min(hi, len(elems))
            if lo > hi:
                raise
        w = self.c.ws
        body = self._items(elems, more, lo, hi, 0, path)
        return f'"["{w} {body}{w} "]"' if body else f'"["{w} "]"'

    def _item_schemas(self, node: dict, path: str):
        if self.c.draft >= 2020:
            for kw, why in (("additionalItems", "is not a draft 2020-12 keyword (use items)"),):
                if kw in node:
                    raise SchemaError(kw, path, why)
            if isinstance(node.get("items"), list):
                raise SchemaError("items", path, "an array of schemas is draft 2019-09 syntax; in 2020-12 use "
                                                 "prefixItems (or declare the draft in $schema)")
            return list(node.get("prefixItems", [])), node.get("items", True), f"{path}/items", "prefixItems"
        if "prefixItems" in node:
            raise SchemaError("prefixItems", path, f"is draft 2020-12 syntax but this schema is draft {self.c.draft}")
        items = node.get("items", True)
        if isinstance(items, list):
            return items, node.get("additionalItems", True), f"{path}/additionalItems", "items"
        return [], items, f"{path}/items", "items"

    def _items(self, elems: list[str], more: str | None, lo: int, hi: int | None, i: int, path: str) -> str:
        """Items from index i on (i > 0: one comma before each)."""
        comma = self.comma if i else ""
        if i < len(elems):
            if hi is not None and i >= hi:
                return ""
            seq = f"{comma} {elems[i]} {self._items(elems, more, lo, hi, i + 1, path)}".strip()
            return seq if i < lo else f"({seq})?"
        if more is None or (hi is not None and hi <= i):
            return ""
        a, b = max(lo - i, 0), (None if hi is None else hi - i)
        if i == 0:  # the first item has no comma before it
            rest = self._repeat_group(f"{self.comma} {more}", max(a - 1, 0), None if b is None else b - 1, path)
            seq = f"{more} {rest}".strip()
            return seq if a >= 1 else f"({seq})?"
        return self._repeat_group(f"{comma} {more}", a, b, path)

    def _repeat_group(self, item: str, a: int, b: int | None, path: str) -> str:
        if b == 0:
            return ""
        if b is None:
            return f"({item})*" if a == 0 else f"({item})+" if a == 1 else f"({item})~{a} ({item})*"
        if b - a <= 4:
            return f"({item})~{a}" if a == b else f"({item})~{a}..{b}"
        # lark writes x~a..b as one alternative per count (quadratic in b, minutes for maxItems 10000); a chain
        # of rules "(x (up to k-1 more))?" is linear
        more = ""
        for _ in range(b - a):
            more = self.c.rule_text(f"{path}/more_items", f"({item} {more})?" if more else f"({item})?")
        return f"({item})~{a} {more}" if a else more

    # ---------------------------------------------------------------------------------- strings
    def string(self, node: dict, path: str) -> str:
        lo, hi = node.get("minLength", 0), node.get("maxLength")
        for kw, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(kw, path, f"must be a non-negative integer, got {v!r}")
        if hi is not None and lo > hi:
            return None
        _check_count("minLength", path, lo, "characters")
        body, width = self._string_body(node, path)
        if body is None or not (lo <= width[0] and (hi is None or (width[1] is not None and width[1] <= hi))):
            _check_count("maxLength", path, hi or 0, "characters", at_least=False)
        if body is None:
            return json_string_terminal(_repeat(cs.json_class_text(cs.ANY), lo, hi))
        if lo <= width[0] and (hi is None or (width[1] is not None and width[1] <= hi)):
            return json_string_terminal(body)  # the length bounds hold for every string of the pattern/format
        simple = rx.class_repeat(node["pattern"]) if "pattern" in node else None
        if simple is None:
            return self._length_automaton(node, path, lo, hi, width)
        chars, a, b = simple
        a, b = max(a, lo), (hi if b is None else b if hi is None else min(b, hi))
        if b is not None and a > b:
            return None
        return json_string_terminal(_repeat(cs.json_class_text(chars), a, b))

    def _length_automaton(self, node: dict, path: str, lo: int, hi: int | None, width) -> str | None:
        """Pattern/format ∩ length range as right-linear rules over a DFA × counter product."""
        fmt = node.get("format")
        regex = FORMATS[fmt] if fmt in FORMATS else rx.translate(node["pattern"], cs.class_text, search=True)
        name = self.c._new_name(f"{path}/length")
        try:
            rules = length_bounded_rules(regex, lo, hi, name)
        except TooLarge as e:
            kw = "minLength" if lo > width[0] else "maxLength"
            raise SchemaError(kw, path, f"combined with a pattern/format, the length-bounded automaton has {e}; "
                                        "not compiled") from None
        if not rules:
            return None
        self.c.rules.update(rules)
        return f"{name}_s"

    def _string_body(self, node: dict, path: str):
        fmt, pattern = node.get("format"), node.get("pattern")
        if fmt is not None and fmt not in FORMATS:
            if self.c.options.unknown_formats == "ignore":
                fmt = None
            else:
                raise SchemaError("format", path, f"format {fmt!r} has no exact grammar (supported: "
                                                  f"{', '.join(FORMATS)}); pass unknown_formats='ignore' to leave it "
                                                  "unenforced (json_unknown_formats=ignore on the command line)")
        if fmt is not None and pattern is not None:
            raise SchemaError("pattern", path, "pattern together with format is not supported")
        if fmt is not None:
            return FORMATS[fmt], rx.width(FORMATS[fmt])
        if pattern is None:
            return None, (0, None)
        try:
            return rx.translate(pattern, cs.json_class_text, search=True), rx.width(pattern, search=True)
        except rx.RegexError as e:
            raise SchemaError("pattern", path, str(e)) from None

    # ---------------------------------------------------------------------------------- numbers
    def number(self, node: dict, path: str, integer: bool) -> str | None:
        if "multipleOf" in node:
            if node["multipleOf"] != 1 or isinstance(node["multipleOf"], bool):
                raise SchemaError("multipleOf", path, "only multipleOf 1 is supported (other steps are not compiled)")
            integer = True
        lo, lo_excl, hi, hi_excl = self._bounds(node, path)
        if integer:
            ilo = None if lo is None else math.floor(lo) + 1 if lo_excl else math.ceil(lo)
            ihi = None if hi is None else math.ceil(hi) - 1 if hi_excl else math.floor(hi)
            text = int_range(ilo, ihi)
        elif lo is None and hi is None:
            text = NUMBER_REGEX
        else:
            for kw, b in (("minimum", lo), ("maximum", hi)):
                if b is not None and (not float(b).is_integer() or abs(b) > _MAX_SAFE):
                    raise SchemaError(kw, path, f"bound {b!r} on a non-integer number: only integer bounds up to "
                                                "2**53 are compiled exactly")
            alts = number_range(None if lo is None else int(lo), lo_excl, None if hi is None else int(hi), hi_excl)
            return " | ".join(f"/{a}/" for a in alts) or None
        return None if text is None else f"/{text}/"

    def _bounds(self, node: dict, path: str):
        """(lo, lo exclusive, hi, hi exclusive) under the draft's syntax (draft 4: boolean exclusives)."""
        out = []
        for inc, exc in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            m, e = node.get(inc), node.get(exc)
            for kw, v in ((inc, m), (exc, e)):
                if v is not None and not (isinstance(v, int | float) and math.isfinite(v)) and \
                        not (self.c.draft <= 4 and kw == exc and isinstance(v, bool)):
                    raise SchemaError(kw, path, f"must be a finite number, got {v!r}")
            if self.c.draft <= 4:
                out += [m, bool(e) and m is not None]
            elif isinstance(e, bool):
                raise SchemaError(exc, path, "a boolean is draft 4 syntax; from draft 6 on it must be a number")
            elif e is None or m is None:
                out += [m, False] if e is None else [e, True]
            else:
                tighter_e = e >= m if inc == "minimum" else e <= m
                out += [e, True] if tighter_e else [m, False]
        return tuple(out)
