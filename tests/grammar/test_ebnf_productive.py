"""The JSON Schema compiler's productivity check (`_ebnf_productive.productive`) against lark's own loader."""

from __future__ import annotations

import pytest
from lark.load_grammar import load_grammar
from test_json_schema import SCHEMAS
from test_json_schema_keywords import PATTERN_SCHEMAS

from specjax.grammar._ebnf_productive import productive
from specjax.grammar.json_schema import json_schema_to_lark


def _lark_productive(text: str) -> set[str]:
    """Oracle: lark's EBNF → BNF compiler, then the fixed point over BNF alternatives."""
    grammar, _ = load_grammar(text, "<test>", [], False)
    names = [str(name) for name, params, _, _ in grammar.rule_defs if not params]
    _, rules, _ = grammar.compile(names, set())
    done: set[str] = set()
    changed = True
    while changed:
        changed = False
        for rule in rules:
            if rule.origin.name not in done and all(s.is_term or s.name in done for s in rule.expansion):
                done.add(rule.origin.name)
                changed = True
    return {n for n in done if not n.startswith("__")}


def _rules(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        name, _, body = line.partition(":")
        if name.strip() and name.strip()[0].islower():
            out[name.strip()] = body
    return out


HAND = [
    'start: a | "x"\na: a "y"\n',
    'start: a b\na: "x" a\nb: "y"\n',
    'start: (a | "x") ("y" b)?\na: a\nb: b "z"\n',
    'start: (a)~0..3 c\na: a\nc: (d)~2 | "q"\nd: d\n',
    'start: (a)+\na: "x" | a a\n',
    'start: "[" (a ("," a)*)? "]"\na: start\n',
    'start: a\na: (b)~1..2\nb: /x+/ b\n',
]


@pytest.mark.parametrize("text", HAND + [json_schema_to_lark(s) for s in
                                          [*SCHEMAS.values(), *PATTERN_SCHEMAS.values()]])
def test_productive_rules_equal_larks(text):
    rules = _rules(text)
    assert productive(rules) == _lark_productive(text) & set(rules), text[:300]
