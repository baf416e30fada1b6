"""Left recursion of every kind is rewritten as iteration, and the language stays lark's, string for string."""

from __future__ import annotations

import itertools
from datetime import timedelta

import lark
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from specjax.grammar import GrammarError, _left_recursion
from specjax.grammar._deadline import deadline
from specjax.grammar.automaton import build_automaton
from specjax.grammar.frontend import load_lark

ALPHABET = "abc"
MAX_LEN = 5


def _strings():
    for n in range(MAX_LEN + 1):
        for chars in itertools.product(ALPHABET, repeat=n):
            yield "".join(chars)


def _lark_accepts(parser: lark.Lark, text: str) -> bool:
    try:
        parser.parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


def assert_same_language(grammar: str, max_depth: int = 3, max_states: int = 20_000) -> bool:
    """Every string over ``abc`` up to length 5 that the automaton accepts parses with lark's Earley parser, and
    where the nesting bound cut nothing (``truncated`` is false) every string lark parses is accepted.

    Returns:
      whether the comparison was exact (both directions).
    """
    auto = build_automaton(load_lark(grammar), max_depth=max_depth, max_states=max_states)
    parser = lark.Lark(grammar, parser="earley", lexer="dynamic")
    for text in _strings():
        state = 1
        for b in text.encode():
            state = int(auto.trans_sb[state, b])
        ours = bool(auto.accept_s[state])
        if ours or not auto.truncated:
            assert ours == _lark_accepts(parser, text), (grammar, text)
    return not auto.truncated


LEFT_RECURSIVE = {
    "indirect": 'start: x\nx: y "a" | "b"\ny: x "b" | "c"',
    "three_rules": 'start: x\nx: y "a" | "b"\ny: z "b"\nz: x "c" | "c"',
    "hidden_behind_nullable": 'start: x\nx: n x "a" | "b"\nn: "c" |',
    "hidden_indirect": 'start: x\nx: n y "a" | "b"\nn: "c"?\ny: x "c" | "a"',
    "unit_cycle": 'start: x\nx: y | "a"\ny: x | x "b"',
    "expression_like": 'start: v\nv: "a" | e | "(" v ")"\ne: f | v "b" v ("c" v)*\nf: "c" "(" v ")"',
    "hidden_behind_a_longer_nullable": 'start: x\nx: n x "a" | "b"\nn: m "c" m | m\nm: "b" "a" |',
    "nullable_chain_into_itself": 'start: x\nx: n m x "b" | "a"\nn: "c" |\nm: n |',
}
ITERATION_ONLY = {"indirect", "three_rules", "unit_cycle"}  # the others also embed (x → c x a, v → ( v ))


@pytest.mark.parametrize("name", sorted(LEFT_RECURSIVE))
def test_left_recursion_keeps_the_language(name):
    exact = assert_same_language(LEFT_RECURSIVE[name])
    assert exact == (name in ITERATION_ONLY)  # left recursion alone becomes iteration: nothing for the bound to cut


@st.composite
def left_recursive_grammars(draw) -> str:
    """Up to 3 rules whose alternatives may start with any rule (so direct, indirect and hidden recursion)."""
    n_rules = draw(st.integers(1, 3))
    items = ['"a"', '"b"', '"c"'] + [f"r{k}" for k in range(n_rules)] + [f"r{k}?" for k in range(n_rules)]
    rules = []
    for k in range(n_rules):
        alts = [" ".join(draw(st.lists(st.sampled_from(items), min_size=0, max_size=3)))
                for _ in range(draw(st.integers(1, 3)))]
        rules.append(f"r{k}: " + " | ".join(alts))
    return "start: r0\n" + "\n".join(rules)


@settings(max_examples=60, deadline=timedelta(seconds=30), suppress_health_check=[HealthCheck.too_slow])
@given(left_recursive_grammars())
def test_generated_left_recursive_grammars_keep_the_language(grammar):
    try:
        with deadline(10):  # a drawn grammar whose automaton is large is refused like any large one
            assert_same_language(grammar, max_states=5_000)
    except GrammarError:
        assume(False)  # an empty language, or too large: test_grammar_errors


def test_a_rewrite_that_would_explode_is_refused_naming_the_rules(monkeypatch):
    monkeypatch.setattr(_left_recursion, "MAX_ALTERNATIVES", 15)
    grammar = 'start: x\nx: y "a" | y "b" | "c" | "d"\ny: x "c" | x "d" | x "a" | "a" | "b"'
    with pytest.raises(GrammarError, match=r"rules x, y .*too large to rewrite"):
        load_lark(grammar)


def _left_corners(rules, nullable):
    out = {}
    for name, alts in rules.items():
        out[name] = set()
        for a in alts:
            for s in a:
                if s in rules:
                    out[name].add(s)
                if s not in nullable:
                    break
    return out


def test_rewritten_rules_never_lead_back_to_themselves_without_input():
    rules = {"x": [("y", "A"), ("B",)], "y": [("n", "x", "B"), ("C",)], "n": [("C",), ()]}
    assert _left_corners(rules, {"n"})["y"] == {"n", "x"}  # the input is left-recursive, hidden behind n
    out = _left_recursion.remove_left_recursion(rules)
    left = _left_corners(out, _left_recursion.nullable_rules(out))
    for start in out:
        todo, seen = list(left[start]), set()
        while todo:
            node = todo.pop()
            assert node != start, (start, out)
            if node not in seen:
                seen.add(node)
                todo.extend(left[node])
