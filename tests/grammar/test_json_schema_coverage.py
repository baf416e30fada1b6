"""JSON Schema keywords added for JSONSchemaBench coverage (issue 16, third pass): pattern next to format,
schema-valued dependencies / dependentSchemas. For each: samples of the grammar validate with `jsonschema`, and
hand-picked instances (canonical key order) parse exactly when `jsonschema` accepts them."""

from __future__ import annotations

import itertools
import json

import pytest
from test_json_schema import _dump, _parser, _parses, _validator, check_samples

from specjax.grammar.json_schema import SchemaError, json_schema_to_lark

D7 = "http://json-schema.org/draft-07/schema#"


def check_exact(schema, docs) -> None:
    """Each document (a JSON value, dumped canonically) parses exactly when jsonschema accepts it."""
    parser, check = _parser(json_schema_to_lark(schema)), _validator(schema)
    for doc in docs:
        text = doc if isinstance(doc, str) else _dump(doc)
        assert _parses(parser, text) == check.is_valid(json.loads(text)), (schema, text)


# ------------------------------------------------------------------------------------------ pattern + format
PATTERN_FORMAT = {
    "date_digits": {"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
    "datetime_utc": {"type": "string", "format": "date-time", "pattern": "Z$", "maxLength": 20},
    "email_prefix": {"type": "string", "format": "email", "pattern": "^a[a-z]*@"},
    "uri_https": {"type": "string", "format": "uri", "pattern": "^https://", "minLength": 10},
    "ipv6": {"type": "string", "format": "ipv6"},
    "uri_reference": {"type": "string", "format": "uri-reference", "maxLength": 12},
}


def test_pattern_with_format_accepts_exactly_both():
    check_exact(PATTERN_FORMAT["date_digits"], ['"2024-02-29"', '"2023-02-29"', '"2024-2-01"', '"20240-01-01"',
                                                '"2024-13-01"', '"x2024-01-01"'])
    check_exact(PATTERN_FORMAT["datetime_utc"], ['"2024-01-01T00:00:00Z"', '"2024-01-01T00:00:00.5Z"',
                                                 '"2024-01-01T00:00:00+01:00"', '"2024-01-01T24:00:00Z"'])
    check_exact(PATTERN_FORMAT["email_prefix"], ['"ab@x.org"', '"a@x"', '"b@x.org"', '"aB@x.org"'])
    check_exact(PATTERN_FORMAT["uri_https"], ['"https://a.b/c"', '"https://a"', '"http://a.b/cd"', '"https:/"'])


def test_ipv6_and_uri_reference_formats_are_exact_within_their_documented_forms():
    check_exact(PATTERN_FORMAT["ipv6"], [f'"{a}"' for a in ["::", "::1", "1::", "1:2:3:4:5:6:7::", "fe80::1:2",
                                                           "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", ":::",
                                                           "1:::2", "12345::", "1::2::3", "g::1"]])
    check_exact(PATTERN_FORMAT["uri_reference"], [f'"{u}"' for u in ["a:b", "//h/p", "/abs", "rel/p", "", "#f",
                                                                     "?q", "a b", ":x", "%zz", "a/%41",
                                                                     "x:y:z"]])
    # documented narrowings (docs/grammar-json-schema.md, formats): IP-literal hosts, embedded IPv4 in IPv6
    assert not _parses(_parser(json_schema_to_lark(PATTERN_FORMAT["uri_reference"])), '"//[::1]"')


def test_pattern_with_format_that_never_meet_is_empty_and_format_ignored_keeps_pattern():
    from specjax.grammar.json_schema import EmptySchemaError

    with pytest.raises(EmptySchemaError):
        json_schema_to_lark({"type": "string", "format": "uuid", "pattern": "^[g-z]+$"})
    # a format no draft defines is an annotation: only the pattern counts
    check_exact({"type": "string", "format": "color", "pattern": "^#[0-9a-f]{3}$"}, ['"#abc"', '"#abcd"', '"red"'])


# ------------------------------------------------------------------------------------- schema dependencies
DEPENDENCIES = {
    "draft7_mixed": {"$schema": D7, "type": "object", "additionalProperties": False,
                     "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "t": {"type": "string"}},
                     "dependencies": {"a": {"properties": {"t": {"enum": ["x"]}}, "required": ["t"]}, "b": ["a"]}},
    "2020_two": {"type": "object", "properties": {"a": {"type": "integer"}, "c": {"type": "boolean"},
                                                  "d": {"type": "null"}},
                 "dependentSchemas": {"a": {"required": ["c"]}, "d": {"properties": {"a": {"maximum": 2}}}},
                 "additionalProperties": False},
    "false_and_nullable": {"type": ["object", "null"], "properties": {"a": {"type": "integer"}, "z": {}},
                           "dependentSchemas": {"z": False, "a": True}, "additionalProperties": False},
    "extra_keys": {"$schema": D7, "type": "object", "properties": {"k": {"type": "integer"}},
                   "dependencies": {"k": {"properties": {"k": {"minimum": 0}}}}},
}
_VALUES = {"a": [1, 5, "s"], "b": ["s"], "t": ["x", "y"], "c": [True], "d": [None], "z": [1], "k": [-1, 3]}



@pytest.mark.parametrize("name", sorted(DEPENDENCIES))
def test_schema_dependencies_accept_exactly_the_valid_objects(name):
    schema = DEPENDENCIES[name]
    keys = list(schema["properties"])
    docs = ["null", "1", '{"q":1}']
    for n in range(len(keys) + 1):
        for subset in itertools.combinations(keys, n):  # schema order is the canonical order
            for values in itertools.product(*(_VALUES[k] for k in subset)):
                docs.append(dict(zip(subset, values, strict=True)))
    check_exact(schema, docs)


def test_dependency_keyword_counts_only_in_its_draft():
    # dependentSchemas is no draft-7 keyword and dependencies none of 2020-12: validators ignore them
    check_exact({"$schema": D7, "type": "object", "properties": {"a": {}}, "dependentSchemas": {"a": False}},
                [{"a": 1}])
    check_exact({"type": "object", "properties": {"a": {}}, "dependencies": {"a": False}}, [{"a": 1}])


def test_too_many_schema_dependencies_are_refused():
    deps = {f"p{i}": {"required": ["q"]} for i in range(7)}
    with pytest.raises(SchemaError, match="7 schema-valued dependencies") as info:
        json_schema_to_lark({"type": "object", "dependentSchemas": deps})
    assert info.value.keyword == "dependentSchemas" and info.value.path == "#"


# ------------------------------------------------------------------------------ number bounds and multipleOf
NUMBERS = {
    "half_open": {"type": "number", "minimum": 0.5},
    "exclusive_fractions": {"type": "number", "exclusiveMinimum": 0.1, "exclusiveMaximum": 1.25},
    "negative_fraction": {"type": "number", "minimum": -2.75, "maximum": -0.01},
    "mixed_integer_exclusive": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
    "draft4_exclusive": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0.3,
                         "exclusiveMinimum": True},
    "integer_fraction_bounds": {"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3.5},
    "multiple_of_7": {"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 100},
    "multiple_of_16_number": {"type": "number", "multipleOf": 16},
    "quarters": {"type": "number", "multipleOf": 0.25, "maximum": 1.5, "exclusiveMinimum": -1},
}
_NUMBER_TEXTS = ["0", "1", "-1", "2", "3", "4", "7", "14", "-28", "-35", "16", "32", "48", "100", "105", "0.5", "0.49",
                 "0.5000000000000001", "0.1", "0.10000000000000001", "0.10000000000000002", "0.11", "1.25",
                 "1.2499999999999999", "1.2499999999999998", "-2.75", "-2.76", "-2.7", "-0.01", "-0.009", "-0.0100",
                 "0.25", "0.75", "-0.75", "-1", "-1.25", "1.5", "1.75", "0.125", "0.3", "0.30000000000000004",
                 "0.31", "3.5", "3", "0.00000000000001", "0.000000000000001", "0.50", "-0", "1.0", "16.0", "1e1"]


# The documented narrowing next to an exclusive integer bound (docs/grammar-json-schema.md, numbers): the first
# non-zero fraction digit comes within 15 - digits(bound) places, so a float rounding onto the bound is never made.
_NARROWED = {("mixed_integer_exclusive", "0.000000000000001")}



@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_number_bounds_and_steps_accept_exactly_the_valid_canonical_texts(name):
    """Canonical texts (the shortest round-trip decimal, no exponent, no -0, integers without a fraction) parse
    exactly when valid; other spellings are never accepted when invalid (soundness)."""
    schema = NUMBERS[name]
    parser, check = _parser(json_schema_to_lark(schema)), _validator(schema)
    for text in _NUMBER_TEXTS:
        value = json.loads(text)
        canonical = text == _dump(value) and text != "-0" and not (isinstance(value, float) and value.is_integer())
        if (name, text) in _NARROWED:
            assert check.is_valid(value) and not _parses(parser, text), (name, text)
        elif canonical:
            assert _parses(parser, text) == check.is_valid(value), (name, text)
        elif _parses(parser, text):
            assert check.is_valid(value), (name, text)


def test_float_steps_and_huge_bounds_are_refused_with_the_reason():
    with pytest.raises(SchemaError, match="validators divide in floating point") as info:
        json_schema_to_lark({"type": "object", "properties": {"p": {"type": "number", "multipleOf": 0.01}}})
    assert info.value.keyword == "multipleOf" and info.value.path == "#/properties/p"
    with pytest.raises(SchemaError, match="beyond 2\\*\\*53"):
        json_schema_to_lark({"type": "number", "maximum": 1e300, "minimum": 0.5})
    check_exact({"enum": [0.07, 0.05, 3], "multipleOf": 0.01}, ["0.07", "0.05", "3"])  # enum values: as validators


# ----------------------------------------------------------------------------- allOf merging and complements
MERGES = {
    "extra_keys_judge_other_names": {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        {"properties": {"b": {}, "a": {"minimum": 2}}}]},
    "extra_schemas_meet": {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}},
        {"properties": {"b": {"type": "number"}}, "additionalProperties": {"minimum": 0}}]},
    "items_and_unique": {"allOf": [{"type": "array", "items": {"type": "integer"}, "maxItems": 3},
                                   {"items": {"minimum": 1}, "uniqueItems": False, "multipleOf": 2}]},
    "two_anyof": {"allOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]},
                            {"anyOf": [{"minimum": 5}, {"maxLength": 2}]}]},
    "two_oneof": {"allOf": [{"oneOf": [{"type": "string"}, {"maxLength": 2}]},
                            {"oneOf": [{"type": "boolean"}, {"maximum": 4}]}]},
    "anyof_and_oneof": {"anyOf": [{"type": "string"}, {"type": "integer"}],
                        "oneOf": [{"minimum": 5}, {"maxLength": 2}]},
    "two_nots": {"allOf": [{"not": {"enum": [1, 2]}}, {"not": {"enum": [3]}, "type": "integer", "minimum": 0,
                                                        "maximum": 4}]},
    "draft4_bounds": {"$schema": "http://json-schema.org/draft-04/schema#", "allOf": [
        {"type": "integer", "minimum": 2, "exclusiveMinimum": True}, {"minimum": 3, "maximum": 6},
        {"maximum": 6, "exclusiveMaximum": True}]},
    "not_anyof_bounds": {"type": "integer", "not": {"anyOf": [{"minimum": 3, "maximum": 5}, {"const": 9}]}},
    "not_enum_and_const": {"allOf": [{"not": {"enum": [1, 2]}}, {"not": {"const": 3}}], "type": "integer",
                           "minimum": 0, "maximum": 5},
    "not_type_and_enum": {"allOf": [{"not": {"type": "string"}}, {"not": {"enum": [4, None]}}],
                          "type": ["integer", "null", "string", "boolean"]},
    "if_bounds": {"if": {"minimum": 3}, "then": {"type": "integer"}, "else": {"maximum": 1}},
    "oneof_counts": {"type": "array", "items": {"type": "integer"}, "maxItems": 4,
                     "oneOf": [{"maxItems": 2}, {"minItems": 2}]},
    "dependencies_merge": {"$schema": D7, "allOf": [
        {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "dependencies": {"a": ["b"]}},
        {"dependencies": {"a": ["c"], "b": {"required": ["c"]}}}]},
}
_MERGE_DOCS = [None, True, 0, 1, 2, 3, 4, 5, 6, 7, 9, -1, 2.5, '""', '"ab"', '"abc"', [], [1], [2], [1, 2], [2, 4],
               [2, 4, 6], [1, 2, 3, 4], [2, 2], {}, {"a": 1}, {"a": 3}, {"a": 3, "b": 1}, {"a": 3, "b": "x"},
               {"a": 3, "z": 1}, {"a": 3, "z": -1}, {"b": 1.5}, {"a": 1, "b": 1, "c": 1}, {"a": 1, "c": 1},
               {"b": 1}, {"a": 1, "b": 1}]



@pytest.mark.parametrize("name", sorted(MERGES))
def test_merged_schemas_accept_exactly_the_valid_values(name):
    check_exact(MERGES[name], _MERGE_DOCS)


def test_merges_that_stay_refused_name_the_keyword():
    with pytest.raises(SchemaError, match="'pattern' different values"):
        json_schema_to_lark({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})
    with pytest.raises(SchemaError, match="adds patterns"):  # a key only the second's pattern matches
        json_schema_to_lark({"allOf": [{"type": "object", "additionalProperties": False},
                                       {"patternProperties": {"^x": {}}}]})


def test_a_merged_member_and_a_ref_to_its_pointer_get_their_own_rules():
    """#/properties/k is the unmerged schema for the $ref, and allOf [it, the branch's] for the merged member."""
    schema = {"type": "object", "properties": {"k": {"type": "integer"}, "r": {"$ref": "#/properties/k"}},
              "allOf": [{"properties": {"k": {"minimum": 5}}}]}
    check_exact(schema, ['{"k":1}', '{"k":7}', '{"k":7,"r":1}', '{"r":1}', '{"r":"x"}'])


# -------------------------------------------------------------------------------- propertyNames, extra keys
NAMES = {
    "pattern_length": {"type": "object", "properties": {"ab": {"type": "integer"}, "Xy": {}},
                       "propertyNames": {"pattern": "^[a-c]+$", "maxLength": 3},
                       "additionalProperties": {"type": "boolean"}},
    "enum_ref": {"type": "object", "properties": {"ab": {}}, "additionalProperties": {"type": "null"},
                 "propertyNames": {"$ref": "#/$defs/k"}, "$defs": {"k": {"enum": ["x", "y", "ab", 3]}}},
    "with_patterns": {"type": "object", "patternProperties": {"^x": {"type": "integer"}},
                      "propertyNames": {"minLength": 2, "maxLength": 3}},
    "false_names": {"type": "object", "properties": {"a": {}}, "propertyNames": False},
}
_KEYS = ["a", "ab", "abc", "abcd", "cab", "Xy", "x", "y", "xa", "xab", "xabc", "z1", "q\\"]
_KEY_VALUES = [True, None, 1]



@pytest.mark.parametrize("name", sorted(NAMES))
def test_property_names_on_extra_keys_accept_exactly_the_valid_objects(name):
    schema = NAMES[name]
    listed = list(schema.get("properties", {}))
    docs = [{}]
    for first, second in itertools.combinations(_KEYS, 2):  # listed names first (schema order), then the others
        keys = sorted([first, second], key=lambda k: (listed.index(k) if k in listed else len(listed), k))
        docs += [{keys[0]: v, keys[1]: w} for v in _KEY_VALUES for w in _KEY_VALUES[:2]]
    docs += [{k: v} for k in _KEYS for v in _KEY_VALUES]
    check_exact(schema, docs)


def test_additional_items_without_array_items_is_ignored_as_validators_do():
    """In 2020-12 additionalItems is no keyword; next to a schema-form items it has no effect in any draft."""
    schema = {"type": "array", "items": {"type": "integer"}, "additionalItems": False, "maxItems": 3}
    check_exact(schema, ["[]", "[1]", "[1,2]", "[1,2,3]", "[1,2,3,4]", '["a"]'])
    check_samples(schema, seed=1, n=20)


def test_long_strings_are_refused_by_the_front_end_naming_max_length():
    """The compiler refuses a terminal past 10,000 positions with a Lark message; the schema says which keyword."""
    json_schema_to_lark({"type": "string", "maxLength": 900})
    with pytest.raises(SchemaError, match="each character may be an escape sequence") as info:
        json_schema_to_lark({"type": "object", "properties": {"d": {"type": "string", "maxLength": 5000}}})
    assert info.value.keyword == "maxLength" and info.value.path == "#/properties/d"


SAMPLED = {f"{group}/{name}": schema for group, schemas in (("pattern_format", PATTERN_FORMAT),
           ("dependencies", DEPENDENCIES), ("numbers", NUMBERS), ("merges", MERGES), ("names", NAMES))
           for name, schema in schemas.items()}


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_samples_of_every_schema_above_validate(name):
    check_samples(SAMPLED[name], seed=4, n=40)
