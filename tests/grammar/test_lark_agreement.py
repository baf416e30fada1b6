"""Every string the automaton accepts parses with lark itself (generated grammars, random DFA walks)."""

from __future__ import annotations

from datetime import timedelta

import lark
import numpy as np
import pytest
from grammar_samples import DOCS, GRAMMARS
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from specjax.grammar import GrammarError
from specjax.grammar._deadline import deadline
from specjax.grammar.automaton import build_automaton
from specjax.grammar.frontend import load_lark

ATOMS = ['"a"', '"b"', '"ab"', "X", '"c"i', '"0".."2"']
SUFFIXES = ["", "", "?", "*", "+"]


@st.composite
def grammars(draw) -> str:
    n_rules = draw(st.integers(1, 3))

    def item(k: int) -> str:
        kind = draw(st.integers(0, 9))
        if kind <= 5:
            body = draw(st.sampled_from(ATOMS))
        elif kind <= 7:
            body = f"r{draw(st.integers(k + 1, n_rules))}" if k + 1 <= n_rules - 1 else '"b"'
        else:  # self-embedding: brackets around a recursive reference
            body = f'"(" r{draw(st.integers(0, n_rules - 1))} ")"'
        return body + draw(st.sampled_from(SUFFIXES)) if "(" not in body else body

    rules = []
    for k in range(n_rules):
        alts = [" ".join(item(k) for _ in range(draw(st.integers(1, 3)))) for _ in range(draw(st.integers(1, 3)))]
        rules.append(f"r{k}: " + " | ".join(alts))
    ignore = '\n%ignore " "' if draw(st.booleans()) else ""
    return "start: r0\n" + "\n".join(rules) + '\nX: /[ab]c|c[0-2]+/' + ignore


def random_sentences(auto, rng: np.random.Generator, n: int, max_len: int = 24) -> list[bytes]:
    """Random walks over live bytes, stopping at accepting states (the automaton is trimmed)."""
    out = []
    for _ in range(n):
        state, text = 1, b""
        while True:
            live = np.nonzero(auto.trans_sb[state] != 0)[0]
            if auto.accept_s[state] and (len(text) >= max_len or rng.random() < 0.3 or not len(live)):
                break
            assert len(live), "a live, non-accepting state must have a way forward"
            b = int(rng.choice(live[live < 128])) if (live < 128).any() else int(rng.choice(live))
            state, text = int(auto.trans_sb[state, b]), text + bytes([b])
        out.append(text)
    return out


@settings(max_examples=40, deadline=timedelta(seconds=30), suppress_health_check=[HealthCheck.too_slow])
@given(grammars(), st.integers(0, 2**32 - 1))
def test_generated_grammars_accept_only_lark_sentences(grammar, seed):
    try:
        with deadline(20):  # bounded: a drawn grammar that would compile for minutes is refused like a large one
            auto = build_automaton(load_lark(grammar), max_depth=2, max_states=20_000)
    except GrammarError:
        assume(False)  # empty language, refused left recursion, ...: covered by test_grammar_errors
    parser = lark.Lark(grammar, parser="earley", lexer="dynamic_complete")
    for text in random_sentences(auto, np.random.default_rng(seed), 8):
        parser.parse(text.decode())


def _check_sample(name: str, depth: int) -> None:
    grammar = GRAMMARS[name]
    auto = build_automaton(load_lark(grammar), max_depth=depth, max_states=200_000)
    state = 1
    for b in DOCS[name].encode():
        state = int(auto.trans_sb[state, b])
    assert auto.accept_s[state], name
    parser = lark.Lark(grammar, parser="earley", lexer="dynamic_complete")
    for text in random_sentences(auto, np.random.default_rng(0), 10, max_len=60):
        parser.parse(text.decode())


@pytest.mark.parametrize(("name", "depth"), [("json", 3), ("arith", 4)])  # the documents' nesting depths
def test_sample_grammars_accept_their_documents_and_random_sentences_parse(name, depth):
    _check_sample(name, depth)


@pytest.mark.slow
def test_sql_sample_document():
    _check_sample("sql", 3)  # its select items nest expressions 3 deep (~15 s)
