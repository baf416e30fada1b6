"""JSON Schema keywords compiled by case analysis: patternProperties (key regions by DFA intersection and
difference). Sampled outputs validate with `jsonschema`; every instance of a bounded universe parses exactly
when `jsonschema` accepts it (canonical property order)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_json_schema import _dump, _parser, _parses, _property_order, _validator, check_samples

from specjax.grammar.json_schema import JsonSchemaOptions, SchemaError, json_schema_to_lark

PATTERN_SCHEMAS = {
    "prefix_and_suffix": {"type": "object", "properties": {"x-a": {"type": "integer"}, "b": {"type": "string"}},
                          "patternProperties": {"^x-": {"type": ["boolean", "integer"]},
                                                "id$": {"type": "integer", "minimum": 0}},
                          "additionalProperties": {"type": "null"}},
    "closed": {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}, "required": ["abc"],
               "additionalProperties": False},
    "overlapping": {"type": "object", "patternProperties": {"a": {"type": "integer", "maximum": 5},
                                                            "b": {"type": "integer", "minimum": 2}},
                    "additionalProperties": {"type": "string"}, "maxProperties": 3},
    "digits_draft7": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                      "properties": {"12": {"type": "boolean"}},
                      "patternProperties": {r"^\d+$": {"type": "string"}, r"^\w\.": False}},
    "overlapping_objects": {"type": "object", "patternProperties": {
        "a": {"type": "object", "properties": {"k": {"type": "integer"}}},
        "b": {"type": "object", "properties": {"k": {"maximum": 5}}}}, "additionalProperties": False},
    "false_pattern": {"type": "object", "patternProperties": {"^_": False},
                      "properties": {"_x": {"type": "integer"}, "y": {"type": "integer"}}},
}
# keys every schema above may meet: listed names, keys in one or two pattern regions, keys in none
KEYS = ["x-a", "b", "x-", "x-id", "id", "abc", "ab", "ba", "a b", "ZZ", "12", "7", "1a", "a.", "_x", "y", "_", "",
        'q"', "c\\"]
VALUES = [0, 3, 7, -1, "s", True, None, 1.5, {"k": 7}, {"k": 3}, {"k": "s"}]


def _order(schema: dict):
    """Canonical key order: names the schema lists anywhere (properties, then required) first, then the rest."""
    order = _property_order(schema)
    return lambda k: (order.get(k, len(order)), k)


@pytest.mark.parametrize("name", sorted(PATTERN_SCHEMAS))
def test_pattern_properties_samples_validate(name):
    check_samples(PATTERN_SCHEMAS[name], seed=5, n=40)


@pytest.mark.parametrize("name", sorted(PATTERN_SCHEMAS))
@settings(max_examples=60, deadline=timedelta(seconds=20), suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_pattern_properties_accept_exactly_the_valid_objects(name, data):
    schema = PATTERN_SCHEMAS[name]
    keys = data.draw(st.lists(st.sampled_from(KEYS) | st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                                               max_size=4), max_size=4, unique=True))
    doc = {k: data.draw(st.sampled_from(VALUES)) for k in sorted(keys, key=_order(schema))}
    text = _dump(doc)
    assert _parses(_cached(name), text) == _validator(schema).is_valid(doc), text


_PARSERS: dict = {}


def _cached(name: str):
    if name not in _PARSERS:
        _PARSERS[name] = _parser(json_schema_to_lark(PATTERN_SCHEMAS[name]))
    return _PARSERS[name]


def test_pattern_properties_with_strict_objects_constrain_listed_names_only():
    schema = PATTERN_SCHEMAS["prefix_and_suffix"]
    parser = _parser(json_schema_to_lark(schema, JsonSchemaOptions(strict_objects=True)))
    assert _parses(parser, '{"x-a":3,"b":"s"}')
    assert not _parses(parser, '{"x-a":true}')  # x-a: integer (properties) and boolean|integer (pattern)
    assert not _parses(parser, '{"x-b":true}')  # no extra keys at all


def test_pattern_properties_refusals_name_keyword_and_path():
    disjoint = {f"^p{i}$": {"type": "integer"} for i in range(8)}  # 9 key regions, not 2**8
    assert json_schema_to_lark({"type": "object", "patternProperties": disjoint})
    with pytest.raises(SchemaError, match=r"'patternProperties' at #: 9 patterns.*up to 8.*strict_objects"):
        json_schema_to_lark({"type": "object", "patternProperties": {**disjoint, "^q$": {}}})
    overlapping = {chr(97 + i): {"type": "integer"} for i in range(7)}  # keys may hold any subset: 128 regions
    with pytest.raises(SchemaError, match=r"'patternProperties' at #/properties/o: .*64 key regions.*strict_objects"):
        json_schema_to_lark({"properties": {"o": {"type": "object", "patternProperties": overlapping}}})
    assert json_schema_to_lark({"type": "object", "patternProperties": overlapping},
                               JsonSchemaOptions(strict_objects=True))
    with pytest.raises(SchemaError, match=r"'patternProperties' at #/patternProperties/\(\?=a\)"):
        json_schema_to_lark({"type": "object", "patternProperties": {"(?=a)": {}}})
    with pytest.raises(SchemaError, match="'propertyNames' at #"):  # a key constraint not compiled
        json_schema_to_lark({"type": "object", "patternProperties": {"^a": {}}, "additionalProperties": False,
                             "propertyNames": {"not": {"const": "ab"}}})
    short = _parser(json_schema_to_lark({"type": "object", "patternProperties": {"^a": {}},
                                         "additionalProperties": False, "propertyNames": {"maxLength": 3}}))
    assert _parses(short, '{"abc":1}') and not _parses(short, '{"abcd":1}') and not _parses(short, '{"b":1}')


# ------------------------------------------------------------------------------------ not, if/then/else
CASE_SCHEMAS = {
    "not_enum_strings": {"type": "string", "not": {"enum": ["a", "b", 'q"']}},
    "not_enum_pattern": {"type": ["string", "null"], "pattern": "^[ab]+$", "not": {"const": "ab"}},
    "not_type": {"not": {"type": ["string", "object"]}},
    "not_const_boolean": {"type": ["boolean", "null"], "not": {"const": True}},
    "not_enum_integers": {"type": ["integer", "null"], "maximum": 20, "not": {"enum": [1, 2.0, -3, None]}},
    "not_enum_filter": {"enum": [1, 2.0, "x", None], "not": {"enum": [2, None]}},
    "not_required": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "not": {"required": ["a", "b"]}},
    "forbidden_property": {"type": "object", "properties": {"a": {"not": {}}, "b": {"type": "integer"}},
                           "additionalProperties": False},
    "if_then_else": {"type": "object", "properties": {"k": {"enum": ["x", "y"]}, "v": {}},
                     "if": {"properties": {"k": {"const": "x"}}, "required": ["k"]},
                     "then": {"properties": {"v": {"type": "integer"}}, "required": ["v"]},
                     "else": {"properties": {"v": {"type": "string"}}}},
    "if_without_else": {"if": {"type": "string"}, "then": {"maxLength": 1}},
    "one_of_overlapping_values": {"oneOf": [{"type": ["string", "null"]}, {"enum": [1, "a", None]}]},
    "one_of_shared_properties": {"type": "object", "oneOf": [
        {"properties": {"k": {"enum": ["x"]}, "v": {"type": "string"}}},
        {"properties": {"k": {"enum": ["y"]}, "v": {"type": ["string", "null"]}}}]},
    "one_of_overlapping_objects": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
                                   "oneOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]},
                                             {"required": ["b"]}]},
    # one property: with two, the complement's branches would each list their own property first (see the docs)
    "not_ref": {"$defs": {"ab": {"enum": ["a", "b"]}, "node": {"type": "object", "properties": {
        "v": {"$ref": "#/$defs/ab"}}}}, "type": ["string", "object"], "not": {"$ref": "#/$defs/node"}},
    "if_type_enum": {"properties": {"a": {"type": ["integer", "string"]}},
                     "if": {"properties": {"a": {"type": "integer", "enum": [1, 2]}}}, "then": {"required": ["b"]},
                     "else": {"properties": {"b": False}}},
}
SCALARS = [None, True, False, 0, 1, 2, -3, 1.5, "", "a", "b", "ab", "ba", 'q"', "x", "y", "zz"]
CASE_KEYS = ["a", "b", "k", "v", "z"]


def _values(depth: int = 1):
    scalars = st.sampled_from(SCALARS)
    if depth == 0:
        return scalars
    inner = _values(depth - 1)
    return scalars | st.dictionaries(st.sampled_from(CASE_KEYS), inner, max_size=3) | st.lists(inner, max_size=2)


@pytest.mark.parametrize("name", sorted(CASE_SCHEMAS))
def test_case_split_samples_validate(name):
    check_samples(CASE_SCHEMAS[name], seed=7, n=40)


@pytest.mark.parametrize("name", sorted(CASE_SCHEMAS))
@settings(max_examples=80, deadline=timedelta(seconds=20), suppress_health_check=list(HealthCheck))
@given(value=_values())
def test_case_split_accepts_exactly_the_valid_values(name, value):
    schema = CASE_SCHEMAS[name]
    if isinstance(value, dict):
        value = {k: value[k] for k in sorted(value, key=_order(schema))}
    text = _dump(value)
    assert _parses(_cached_case(name), text) == _validator(schema).is_valid(value), text


def _cached_case(name: str):
    if ("case", name) not in _PARSERS:
        _PARSERS["case", name] = _parser(json_schema_to_lark(CASE_SCHEMAS[name]))
    return _PARSERS["case", name]


@pytest.mark.parametrize(("schema", "keyword", "path", "why"), [
    ({"properties": {"a": {"not": {"pattern": "x"}}}}, "not", "#/properties/a/not", "complement of 'pattern'"),
    ({"type": "number", "not": {"type": "integer"}}, "not", "#", "not integers"),
    ({"type": "number", "not": {"const": 3}}, "not", "#", "excluding numbers"),
    ({"type": "string", "maxLength": 3, "not": {"const": "a"}}, "not", "#", "minLength/maxLength/format"),
    ({"if": {"format": "date"}, "then": {"type": "integer"}}, "if", "#", "complement of 'format'"),
    ({"not": {"type": "integer"}}, "not", "#", "not integers"),
    ({"$defs": {"n": {"properties": {"k": {"$ref": "#/$defs/n"}}}}, "not": {"$ref": "#/$defs/n"}}, "not", "#/$defs/n",
     "deeper than 16 levels"),
])
def test_case_split_refusals_name_keyword_and_path(schema, keyword, path, why):
    with pytest.raises(SchemaError) as info:
        json_schema_to_lark(schema)
    assert (info.value.keyword, info.value.path) == (keyword, path) and why in info.value.why, str(info.value)


# ------------------------------------------------------------------------------------ uniqueItems
UNIQUE_SCHEMAS = {
    "enum": {"type": "array", "items": {"enum": ["a", "b", 1, 1.0, None]}, "uniqueItems": True, "minItems": 1},
    "booleans": {"type": "array", "items": {"type": ["boolean", "null"]}, "uniqueItems": True, "maxItems": 2},
    "ref_enum": {"type": "array", "items": {"$ref": "#/$defs/v"}, "uniqueItems": True,
                 "$defs": {"v": {"type": "string", "enum": ["x", "y", 3, {"k": 1, "j": 2}, {"j": 2, "k": 1}]}}},
}
ITEMS = ["a", "b", 1, None, True, False, "x", "y", 3, {"k": 1, "j": 2}, 2]


@pytest.mark.parametrize("name", sorted(UNIQUE_SCHEMAS))
@settings(max_examples=80, deadline=timedelta(seconds=20), suppress_health_check=list(HealthCheck))
@given(value=st.lists(st.sampled_from(ITEMS), max_size=5))
def test_unique_items_accept_exactly_the_valid_arrays(name, value):
    schema = UNIQUE_SCHEMAS[name]
    if ("unique", name) not in _PARSERS:
        _PARSERS["unique", name] = _parser(json_schema_to_lark(schema))
    assert _parses(_PARSERS["unique", name], _dump(value)) == _validator(schema).is_valid(value), _dump(value)


@pytest.mark.parametrize("name", sorted(UNIQUE_SCHEMAS))
def test_unique_items_samples_validate(name):
    check_samples(UNIQUE_SCHEMAS[name], seed=9, n=40)


def test_unique_items_refusals_name_keyword_path_and_limit():
    with pytest.raises(SchemaError, match=r"'uniqueItems' at #/properties/t: .*finite item domain"):
        json_schema_to_lark({"properties": {"t": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}})
    with pytest.raises(SchemaError, match=r"'uniqueItems' at #: .*over 9 values.*up to 8"):
        json_schema_to_lark({"type": "array", "items": {"enum": list(range(9))}, "uniqueItems": True})


# ------------------------------------------------------------------------------------ formats
def test_formats_no_draft_defines_are_annotations_and_hostname_compiles():
    schema = {"type": "object", "properties": {"c": {"type": "string", "format": "color"},
                                               "n": {"enum": ["x", 3], "format": "int64"},
                                               "h": {"type": "string", "format": "hostname", "maxLength": 20}}}
    parser = _parser(json_schema_to_lark(schema))
    for doc, ok in [('{"c":"not a color!"}', True), ('{"n":3}', True), ('{"n":"y"}', False),
                    ('{"h":"a-b.example"}', True), ('{"h":"-bad"}', False), ('{"h":"a..b"}', False)]:
        assert _parses(parser, doc) is ok, doc
    with pytest.raises(SchemaError, match="format 'duration' has no exact grammar"):  # a draft defines it: refused
        json_schema_to_lark({"type": "string", "format": "duration"})
