"""The nesting bound cuts only recursion: declared structure (rules on no cycle) is never cut, at any depth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specjax.grammar import GrammarError, GrammarOptions, compile_grammar
from specjax.grammar.json_schema import json_schema_to_lark


class Tok:
    eos_ids = (1,)

    def token_bytes(self) -> list[bytes]:
        return [b"", b""] + [bytes([b]) for b in range(32, 127)]


def compiled(schema, **options):
    return compile_grammar(json_schema_to_lark(schema), Tok(), GrammarOptions(cache=False, **options))


def accepts(tables, text: str) -> bool:
    trans, state = np.asarray(tables.trans_sb), tables.initial_state
    for b in text.encode():
        state = int(trans[state, b])
    return bool(np.asarray(tables.accept_s)[state])


def nested_schema(depth: int, closed: bool) -> dict:
    node: dict = {"type": "array", "items": {"type": "integer"}}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
        if closed:
            node["additionalProperties"] = False
    return node


def nested_doc(depth: int) -> str:
    doc: object = [1, 2]
    for _ in range(depth):
        doc = {"a": doc}
    return json.dumps(doc, separators=(",", ":"))


@pytest.mark.parametrize("closed", [True, False])
def test_declared_objects_six_deep_are_accepted_at_max_depth_1(closed):
    tables = compiled(nested_schema(6, closed), max_depth=1)
    assert accepts(tables, nested_doc(6))
    assert not accepts(tables, nested_doc(5)) and not accepts(tables, nested_doc(7))
    # closed objects hold no recursion at all; open ones allow any JSON value under extra keys (bounded)
    assert tables.truncated == (not closed)


def test_recursive_schema_is_still_bounded():
    tree = {"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                            "additionalProperties": False}}, "$ref": "#/$defs/t"}
    tables = compiled(tree, max_depth=2)
    assert tables.truncated
    assert accepts(tables, '{"kids":[{"kids":[]}]}')
    assert not accepts(tables, '{"kids":[{"kids":[{"kids":[{"kids":[]}]}]}]}')


def test_generic_json_under_declared_structure_gets_its_own_depth():
    # An open object 3 levels down: the generic value under an extra key may still nest max_depth levels.
    tables = compiled(nested_schema(3, closed=False), max_depth=2)
    assert accepts(tables, '{"a":{"a":{"a":[1],"x":[[1]]}}}')
    assert not accepts(tables, '{"a":{"a":{"a":[1],"x":[[[1]]]}}}')


def test_too_large_at_depth_1_does_not_suggest_lowering_it():
    arith = 'start: e\ne: t ("+" t)~0..3\nt: f ("*" f)~0..2\nf: "1" | "(" e ")"\n'
    with pytest.raises(GrammarError) as info:
        compile_grammar(arith, Tok(), GrammarOptions(max_depth=1, max_states=10, cache=False))
    assert "raise max_states" in str(info.value) and "lower max_depth" not in str(info.value)
