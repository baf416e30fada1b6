"""JsonSchemaOptions.unenforced: a keyword that cannot be compiled exactly is dropped where it occurs (and said
where), only there; without the option the same schema is refused with a message naming the option."""

from __future__ import annotations

import json

import jsonschema
import lark
import pytest

from specjax.grammar.json_schema import UNENFORCEABLE, JsonSchemaOptions, SchemaError, json_schema_grammar

STRINGS = {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 3}
# keyword → (schema refused without the option, where it is dropped, an instance the wider grammar accepts
# although it breaks that keyword, an instance that breaks something still enforced)
CASES = {
    "uniqueItems": ({**STRINGS, "uniqueItems": True}, "#",
                    '["a","a"]', '["abc"]'),
    "oneOf": ({"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "maxItems": 1}]},
              "#", "[1]", '{"a":1}'),
    "contains": ({**STRINGS, "contains": {"const": "x"}}, "#",
                 '["a"]', '["a","b","c","d"]'),
    "pattern": ({"type": "object", "properties": {"n": {"type": "string", "pattern": "^(?!ab)[a-z]+$",
                                                        "maxLength": 3}}, "required": ["n"]}, "#/properties/n",
                '{"n":"abc"}', '{"n":"abcd"}'),
    "maxLength": ({"type": "object", "properties": {"d": {"type": "string", "minLength": 1, "maxLength": 5000}},
                   "required": ["d"]}, "#/properties/d", '{"d":"' + "x" * 5001 + '"}', '{"d":""}'),
    "propertyNames": ({"type": "object", "propertyNames": {"not": {"const": "b"}}, "maxProperties": 1},
                      "#", '{"b":1}', '{"a":1,"c":2}'),
}


def _accepts(lark_text: str, text: str) -> bool:
    try:
        lark.Lark(lark_text, parser="earley", lexer="dynamic").parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


def _valid(schema, text: str) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(json.loads(text))


def test_every_unenforceable_keyword_has_a_case():
    assert set(CASES) == set(UNENFORCEABLE)


@pytest.mark.parametrize("keyword", sorted(CASES))
def test_refused_without_the_option_with_a_message_naming_it(keyword):
    schema = CASES[keyword][0]
    with pytest.raises(SchemaError) as info:
        json_schema_grammar(schema, JsonSchemaOptions(max_repeat=4))
    assert info.value.keyword.endswith(keyword) or keyword == "contains" and "contains" in info.value.keyword
    assert f"json_unenforced=[{keyword}]" in str(info.value)


@pytest.mark.parametrize("keyword", sorted(CASES))
def test_dropped_only_there_and_said_where(keyword):
    schema, where, wider, invalid = CASES[keyword]
    text, at = json_schema_grammar(schema, JsonSchemaOptions(max_repeat=4, unenforced=(keyword,)))
    assert at and all(a.split(" at ")[0].endswith(keyword) or keyword == "contains" for a in at)
    assert any(a.endswith(f" at {where}") for a in at), at
    assert not _valid(schema, wider) and _accepts(text, wider)  # the keyword is not enforced …
    assert not _valid(schema, invalid) and not _accepts(text, invalid)  # … the rest of the schema is


def test_exact_where_the_keyword_compiles():
    """A finite item domain keeps distinct items exact and reports nothing, with the option on."""
    schema = {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}
    text, at = json_schema_grammar(schema, JsonSchemaOptions(unenforced=UNENFORCEABLE))
    assert at == ()
    assert _accepts(text, '["a","b"]') and not _accepts(text, '["a","a"]')


def test_only_the_listed_keyword_is_dropped():
    pattern = CASES["pattern"][0]["properties"]["n"]
    schema = {"type": "object", "properties": {"t": CASES["uniqueItems"][0], "n": pattern}}
    with pytest.raises(SchemaError, match="'pattern'"):
        json_schema_grammar(schema, JsonSchemaOptions(max_repeat=4, unenforced=("uniqueItems",)))


def test_unknown_keyword_in_the_option_is_refused():
    with pytest.raises(ValueError, match="'format' cannot be left unenforced"):
        JsonSchemaOptions(unenforced=("format",))
