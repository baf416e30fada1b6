"""`not` and `if`/`then`/`else` of the JSON Schema compiler, by case analysis into keywords it compiles.

A condition C is a conjunction of simple constraints (type, enum/const, per-property conditions, required); its
complement is the union of their complements, each again a schema (`negate`). So

* ``if C then T else E`` becomes ``anyOf [allOf [C, T], allOf [not-C₁, E], …]`` (exact: the cases cover every
  value, and a value in several branches is valid in each);
* ``not C`` becomes an ``anyOf`` of the complements, down to the leaves ``not {type}`` and ``not {enum}``,
  which the type emitter compiles by removing types and values (`leaf_not`).

What does not split this way (``not {pattern}``, ``not {anyOf}``, ``if {minimum}``, …) is refused naming the
keyword and path.
"""

from __future__ import annotations

from specjax.grammar import _json_schema_logic as logic
from specjax.grammar._json_schema_logic import EmptySchemaError, SchemaError

__all__ = ["conditional", "leaf_not", "negate", "split_dependencies", "split_not"]

_LEAF = ({"type"}, {"enum"}, {"const"})


_COUNTS = {"minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
           "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
           "minProperties": ("object", "maxProperties", -1), "maxProperties": ("object", "minProperties", 1)}
_NEGATED = {"type", "enum", "const", "properties", "required", "anyOf", "minimum", "maximum", "exclusiveMinimum",
            "exclusiveMaximum", *_COUNTS}
_MAX_CASES = 64


def negate(cond, path: str, flatten=None, depth: int = 0, draft: int = 2020) -> list:
    """Schemas whose union is the complement of ``cond`` (empty list: nothing; raises SchemaError);
    ``flatten(node, path)`` (the compiler's) resolves ``$ref`` and ``allOf`` first; ``draft`` decides how
    exclusive bounds are written."""
    if depth > 16:
        raise SchemaError("not", path, "the complement is nested deeper than 16 levels (a recursive schema?)")
    if flatten is not None and isinstance(cond, dict) and ("$ref" in cond or "allOf" in cond):
        cond, path = flatten(cond, path)
    if cond is True or cond == {}:
        return []
    if cond is False:
        return [True]
    if not isinstance(cond, dict):
        raise SchemaError("not", path, "a schema must be an object or boolean")
    keys = {k for k in cond if k not in logic.ANNOTATIONS and (k in logic.SUPPORTED or k in logic.REFUSED)}
    if other := keys - _NEGATED:
        raise SchemaError("not", path, f"the complement of {sorted(other)[0]!r} is not compiled (only of type, "
                                       "enum, const, properties, required, anyOf, bounds and counts)")
    out: list = []
    if "type" in cond and ("enum" in cond or "const" in cond):  # the values decide: keep those of the types
        types = logic.type_set(cond, path)
        values = [v for v in (cond["enum"] if "enum" in cond else [cond["const"]])
                  if logic.json_type(v) in types or logic.json_type(v) == "number" and float(v).is_integer()
                  and "integer" in types]
        cond = {k: v for k, v in cond.items() if k not in ("type", "enum", "const")} | {"enum": values}
    if "type" in cond:
        types = logic.type_set(cond, path)
        if "integer" in types and "number" not in types:
            raise SchemaError("not", path, "the complement of type integer (non-integer numbers) is not compiled")
        rest = sorted(set(logic.TYPES) - types)
        out += [{"type": rest}] if rest else []
    if "enum" in cond or "const" in cond:
        out.append({"not": {k: cond[k] for k in ("enum", "const") if k in cond}})
    for name, sub in (cond.get("properties") or {}).items():
        out += [{"type": "object", "required": [name], "properties": {name: n}}
                for n in negate(sub, path, flatten, depth + 1, draft)]
    out += [{"type": "object", "properties": {name: False}} for name in cond.get("required", [])]
    out += _negate_bounds(cond, path, draft) + _negate_counts(cond, path)
    if "anyOf" in cond:  # not (A or B) = not A and not B: one case per combination of their complements
        cases = [[]]
        for i, branch in enumerate(cond["anyOf"] if isinstance(cond["anyOf"], list) else []):
            options = negate(branch, f"{path}/anyOf/{i}", flatten, depth + 1, draft)
            cases = [c + [n] for c in cases for n in options]
            if len(cases) > _MAX_CASES:
                raise SchemaError("not", path, f"the complement of anyOf has more than {_MAX_CASES} cases")
        out += [{"allOf": c} if c else True for c in cases]
    return out


def _negate_bounds(cond: dict, path: str, draft: int) -> list:
    """Numbers outside each bound (other types satisfy a bound: they are not in its complement)."""
    out = []
    for inc, exc, flip_inc, flip_exc in (("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"),
                                         ("maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum")):
        m, e = cond.get(inc), cond.get(exc)
        for kw, v in ((inc, m), (exc, e)):
            if v is not None and not isinstance(v, int | float) or isinstance(v, bool) and draft > 4:
                raise SchemaError("not", path, f"the complement of {kw} {v!r} is not compiled")
        if draft <= 4:  # boolean exclusives
            if m is not None:
                out.append({"type": "number", flip_inc: m, flip_exc: not e})
            continue
        if m is not None:
            out.append({"type": "number", flip_exc: m})
        if e is not None:
            out.append({"type": "number", flip_inc: e})
    return out


def _negate_counts(cond: dict, path: str) -> list:
    out = []
    for kw, (kind, flip, shift) in _COUNTS.items():
        if kw in cond:
            n = cond[kw]
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise SchemaError("not", path, f"the complement of {kw} {n!r} is not compiled")
            if n + shift >= 0:
                out.append({"type": kind, flip: n + shift})
    return out


def conditional(node: dict, path: str, flatten=None, draft: int = 2020) -> dict:
    """``if``/``then``/``else`` as an allOf of the other keywords and an anyOf of the cases."""
    rest = {k: v for k, v in node.items() if k not in ("if", "then", "else")}
    if "if" not in node:
        return rest  # then/else without if: no effect (as the spec and validators say)
    then, other = node.get("then", True), node.get("else", True)
    if then is True and other is True:
        return rest
    try:
        negs = negate(node["if"], f"{path}/if", flatten, draft=draft)
        cases = [{"allOf": [node["if"], then]}] + [{"allOf": [n, other]} for n in negs]
    except SchemaError as e:
        raise SchemaError("if", path, f"{e.why}; the condition is split into cases by its complement") from None
    return {"allOf": [rest, {"anyOf": cases}]}


_MAX_DEPENDENT = 6  # schema-valued dependencies of one object: 2**n cases


def split_dependencies(node: dict, path: str, draft: int) -> dict | None:
    """Schema-valued ``dependencies`` (drafts <= 7) / ``dependentSchemas`` (2019-09+) by cases: for each key
    ``a`` with schema ``S``, either ``a`` is absent (``properties: {a: false}``) or present and the object also
    satisfies ``S`` (``allOf [S, required [a]]``); an ``anyOf`` over every combination, each an ``allOf`` with
    the other keywords (exact: a non-object satisfies the "absent" case, as validators skip it). None when the
    node has no schema-valued dependency. The array form stays in ``dependencies`` (the member chain)."""
    kw = "dependencies" if draft <= 7 else "dependentSchemas"
    deps = node.get(kw)
    if not isinstance(deps, dict):
        return None
    schemas = {a: s for a, s in deps.items() if not isinstance(s, list)}
    if not schemas:
        return None
    rest = {k: v for k, v in node.items() if k != kw}
    arrays = {a: s for a, s in deps.items() if isinstance(s, list)}
    if arrays:
        rest[kw] = arrays  # only "dependencies" can hold arrays
    choices = []
    for a, sub in schemas.items():
        if sub is True or sub == {}:
            continue  # no constraint
        absent = {"properties": {a: False}}
        choices.append([absent] if sub is False else [absent, {"allOf": [sub, {"required": [a]}]}])
    if len(choices) > _MAX_DEPENDENT:
        raise SchemaError(kw, path, f"{len(choices)} schema-valued dependencies: each doubles the cases, compiled "
                                    f"up to {_MAX_DEPENDENT}")
    cases = [[]]
    for options in choices:
        cases = [c + [o] for c in cases for o in options]
    if len(cases) == 1:
        return {"allOf": [rest, *cases[0]]}
    return {"anyOf": [{"allOf": [rest, *c]} for c in cases]}


def split_not(node: dict, path: str, flatten=None, draft: int = 2020) -> dict | None:
    """A node whose ``not`` is no leaf, rewritten as an anyOf over the complement (None: leaf or no ``not``)."""
    sub = node.get("not")
    if "not" not in node or sub is False or isinstance(sub, dict) and "$ref" not in sub and _is_leaf(sub):
        return None
    if sub is True or sub == {}:
        raise EmptySchemaError("not", path, "not {} matches nothing (empty language)")
    branches = negate(sub, f"{path}/not", flatten, draft=draft)
    rest = {k: v for k, v in node.items() if k != "not"}
    if not branches:
        raise EmptySchemaError("not", path, "nothing is outside the negated schema (empty language)")
    return {"allOf": [rest, {"anyOf": branches}]}


def _is_leaf(sub: dict) -> bool:
    keys = {k for k in sub if k not in logic.ANNOTATIONS}
    return keys in _LEAF or keys == {"enum", "const"}


def leaf_not(node: dict, path: str) -> tuple[dict, set[str]]:
    """The node without its leaf ``not`` (types removed, or enum values filtered) and the canonical texts of the
    values still to exclude from the other types."""
    if "not" not in node:
        return node, set()
    sub, node = node["not"], {k: v for k, v in node.items() if k != "not"}
    if sub is False:
        return node, set()
    if "type" in sub:
        out = logic.type_set(sub, f"{path}/not")
        types = logic.type_set(node, path) - out
        if "number" in types and "integer" in out:
            raise SchemaError("not", path, "numbers that are not integers are not compiled (not {type: integer})")
        if not types:
            raise EmptySchemaError("not", path, "every type is excluded (empty language)")
        return {**node, "type": sorted(types - {"integer"} if "number" in types else types)}, set()
    excluded = [sub["const"]] if "const" in sub else sub.get("enum", [])
    if "enum" in sub and "const" in sub:
        excluded = [v for v in excluded if logic.canonical(v) == logic.canonical(sub["const"])]
    texts = {logic.canonical(logic._norm(v)) for v in excluded}
    if "enum" in node or "const" in node:
        values = node["enum"] if "enum" in node else [node["const"]]
        if "enum" in node and "const" in node:
            values = [v for v in values if logic.canonical(v) == logic.canonical(node["const"])]
        kept = [v for v in values if logic.canonical(logic._norm(v)) not in texts]
        return {k: v for k, v in node.items() if k not in ("enum", "const")} | {"enum": kept}, set()
    return node, texts
