"""Stop-string automata against str.find on random token sequences."""

import jax.numpy as jnp
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.decode.stops import advance, build_stop_tables, truncate_at_stop

TOKENS = [b"ab", b"a", b"b", b"c", b"ba", "€".encode()[:2], "€".encode()[2:], b"", b"abab"]
STOPS = ("aba", "€", "cc")
TABLES = build_stop_tables(STOPS, TOKENS)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(TOKENS) - 1), min_size=1, max_size=10))
def test_automaton_matches_substring_search(seq):
    state = jnp.zeros((1, len(STOPS)), jnp.int32)
    text = b""
    for tok in seq:
        state, hit = advance(TABLES, state, jnp.array([tok]))
        text += TOKENS[tok]
        assert bool(hit[0]) == any(s.encode() in text for s in STOPS)


def test_no_stops_gives_no_tables():
    assert build_stop_tables((), TOKENS) is None
    assert build_stop_tables(("",), TOKENS) is None


def test_truncate_at_earliest_stop():
    assert truncate_at_stop("hello world. bye", (" bye", ".")) == ("hello world", True)
    assert truncate_at_stop("hello", ("x",)) == ("hello", False)
