"""Schema algebra for the JSON Schema front-end: keyword tables, allOf merging, disjointness, enum filtering.

Everything here either computes an exact result or raises `SchemaError`; nothing is approximated.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction

from specjax.grammar._json_formats import FORMATS, SPEC_FORMATS

TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")

# Keywords with no effect on validation: ignored on purpose.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "example", "$comment", "readOnly", "writeOnly",
    "deprecated", "$schema", "$id", "id", "$anchor", "contentMediaType", "contentEncoding", "contentSchema",
    "$vocabulary", "definitions", "$defs",
})
# Keywords this front-end compiles (each handled in json_schema.py).
SUPPORTED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf", "allOf", "$ref",
    "uniqueItems", "minProperties", "maxProperties", "dependencies", "dependentRequired", "dependentSchemas",
    "propertyNames",
    "patternProperties", "not", "if", "then", "else",
})
# Validation keywords of drafts 4 to 2020-12 that are refused (the grammar could not enforce them exactly).
REFUSED = frozenset({
    "contains", "minContains", "maxContains",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", "extends", "disallow",
    "divisibleBy",
})
OBJECT_KEYS = frozenset({"properties", "required", "additionalProperties", "minProperties", "maxProperties",
                         "dependencies", "dependentRequired", "dependentSchemas", "propertyNames",
                         "patternProperties"})
ARRAY_KEYS = frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"})
STRING_KEYS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})


class SchemaError(ValueError):
    """A schema (or part of one) that cannot be compiled exactly.

    Attributes:
      keyword: the JSON Schema keyword refused.
      path: JSON pointer of the schema location ("#/properties/a").
    """

    def __init__(self, keyword: str, path: str, why: str):
        super().__init__(f"JSON Schema keyword '{keyword}' at {path}: {why}")
        self.keyword, self.path, self.why = keyword, path, why


class EmptySchemaError(SchemaError):
    """A schema no value satisfies. Where a value is optional (an optional property, an array tail,
    a union branch) the compiler drops that part instead, which is exact."""


def canonical(value) -> str:
    """Compact JSON text of a value (the form in which enum/const values are generated)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):  # 1.0 is an integer from draft 6 on but not in draft 4: say number (sound)
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def type_set(node: dict, path: str) -> set[str]:
    """Types the node admits by its `type` keyword (all when absent); integer ⊂ number is kept explicit."""
    t = node.get("type", list(TYPES))
    names = [t] if isinstance(t, str) else t
    if not isinstance(names, list) or any(n not in TYPES for n in names):
        raise SchemaError("type", path, f"unknown type {t!r} (one of {', '.join(TYPES)})")
    out = set(names)
    if "number" in out:
        out.add("integer")
    return out


def value_types(node: dict, path: str) -> set[str]:
    """Types an instance of the node may have (from type, enum and const)."""
    types = type_set(node, path)
    values = node["enum"] if "enum" in node else [node["const"]] if "const" in node else None
    if values is not None:
        vt = {json_type(v) for v in values}
        if "integer" in vt:
            vt.add("number")
        types &= vt
    return types


def value_ok(value, node: dict, path: str) -> bool:
    """Whether an enum/const value satisfies the node's other keywords (refuses what it cannot check)."""
    vt = json_type(value)
    allowed = type_set(node, path)
    if vt not in allowed and not (vt == "integer" and "number" in allowed):
        return False
    for kw in node:
        if kw in ANNOTATIONS or kw in ("type", "enum", "const") or kw not in SUPPORTED:
            continue  # unknown keywords do not take part in validation
        if kw in STRING_KEYS | NUMBER_KEYS | OBJECT_KEYS | ARRAY_KEYS and not _applies(kw, vt):
            continue
        if kw == "minLength" and len(value) < node[kw] or kw == "maxLength" and len(value) > node[kw]:
            return False
        if kw == "pattern":
            if re.search(node[kw], value) is None:
                return False
        elif kw == "format" and node[kw] in FORMATS:
            if re.fullmatch(FORMATS[node[kw]], value) is None:
                return False
        elif kw == "format" and node[kw] not in SPEC_FORMATS:
            continue  # no validator checks it
        elif kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") and isinstance(node[kw], int | float):
            if not _bound_ok(kw, value, node):
                return False
        elif kw == "multipleOf" and isinstance(node[kw], int | float) and not isinstance(node[kw], bool) \
                and node[kw] > 0:
            if not _multiple_ok(value, node[kw]):
                return False
        elif kw not in ("minLength", "maxLength"):
            raise SchemaError(kw, path, "cannot be combined with enum/const (values are not checked against it)")
    return True


def _applies(kw: str, vt: str) -> bool:
    if kw in STRING_KEYS:
        return vt == "string"
    if kw in NUMBER_KEYS:
        return vt in ("integer", "number")
    return vt == ("object" if kw in OBJECT_KEYS else "array")


def _multiple_ok(value, step) -> bool:
    """multipleOf as the jsonschema package tests it (floating-point division for a float step)."""
    if isinstance(step, float):
        quotient = value / step
        try:
            return int(quotient) == quotient
        except OverflowError:
            return (Fraction(value) / Fraction(step)).denominator == 1
    return value % step == 0


def _bound_ok(kw: str, value, node: dict) -> bool:
    b = node[kw]
    if kw == "minimum":
        return value > b if node.get("exclusiveMinimum") is True else value >= b
    if kw == "maximum":
        return value < b if node.get("exclusiveMaximum") is True else value <= b
    return value > b if kw == "exclusiveMinimum" else value < b


# ------------------------------------------------------------------------------------------------ oneOf
def disjoint(a: dict, b: dict, path: str) -> bool:
    """A sufficient test that no instance matches both schemas: distinct types, values or discriminators."""
    ta, tb = value_types(a, path), value_types(b, path)
    if not ta & tb:
        return True
    if _value_set(a) is not None and _value_set(b) is not None and not _value_set(a) & _value_set(b):
        return True
    if ta <= {"object"} and tb <= {"object"} and (_excludes(a, b) or _excludes(b, a)):
        return True
    if ta <= {"object"} or tb <= {"object"}:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        for name in set(a.get("required", [])) & set(b.get("required", [])) & set(pa) & set(pb):
            va, vb = _value_set(pa[name]), _value_set(pb[name])
            if isinstance(pa[name], dict) and isinstance(pb[name], dict) and va is not None and vb is not None \
                    and not va & vb:
                return True
    return False


def _excludes(a: dict, b: dict) -> bool:
    """`a` requires a property that `b` forbids (not in b's properties under additionalProperties false,
    or b's schema for it is false)."""
    props_b = b.get("properties", {}) if isinstance(b.get("properties"), dict) else {}
    for name in a.get("required", []) if isinstance(a.get("required"), list) else []:
        if props_b.get(name) is False or (name not in props_b and b.get("additionalProperties") is False
                                          and not any(_search(p, name) for p in b.get("patternProperties", {}))):
            return True
    return False


def _value_set(node) -> set[str] | None:
    """Canonical texts of the only values the node admits (None: not a finite set we can see)."""
    if not isinstance(node, dict):
        return None
    if isinstance(node.get("allOf"), list):  # an instance matches every part: any finite part bounds it
        sets = [v for v in map(_value_set, node["allOf"]) if v is not None]
        if sets:
            return set.intersection(*sets)
    if "const" in node:
        return {canonical(_norm(node["const"]))}
    if "enum" in node and isinstance(node["enum"], list):
        return {canonical(_norm(v)) for v in node["enum"]}
    return None


def _norm(value):
    """Equal JSON values get equal canonical text (validators compare 1 and 1.0 as equal)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in sorted(value.items())}
    return value


def _search(pattern: str, name: str) -> bool:
    """Whether a patternProperties pattern matches a key as validators decide (Python's re.search); a pattern
    Python cannot compile counts as matching (the caller then assumes the least)."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True
