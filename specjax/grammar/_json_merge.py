"""allOf merging for the JSON Schema compiler: the intersection of two schemas as one schema, where that is exact.

Keywords that constrain the same instance merge by their own rule: ``type`` intersects, ``required`` and
``dependencies`` unite, ``enum`` intersects, bounds take the tighter value, integer ``multipleOf`` the least
common multiple, ``uniqueItems`` true wins; schema-valued keywords that apply to the same part of the instance
(``items``, ``propertyNames``, shared ``properties`` and patterns) become an ``allOf`` of both; two ``not`` become
``not anyOf``; two ``anyOf`` (or two ``oneOf``) become one over the pairs of branches. Objects merge with their
``additionalProperties``: a name listed by one branch only must satisfy the other branch's
``additionalProperties`` (unless one of its patterns matches it). Anything else that differs is refused, naming
the keyword.
"""

from __future__ import annotations

import math

from specjax.grammar._json_schema_logic import (
    ANNOTATIONS,
    REFUSED,
    SUPPORTED,
    EmptySchemaError,
    SchemaError,
    _norm,
    _search,
    canonical,
    type_set,
)

_TAKE_MAX = frozenset({"minimum", "minLength", "minItems", "minProperties"})
_TAKE_MIN = frozenset({"maximum", "maxLength", "maxItems", "maxProperties"})
_OBJECT = ("properties", "patternProperties", "additionalProperties")
_MAX_PAIRS = 64  # anyOf x anyOf branches


def merge(a: dict, b: dict, path: str) -> dict:
    """The intersection of two schemas as one schema, for the keyword combinations where it is exact."""
    out = dict(a)
    for kw, vb in b.items():
        if kw in _OBJECT or kw in _draft4_bounds(a, b):
            continue  # below, together
        # Annotations and keywords no draft defines (vendor "x-..." ones) take no part in validation: a
        # conflict between branches there is no conflict at all.
        if kw not in out or kw in ANNOTATIONS or (kw not in SUPPORTED and kw not in REFUSED):
            out.setdefault(kw, vb)
            continue
        va = out[kw]
        if _same(va, vb):
            continue
        out[kw] = _merge_keyword(kw, va, vb, a, b, path)
    _merge_objects(a, b, out, path)
    for inc in _draft4_bounds(a, b):
        if inc in ("minimum", "maximum"):
            out.update(_tighter(a, b, inc))
    return out


def _draft4_bounds(a: dict, b: dict) -> tuple[str, ...]:
    """Draft 4 bounds (a boolean exclusiveMinimum/Maximum beside minimum/maximum): merged as pairs."""
    out = ()
    for inc, exc in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(a.get(exc), bool) or isinstance(b.get(exc), bool):
            out += (inc, exc)
    return out


def _tighter(a: dict, b: dict, inc: str) -> dict:
    """The tighter of two draft 4 bounds as {minimum: m, exclusiveMinimum: bool} (or maximum)."""
    exc = "exclusiveMinimum" if inc == "minimum" else "exclusiveMaximum"
    sign = 1 if inc == "minimum" else -1
    bounds = [(sign * s[inc], bool(s.get(exc)), s[inc]) for s in (a, b) if isinstance(s.get(inc), int | float)]
    if not bounds:
        return {exc: bool(a.get(exc)) or bool(b.get(exc))}  # an exclusive flag without its bound has no effect
    _, excl, value = max(bounds)  # a larger (signed) bound is tighter; at a tie, the exclusive one
    return {inc: value, exc: excl}


def _same(x, y) -> bool:
    return canonical(x) == canonical(y) and type(x) is type(y)


def _trivial(schema) -> bool:
    return schema is True or schema == {}


def both(x, y):
    """A schema for the values of both ``x`` and ``y`` (no wrapper where one is trivial or they are equal)."""
    if _trivial(x) or _same(x, y):
        return y
    if _trivial(y):
        return x
    if x is False or y is False:
        return False
    return {"allOf": [x, y]}


def _merge_keyword(kw: str, va, vb, a: dict, b: dict, path: str):  # noqa: C901 - one rule per keyword
    if kw == "type":
        common = type_set(a, path) & type_set(b, path)
        if not common:
            raise EmptySchemaError("allOf", path, "branches require disjoint types (empty language)")
        return sorted(common - {"integer"} if "number" in common else common)
    if kw == "required":
        return list(dict.fromkeys([*va, *vb]))
    if kw == "allOf":
        return [*va, *vb]
    if kw == "enum":
        keep = {canonical(_norm(v)) for v in vb}
        return [v for v in va if canonical(_norm(v)) in keep]
    if kw == "const":  # _same() already said they differ (1 and 1.0 are one value)
        if canonical(_norm(va)) == canonical(_norm(vb)):
            return va
        raise EmptySchemaError("allOf", path, f"branches require different constants ({canonical(va)[:40]} vs "
                                              f"{canonical(vb)[:40]}): no value satisfies both (empty language)")
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (va, vb))
    if numeric and kw in _TAKE_MAX | {"exclusiveMinimum"}:
        return max(va, vb)
    if numeric and kw in _TAKE_MIN | {"exclusiveMaximum"}:
        return min(va, vb)
    if kw == "multipleOf" and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (va, vb)):
        return math.lcm(va, vb)
    if kw == "uniqueItems" and isinstance(va, bool) and isinstance(vb, bool):
        return va or vb
    if kw in ("items", "propertyNames", "additionalItems") and _is_schema(va) and _is_schema(vb) and \
            (kw != "additionalItems" or _same(a.get("items"), b.get("items"))):
        return both(va, vb)
    if kw == "not":
        return _merge_not(va, vb)
    if kw in ("anyOf", "oneOf") and isinstance(va, list) and isinstance(vb, list):
        if len(va) * len(vb) > _MAX_PAIRS:
            raise SchemaError("allOf", path, f"branches give '{kw}' {len(va)} and {len(vb)} alternatives; their "
                                             f"pairs are compiled up to {_MAX_PAIRS}")
        return [both(x, y) for x in va for y in vb]  # exactly one pair holds iff exactly one of each (oneOf)
    if kw in ("dependencies", "dependentRequired", "dependentSchemas") and isinstance(va, dict) and \
            isinstance(vb, dict):
        return _merge_dependencies(va, vb)
    raise SchemaError("allOf", path, f"branches give '{kw}' different values ({canonical(va)[:40]} vs "
                                     f"{canonical(vb)[:40]}); that combination is not merged")


def _is_schema(value) -> bool:
    return isinstance(value, dict | bool)


def _as_enum(sub):
    """A ``not`` leaf of const (or enum and const) as an enum, so that two value leaves merge into one."""
    if isinstance(sub, dict) and "const" in sub and set(sub) <= {"enum", "const"}:
        values = sub["enum"] if "enum" in sub and isinstance(sub["enum"], list) else [sub["const"]]
        return {"enum": [v for v in values if canonical(_norm(v)) == canonical(_norm(sub["const"]))]}
    return sub


def _merge_not(va, vb):
    """not A and not B = not (A or B); two value leaves (enum/const) or two type lists stay one leaf (an anyOf of
    two value leaves would be split into cases that merge back into it: a cycle)."""
    va, vb = _as_enum(va), _as_enum(vb)
    if isinstance(va, dict) and isinstance(vb, dict):
        for kw in ("enum", "type"):
            if set(va) == {kw} == set(vb) and isinstance(va[kw], list | str) and isinstance(vb[kw], list | str):
                listed = lambda v: v if isinstance(v, list) else [v]  # noqa: E731
                return {kw: [*listed(va[kw]), *listed(vb[kw])]}
    return {"anyOf": [va, vb]}


def _merge_dependencies(va: dict, vb: dict) -> dict:
    out = dict(va)
    for key, dep in vb.items():
        if key not in out:
            out[key] = dep
        elif isinstance(out[key], list) and isinstance(dep, list):
            out[key] = list(dict.fromkeys([*out[key], *dep]))
        else:
            schema = lambda d: {"required": d} if isinstance(d, list) else d  # noqa: E731
            out[key] = both(schema(out[key]), schema(dep))
    return out


def _merge_objects(a: dict, b: dict, out: dict, path: str) -> None:
    """properties, patternProperties and additionalProperties of both branches, merged into ``out``."""
    if not any(k in b for k in _OBJECT):
        return
    if not any(k in a for k in _OBJECT):
        out.update({k: b[k] for k in _OBJECT if k in b})
        return
    pa, pb = a.get("properties", {}), b.get("properties", {})
    qa, qb = a.get("patternProperties", {}), b.get("patternProperties", {})
    xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    if not all(isinstance(v, dict) for v in (pa, pb, qa, qb)):
        raise SchemaError("allOf", path, "properties and patternProperties must be objects")
    for extra, own, other in ((xa, qa, qb), (xb, qb, qa)):
        if not _trivial(extra) and set(other) - set(own):  # a key only the other's patterns match
            raise SchemaError("allOf", path, f"one branch sets additionalProperties and another adds patterns "
                                             f"{sorted(set(other) - set(own))[:2]}; that intersection is not merged")

    def judged(name, props, patterns, extra):  # the schema a branch gives a listed name (besides its patterns)
        if name in props:
            return props[name]
        return True if any(_search(p, name) for p in patterns) else extra

    props = {name: both(judged(name, pa, qa, xa), judged(name, pb, qb, xb)) for name in dict.fromkeys([*pa, *pb])}
    patterns = dict(qa)
    for p, sb in qb.items():
        patterns[p] = both(patterns[p], sb) if p in patterns else sb
    for kw, value in (("properties", props), ("patternProperties", patterns), ("additionalProperties", both(xa, xb))):
        out.pop(kw, None)
        if value or kw == "additionalProperties" and not _trivial(value):
            out[kw] = value
