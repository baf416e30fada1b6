"""Per-type grammar for one flattened JSON Schema node: values, objects, arrays, strings, numbers."""

from __future__ import annotations

import json
from re import _parser as sre_parse

from specjax.grammar import _charsets as cs
from specjax.grammar import _json_schema_logic as logic
from specjax.grammar import regex as rx
from specjax.grammar._counted import MAX_POSITIONS, positions
from specjax.grammar._json_conditions import leaf_not
from specjax.grammar._json_formats import FORMATS, SPEC_FORMATS
from specjax.grammar._json_numbers import NumberEmitter
from specjax.grammar._json_objects import ObjectEmitter
from specjax.grammar._json_schema_logic import EmptySchemaError, SchemaError
from specjax.grammar._json_text import (
    _check_count,
    _repeat,
    json_string_terminal,
    lark_literal,
)
from specjax.grammar._regex_fsm import (
    TooLarge,
    intersection_rules,
    key_region_rules,
    length_bounded_rules,
    raw_minus_rules,
)

_MAX_UNIQUE = 8  # uniqueItems: values of a finite item domain (2**n sets of written values)


class TypeEmitter(ObjectEmitter, NumberEmitter):
    """Writes the Lark expression for each type a node admits; `c` is the owning compiler."""

    def __init__(self, compiler):
        self.c = compiler

    @property
    def comma(self) -> str:
        return f'{self.c.ws} ","{self.c.ws}'

    def typed(self, node: dict, path: str) -> str:
        node, excluded = leaf_not(node, path)  # not {type} / not {enum}: fewer types, or values to leave out
        types = logic.type_set(node, path)
        if "enum" in node or "const" in node:
            return self.values(node, path)
        alts = []
        if "null" in types and "null" not in excluded:
            alts.append('"null"')
        if "boolean" in types:
            alts += [f'"{b}"' for b in ("true", "false") if b not in excluded]
        for kind, emit in (("object", self.object), ("array", self.array), ("string", self.string)):
            if kind in types:
                if any(t[0] == {"object": "{", "array": "[", "string": '"'}[kind] for t in excluded):
                    if kind != "string":
                        raise SchemaError("not", path, f"excluding {kind} values is not compiled (only null, booleans "
                                                       "and strings)")
                    alts.append(self.string_except(node, path, [json.loads(t) for t in excluded if t[0] == '"']))
                else:
                    alts.append(emit(node, path))
        if "integer" in types:
            numbers = [t for t in excluded if t[0] in "-0123456789"]
            if numbers and "number" in types:  # 1.0, 1e0, ... all equal 1: only integers have one spelling
                raise SchemaError("not", path, "excluding numbers is not compiled (only integers, null, booleans and "
                                               "strings)")
            text = self.number(node, path, integer="number" not in types)
            if numbers and text is not None and not text.startswith("/"):
                raise SchemaError("not", path, "excluding integers next to multipleOf is not compiled")
            if numbers and text is not None:  # an integer range: its regex minus the listed texts
                text = self._add_rules(f"{path}/integer", lambda n: raw_minus_rules(text[1:-1], numbers, n))[0]
            alts.append(text)
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

    # ----------------------------------------------------------------------------------- arrays
    def array(self, node: dict, path: str) -> str | None:
        prefix, rest, rest_path, prefix_kw = self._item_schemas(node, path)
        lo, hi = node.get("minItems", 0), node.get("maxItems")
        for kw, v in (("minItems", lo), ("maxItems", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(kw, path, f"must be a non-negative integer, got {v!r}")
        _check_count("minItems", path, lo, "items")
        if node.get("uniqueItems") is True and (hi is None or hi > 1) and not (rest is False and not prefix):
            try:
                return self._unique_array(prefix, rest, rest_path, lo, hi, path)
            except SchemaError as e:
                if e.keyword != "uniqueItems" or not self.c.leave_unenforced(e):
                    raise  # else: the array below, items not necessarily distinct
        for i, p in enumerate(prefix):
            if p is False:
                hi, prefix = (i if hi is None else min(hi, i)), prefix[:i]
                break
        if rest is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
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
        counted = hi is None and self.c.options.max_repeat is not None and not self.c.has_refs and \
            not any(self.c.reaches(r, self.c.count_blockers) for r in [*elems, more])
        if counted:
            # Free repetition bounded by option. The counter copies the item's automaton once per position, so it
            # is not applied where $ref may recurse (a 3-level tree: 61 states unbounded, 5,444 with 16 items),
            # over items that may hold generic JSON (`{"type": "array"}`: 1,463 states unbounded, 46,227 with 16
            # items) or around an array it already counts: counters never nest (16 × 16 copies of an object).
            hi = max(lo, len(prefix) + self.c.options.max_repeat)
        w = self.c.ws
        body = self._items(elems, more, lo, hi, 0, path)
        if counted and body:
            body = self.c.rule_text(f"{path}/bounded", body)
            self.c.count_blockers.add(body)
        return f'"["{w} {body}{w} "]"' if body else f'"["{w} "]"'

    def _unique_array(self, prefix: list, rest, rest_path: str, lo: int, hi: int | None, path: str) -> str | None:
        """uniqueItems over a finite item domain: one rule per set of values written so far (the set is the
        state), each continuing with a value not in it; refused beyond _MAX_UNIQUE values."""
        domain = None if prefix else self._finite_values(rest, rest_path)
        if domain is None:
            raise SchemaError("uniqueItems", path, "distinct items are compiled only for a finite item domain (enum, "
                                                   "const, boolean, null; no prefixItems) or with maxItems <= 1")
        if len(domain) > _MAX_UNIQUE:
            raise SchemaError("uniqueItems", path, f"distinct items over {len(domain)} values: the set of values "
                                                   f"written is automaton state, compiled up to {_MAX_UNIQUE} values")
        hi = len(domain) if hi is None else min(hi, len(domain))
        memo: dict[frozenset, str | None] = {}

        def after(used: frozenset) -> str | None:  # the rest of the array once `used` is written
            if used not in memo:
                alts = [f"{self.comma} {lark_literal(v)} {after(used | {v}) or ''}".strip()
                        for v in domain if v not in used and len(used) < hi and after(used | {v}) is not None]
                end = len(used) >= lo
                body = " | ".join(f"({a})" for a in alts)
                memo[used] = None if not alts and not end else "" if not alts else \
                    self.c.rule_text(f"{path}/unique", f"({body})?" if end else body)
            return memo[used]

        firsts = [f"{lark_literal(v)} {after(frozenset([v])) or ''}".strip() for v in domain
                  if hi >= 1 and after(frozenset([v])) is not None]
        w = self.c.ws
        alts = [f'"["{w} ({" | ".join(firsts)}){w} "]"'] if firsts else []
        alts += [f'"["{w} "]"'] if lo == 0 else []
        return " | ".join(alts) or None

    def _finite_values(self, items, items_path: str) -> list[str] | None:
        """Canonical texts of every value the item schema admits, when that set is finite and known."""
        if not isinstance(items, dict):
            return None
        node, _ = self.c.flatten(items, items_path)
        keys = {k for k in node if k not in logic.ANNOTATIONS}
        if "enum" in keys or "const" in keys:
            if keys - {"enum", "const", "type"}:
                return None
            values = node["enum"] if "enum" in node else [node["const"]]
            values = [v for v in values if logic.value_ok(v, node, items_path)]
            if "enum" in node and "const" in node:
                values = [v for v in values if logic.canonical(v) == logic.canonical(node["const"])]
            # one text per JSON value: validators compare objects regardless of key order, and 1 equals 1.0
            unique = {json.dumps(logic._norm(v), sort_keys=True): logic.canonical(logic._norm(v)) for v in values}
            return list(dict.fromkeys(unique.values()))
        if keys == {"type"} and logic.type_set(node, items_path) <= {"boolean", "null"}:
            types = logic.type_set(node, items_path)
            return [t for t in ("true", "false", "null") if ("null" if t == "null" else "boolean") in types]
        return None

    def _item_schemas(self, node: dict, path: str):
        if self.c.draft >= 2020:
            # additionalItems is no 2020-12 keyword (validators ignore it); an array-form items, which would give it
            # meaning in older drafts, is refused just below: ignoring it is exact
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
        try:
            return self._string(node, path)
        except SchemaError as e:  # a pattern or maxLength left unenforced: the same string without it
            if e.keyword not in ("pattern", "maxLength") or e.keyword not in node or not self.c.leave_unenforced(e):
                raise
            return self.string({k: v for k, v in node.items() if k != e.keyword}, path)

    def _string(self, node: dict, path: str) -> str:
        lo, hi = node.get("minLength", 0), node.get("maxLength")
        for kw, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(kw, path, f"must be a non-negative integer, got {v!r}")
        if hi is not None and lo > hi:
            return None
        _check_count("minLength", path, lo, "characters")
        if "pattern" in node and self._format(node, path) is not None:
            return self._pattern_and_format(node, path, lo, hi)
        body, width = self._string_body(node, path)
        if body is None or not (lo <= width[0] and (hi is None or (width[1] is not None and width[1] <= hi))):
            _check_count("maxLength", path, hi or 0, "characters", at_least=False)
        if body is None:
            return json_string_terminal(_sized(_repeat(cs.json_class_text(cs.ANY), lo, hi), path, hi))
        if lo <= width[0] and (hi is None or (width[1] is not None and width[1] <= hi)):
            return json_string_terminal(body)  # the length bounds hold for every string of the pattern/format
        simple = rx.class_repeat(node["pattern"]) if "pattern" in node else None
        if simple is None:
            return self._length_automaton(node, path, lo, hi, width)
        chars, a, b = simple
        a, b = max(a, lo), (hi if b is None else b if hi is None else min(b, hi))
        if b is not None and a > b:
            return None
        return json_string_terminal(_sized(_repeat(cs.json_class_text(chars), a, b), path, b))

    def string_except(self, node: dict, path: str, values: list[str]) -> str | None:
        """Strings of the node other than ``values`` (``not {enum}``): the pattern's DFA minus the values."""
        if any(k in node for k in ("minLength", "maxLength", "format")):
            raise SchemaError("not", path, "excluding strings next to minLength/maxLength/format is not compiled")
        try:
            inside = [rx.translate(node["pattern"], cs.class_text, search=True)] if "pattern" in node else []
        except rx.RegexError as e:
            raise SchemaError("pattern", path, str(e)) from None
        return self._add_rules(f"{path}/string", lambda n: key_region_rules(inside, values, n, cs.ANY))[0]

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

    def _format(self, node: dict, path: str) -> str | None:
        """The node's format when it is enforced (None: absent, or one no validator checks / ignored by option)."""
        fmt = node.get("format")
        if fmt is not None and fmt not in FORMATS:
            if self.c.options.unknown_formats == "ignore" or fmt not in SPEC_FORMATS:  # no validator checks it
                return None
            raise SchemaError("format", path, f"format {fmt!r} has no exact grammar (supported: "
                                              f"{', '.join(FORMATS)}); pass unknown_formats='ignore' to leave it "
                                              "unenforced (json_unknown_formats=ignore on the command line)")
        return fmt

    def _pattern_and_format(self, node: dict, path: str, lo: int, hi: int | None) -> str | None:
        """A string that matches both its pattern and its format (and the length bounds): DFA intersection."""
        try:
            pattern = rx.translate(node["pattern"], cs.class_text, search=True)
        except rx.RegexError as e:
            raise SchemaError("pattern", path, str(e)) from None
        try:
            return self._add_rules(f"{path}/string",
                                   lambda n: intersection_rules([FORMATS[node["format"]], pattern], lo, hi, n))[0]
        except TooLarge as e:
            raise SchemaError("pattern", path, f"the intersection with format {node['format']!r} has {e}; not "
                                               "compiled") from None

    def _string_body(self, node: dict, path: str):
        fmt, pattern = self._format(node, path), node.get("pattern")
        if fmt is not None:
            return FORMATS[fmt], rx.width(FORMATS[fmt])
        if pattern is None:
            return None, (0, None)
        try:
            return rx.translate(pattern, cs.json_class_text, search=True), rx.width(pattern, search=True)
        except rx.RegexError as e:
            raise SchemaError("pattern", path, str(e)) from None


def _sized(regex: str, path: str, hi: int | None) -> str:
    """The regex of a length-bounded string, refused here (naming the keyword) when the compiler would refuse
    its terminal: each character may be an escape sequence (up to 11 automaton positions for any character)."""
    if (size := positions(sre_parse.parse(regex))) > MAX_POSITIONS:
        kw = "maxLength" if hi is not None else "minLength"
        raise SchemaError(kw, path, f"strings of up to {hi if hi is not None else 'at least'} characters need "
                                    f"{size:,} automaton positions (each character may be an escape sequence; limit "
                                    f"{MAX_POSITIONS:,}); lower {kw} in the schema (about 900 characters fit)")
    return regex
