"""JSON Schema objects: the extra-key terminal, min/maxProperties and dependencies, max_repeat, propertyNames
(moved from test_json_schema.py, which passed 400 lines)."""

from __future__ import annotations

import json
import random

import pytest
from test_json_schema import _parser, _parses, _validator

from specjax.grammar.json_schema import JsonSchemaOptions, SchemaError, json_schema_to_lark
from specjax.grammar.sample import LarkSampler


@pytest.mark.parametrize("names", [["a", "ab", "b"], [], [""], ["x", "xy", "xyz", "é", "日本"], ["a\"b", "c"]])
def test_other_key_terminal_equals_the_per_node_form(names):
    """The shared-tail "any other key" regex has the language of the per-node one, and no listed name."""
    import itertools
    import re as regex

    from specjax.grammar._json_schema_types import TypeEmitter

    class Owner:
        options, ws = JsonSchemaOptions(), ""

    emitter = TypeEmitter(Owner())
    fast, slow = (regex.compile(t[1:-1].replace("\\x22", '"'))
                  for t in (emitter._key_not_in(names), emitter._key_not_in_per_node(names)))
    alphabet = ["a", "b", "x", "y", "z", "é", "日", "本", '\\"', "\\n", "\\u0001", "\\\\"]
    keys = ['"' + "".join(p) + '"' for n in range(4) for p in itertools.product(alphabet, repeat=n)]
    keys += [json.dumps(n, ensure_ascii=False) for n in names]
    assert [k for k in keys if bool(fast.fullmatch(k)) != bool(slow.fullmatch(k))] == []
    assert not any(fast.fullmatch(json.dumps(n, ensure_ascii=False)) for n in names)
    long_names = ["abcdefgh", "abcdxyz"]
    assert len(emitter._key_not_in(long_names)) < len(emitter._key_not_in_per_node(long_names)) / 2


def _canonical(dfa) -> tuple[list, list]:
    """A DFA's rows renumbered in breadth-first order from the start: equal for two minimal DFAs of one language."""
    ids, order = {0: 0}, [0]
    for q in order:
        for t in dfa.trans[q]:
            if t >= 0 and int(t) not in ids:
                ids[int(t)] = len(order)
                order.append(int(t))
    return [[ids[int(t)] if t >= 0 else -1 for t in dfa.trans[q]] for q in order], [bool(dfa.accept[q]) for q in order]


@pytest.mark.parametrize("names", [["a", "ab", "b"], [], [""], ["x", "xy", "xyz", "é", "日本"], ["a\"b", "c"],
                                   ["a\u0001", "\\", "a", "tab\there", "\U0001f600 emoji"]])
def test_other_key_dfa_is_the_regex_s_automaton(names):
    """The "any other key" automaton built directly (a difference of automata) is the minimal DFA of the regex the
    compiler writes for it (both forms), state for state."""
    from specjax.grammar._json_names import other_key_dfa
    from specjax.grammar._json_schema_types import TypeEmitter
    from specjax.grammar.terminals import regex_dfa

    class Owner:
        options, ws = JsonSchemaOptions(), ""

    emitter = TypeEmitter(Owner())
    want = _canonical(other_key_dfa(tuple(names)))
    for text in (emitter._key_not_in_text(names), emitter._key_not_in_per_node(names)):
        assert _canonical(regex_dfa(text[1:-1].replace("\\x22", '"'))) == want


def test_compiling_an_open_object_does_not_compile_the_other_key_regex(monkeypatch):
    """compile_grammar takes the registered automaton for the extra-key terminal (the regex took seconds), and the
    compiled grammar still refuses a listed name as an extra key and allows any other."""
    from test_declared_nesting import Tok, accepts

    from specjax.grammar import GrammarOptions, compile_grammar, terminals

    compiled = []
    real = terminals.regex_dfa
    monkeypatch.setattr(terminals, "regex_dfa",
                        lambda regex, where="regex": compiled.append(regex) or real(regex, where))
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in ("alpha", "beta", "gamma")}}
    text = json_schema_to_lark(schema)
    tables = compile_grammar(text, Tok(), GrammarOptions(cache=False))
    assert compiled and not any("alph" in r for r in compiled)
    assert accepts(tables, '{"beta":1,"alphx":{}}') and accepts(tables, '{"alpha":1}')
    assert not accepts(tables, '{"alpha":{}}') and not accepts(tables, '{"gamma":1,"beta":[]}')


PROPERTY_COUNTS = [
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
     "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"const": 1}},
     "dependencies": {"a": ["c"], "c": ["b"]}},
    {"type": "object", "minProperties": 1, "dependentRequired": {"b": ["a"], "c": ["b"]},
     "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "minProperties": 1},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"const": 1}},
     "required": ["c"], "maxProperties": 2, "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "x": {"type": "boolean"}},
     "minProperties": 2, "maxProperties": 2, "additionalProperties": False},
    {"type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": {"type": "boolean"}},
]


@pytest.mark.parametrize("schema", PROPERTY_COUNTS)
def test_min_and_max_properties_and_dependencies_are_exact(schema):
    import itertools

    text = json_schema_to_lark(schema)
    sampler, parser, check, rng = LarkSampler(text), _parser(text), _validator(schema), random.Random(3)
    for _ in range(60):
        check.validate(json.loads(sampler.sample(rng)))  # sound
    values = {"a": "1", "b": "2", "c": "1", "x": "true"}
    for n in range(5):  # complete: every valid object of these keys in canonical order parses, no other does
        for keys in itertools.combinations(["a", "b", "c", "x"], n):
            doc = "{" + ",".join(f'"{k}":{values[k]}' for k in keys) + "}"
            assert _parses(parser, doc) == check.is_valid(json.loads(doc)), (schema, doc)


def test_impossible_property_counts_are_empty():
    from specjax.grammar.json_schema import EmptySchemaError

    with pytest.raises(EmptySchemaError, match="minProperties"):
        json_schema_to_lark({"type": "object", "properties": {"a": {}}, "additionalProperties": False,
                             "minProperties": 2})
    with pytest.raises(SchemaError, match="maxProperties"):
        json_schema_to_lark({"type": "object", "maxProperties": 1000})
    with pytest.raises(SchemaError, match="cannot keep extra keys distinct"):  # {"k":1,"k":2} is one member
        json_schema_to_lark({"type": "object", "properties": {"a": {}}, "minProperties": 3})


def test_max_repeat_bounds_free_arrays_and_extra_properties():
    schema = {"type": "object", "properties": {"t": {"type": "array", "items": {"type": "integer"}, "minItems": 1}},
              "additionalProperties": {"type": "integer"}}
    text = json_schema_to_lark(schema, JsonSchemaOptions(max_repeat=3))
    parser, check = _parser(text), _validator(schema)
    for doc, ok in [('{"t":[1,2,3]}', True), ('{"t":[1,2,3,4]}', False), ('{"t":[1],"a":1,"b":2,"c":3}', True),
                    ('{"t":[1],"a":1,"b":2,"c":3,"d":4}', False), ('{"a":1}', True)]:
        assert _parses(parser, doc) == ok and check.is_valid(json.loads(doc)), doc
    sampler, rng = LarkSampler(text), random.Random(0)
    for _ in range(40):
        check.validate(json.loads(sampler.sample(rng)))
    many = {"type": "array", "items": {"type": "integer"}, "minItems": 5}  # minItems above the bound wins
    assert _parses(_parser(json_schema_to_lark(many, JsonSchemaOptions(max_repeat=3))), "[1,2,3,4,5]")
    tree = {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"}
    assert "~" not in json_schema_to_lark(tree, JsonSchemaOptions(max_repeat=3))  # may recurse: unbounded


@pytest.mark.parametrize("items, item", [({}, "1"), ({"description": "anything"}, "1"), ({"type": "array"}, "[]"),
                                         ({"type": "object", "properties": {"x": {}}}, '{"x":1}')])
def test_max_repeat_leaves_arrays_of_generic_json_unbounded(items, item):
    # Counting copies the item's automaton per position: generic JSON items made `{"type": "array"}` 46,227
    # states at 16 items instead of 1,463. Such arrays stay free (exact); others are still counted.
    schema = {"type": "object", "properties": {"free": {"type": "array", "items": items},
                                               "ints": {"type": "array", "items": {"type": "integer"}}}}
    parser = _parser(json_schema_to_lark(schema, JsonSchemaOptions(max_repeat=2)))
    assert _parses(parser, '{"free":[' + ",".join([item] * 4) + "]}")
    assert _parses(parser, '{"ints":[1,2]}') and not _parses(parser, '{"ints":[1,2,3]}')


def test_max_repeat_counters_do_not_nest():
    # An outer counter would copy the inner counted array once per outer position (N × N copies): only the
    # innermost free array is counted.
    schema = {"type": "array", "items": {"type": "object", "properties": {
        "h": {"type": "array", "items": {"type": "integer"}}}, "required": ["h"]}}
    parser = _parser(json_schema_to_lark(schema, JsonSchemaOptions(max_repeat=2, strict_objects=True)))
    assert _parses(parser, '[{"h":[1,2]},{"h":[]},{"h":[3]},{"h":[1,2]}]')  # the outer array is free
    assert not _parses(parser, '[{"h":[1,2,3]}]')  # the inner one is counted


def test_property_names_filter_listed_properties():
    schema = {"type": "object", "additionalProperties": False, "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 2},
              "properties": {"ab": {"type": "integer"}, "Xy": {"type": "integer"}, "abc": {"type": "integer"}}}
    parser, check = _parser(json_schema_to_lark(schema)), _validator(schema)
    for doc in ['{}', '{"ab":1}', '{"Xy":1}', '{"abc":1}', '{"ab":1,"Xy":2}']:
        assert _parses(parser, doc) == check.is_valid(json.loads(doc)), doc
    with pytest.raises(SchemaError, match="pass strict_objects"):  # a key constraint not compiled for extra keys
        json_schema_to_lark({**schema, "additionalProperties": True, "propertyNames": {"not": {"const": "a"}}})
    assert "ab" in json_schema_to_lark({**schema, "additionalProperties": True}, JsonSchemaOptions(strict_objects=True))
    with pytest.raises(SchemaError, match="not a valid property name"):
        json_schema_to_lark({**schema, "required": ["Xy"]})
