"""The automaton's size stays under control: factored alternatives, and a state cap checked as it grows."""

from __future__ import annotations

import lark
import numpy as np
import pytest

from specjax.grammar import GrammarError, GrammarOptions, compile_grammar
from specjax.grammar.automaton import _Builder, build_automaton
from specjax.grammar.frontend import load_lark

# Bounded repetition inside nesting: lark spells it as 15 (expr) and 7 (term) alternatives, one per
# combination of operators; unfactored, every nesting level multiplied the parser configurations by them
# (> 10 minutes and ~20 GB at max_depth=3).
ARITH_BOUNDED = r"""
start: expr
expr: term (("+" | "-") term)~0..3
term: factor (("*" | "/") factor)~0..2
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,4}/
%ignore " "
"""


class Tok:
    eos_ids = (1,)

    def token_bytes(self) -> list[bytes]:
        return [b"", b"", b"1", b"+", b"*", b"(", b")", b" "]


def test_factored_alternatives_keep_parser_configurations_small():
    cfg = load_lark(ARITH_BOUNDED)
    builder = _Builder(cfg, 2, 100_000, "arith")
    builder.run()
    # Unfactored: 148,484 distinct pending forms at depth 2. Factored: each level only records how far its
    # two counters have come.
    assert len(builder._closure_memo) < 5_000
    assert builder._work < 20_000


def test_bounded_repetition_language_is_kept():
    auto = build_automaton(load_lark(ARITH_BOUNDED), max_depth=2, max_states=100_000)

    def accepts(text: str) -> bool:
        state = 1
        for b in text.encode():
            state = int(auto.trans_sb[state, b])
        return bool(auto.accept_s[state])

    parser = lark.Lark(ARITH_BOUNDED, parser="earley")
    for text in ["1", "1+2-3+4", "1*2/3", "(1+2*3)*(4-5)", "((1+2)+3)*4", "1 + 2 * 3 / 4 - (5)"]:
        parser.parse(text)
        assert accepts(text), text
    for text in ["1+2+3+4+5", "1*2*3*4", "(((1)))", "1+", "()"]:  # 4 terms, 4 factors, depth 3, incomplete
        assert not accepts(text), text


def test_state_cap_fires_during_construction_with_one_clear_message():
    with pytest.raises(GrammarError) as info:
        compile_grammar(ARITH_BOUNDED, Tok(), GrammarOptions(max_depth=3, max_states=2_000, cache=False))
    message = str(info.value)
    assert "'start: expr'" in message  # the grammar
    assert "stopped at 2000 automaton states" in message and "max_states=2000" in message  # at the cap
    assert "max_depth" in message and "expr" in message and "lower max_depth or raise max_states" in message


def test_closure_cap_fires_before_any_state():
    # The first closure alone expands 40 configurations (a chain of rules): the work cap (8 x max_states)
    # stops it before the subset construction has its first state.
    chain = "start: r0\n" + "".join(f'r{i}: r{i + 1} | "a{i}"\n' for i in range(40)) + 'r40: "z"\n'
    with pytest.raises(GrammarError, match="stopped at 25 parser configurations"):
        build_automaton(load_lark(chain), max_depth=1, max_states=3)
    assert build_automaton(load_lark(chain), max_depth=1, max_states=100).accept_s.any()


def test_factoring_shares_prefixes_and_suffixes():
    cfg = load_lark('start: "a" "b" "c" | "a" "b" "d" | "a" "x" "c" | "a" "x" "d"')
    # start: "a" start__f0, start__f0: "b" start__f1 | "x" start__f1, start__f1: "c" | "d"
    assert len(cfg.alts) == 5
    auto = build_automaton(cfg, max_depth=1, max_states=100)
    words = {bytes(w) for w in (b"abc", b"abd", b"axc", b"axd")}
    for w in words | {b"ab", b"abx", b"ac"}:
        state = 1
        for b in w:
            state = int(auto.trans_sb[state, b])
        assert bool(auto.accept_s[state]) == (w in words), w
    assert np.count_nonzero(auto.accept_s) == 1


def test_factored_helpers_keep_the_closing_bracket_in_the_nesting_bound():
    # Factored, the pending "]" of an outer list hides inside helper rules (a__f4 ...); counted as what all
    # their suffixes hold, it still bounds the nesting (unweighted, this passed 200,000 states at depth 1).
    grammar = 'start: a\na: "[" WS? (v (WS? "," WS? v)*)? WS? "]"\nv: "1" | a\nWS: /[ ]+/\n'
    auto = build_automaton(load_lark(grammar), max_depth=2, max_states=5_000)
    assert len(auto.accept_s) < 200

    def accepts(text: str) -> bool:
        state = 1
        for b in text.encode():
            state = int(auto.trans_sb[state, b])
        return bool(auto.accept_s[state])

    assert accepts("[ 1 , [1 ,1 ] ]") and accepts("[[]]") and not accepts("[[[]]]")
