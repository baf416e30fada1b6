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


def negate(cond, path: str, flatten=None, depth: int = 0) -> list:
    """Schemas whose union is the complement of ``cond`` (empty list: nothing; raises SchemaError);
    ``flatten(node, path)`` (the compiler's) resolves ``$ref`` and ``allOf`` first."""
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
    if other := keys - {"type", "enum", "const", "properties", "required"}:
        raise SchemaError("not", path, f"the complement of {sorted(other)[0]!r} is not compiled (only of type, "
                                       "enum, const, properties and required)")
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
                for n in negate(sub, path, flatten, depth + 1)]
    out += [{"type": "object", "properties": {name: False}} for name in cond.get("required", [])]
    return out


def conditional(node: dict, path: str, flatten=None) -> dict:
    """``if``/``then``/``else`` as an allOf of the other keywords and an anyOf of the cases."""
    rest = {k: v for k, v in node.items() if k not in ("if", "then", "else")}
    if "if" not in node:
        return rest  # then/else without if: no effect (as the spec and validators say)
    then, other = node.get("then", True), node.get("else", True)
    if then is True and other is True:
        return rest
    try:
        negs = negate(node["if"], f"{path}/if", flatten)
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


def split_not(node: dict, path: str, flatten=None) -> dict | None:
    """A node whose ``not`` is no leaf, rewritten as an anyOf over the complement (None: leaf or no ``not``)."""
    sub = node.get("not")
    if "not" not in node or sub is False or isinstance(sub, dict) and "$ref" not in sub and _is_leaf(sub):
        return None
    if sub is True or sub == {}:
        raise EmptySchemaError("not", path, "not {} matches nothing (empty language)")
    branches = negate(sub, f"{path}/not", flatten)
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
