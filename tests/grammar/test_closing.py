"""The closing tables (`specjax.grammar.closing`) against a brute-force search on random byte DFAs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.grammar.closing import UNREACHABLE, byte_tokens, closing_tables

BYTES = (ord("a"), ord("b"), ord("c"), ord("}"))  # the DFAs below only use these


def brute_force_dist(trans_sb, accept_s, usable):
    """Fewest usable bytes from each state to an accepting one, by value iteration."""
    n = trans_sb.shape[0]
    dist = np.where(accept_s, 0, UNREACHABLE).astype(np.int64)
    dist[0] = UNREACHABLE
    for _ in range(n):
        for s in range(1, n):
            for b in usable:
                t = trans_sb[s, b]
                if t and dist[t] < UNREACHABLE:
                    dist[s] = min(dist[s], dist[t] + 1)
    return dist


@st.composite
def dfas(draw):
    n = draw(st.integers(2, 9))
    trans = np.zeros((n, 256), np.int32)
    for s in range(1, n):
        for b in BYTES:
            trans[s, b] = draw(st.integers(0, n - 1))
    accept = np.array([False] + [draw(st.booleans()) for _ in range(n - 1)])
    usable = draw(st.lists(st.sampled_from(BYTES), min_size=1, max_size=4, unique=True))
    return trans, accept, sorted(usable)


@settings(max_examples=60, deadline=None)
@given(dfas())
def test_distances_and_closing_tokens_match_a_brute_force_search(dfa):
    trans, accept, usable = dfa
    byte_token = np.full(256, -1, np.int32)
    byte_token[usable] = 100 + np.asarray(usable)  # token id = 100 + byte
    dist, close = closing_tables(trans, accept, byte_token)
    assert dist.tolist() == brute_force_dist(trans, accept, usable).tolist()
    for s in range(trans.shape[0]):
        if dist[s] in (0, UNREACHABLE):
            assert close[s] == -1  # accepting (EOS closes it), dead or without a way out
        else:
            byte = int(close[s]) - 100
            assert byte in usable and dist[trans[s, byte]] == dist[s] - 1  # one step down the shortest way


def test_byte_tokens_take_the_lowest_text_token_of_each_byte():
    bytes_vl = np.array([[0, 0], [ord("a"), 0], [ord("a"), ord("b")], [ord("b"), 0], [ord("a"), 0], [ord("c"), 0]],
                        np.uint8)
    length_v = np.array([0, 1, 2, 1, 1, 1])
    kind_v = np.array([1, 0, 0, 0, 0, 2])  # token 0 EOS, token 5 special (never emitted)
    out = byte_tokens(bytes_vl, length_v, kind_v)
    assert (out[ord("a")], out[ord("b")], out[ord("c")]) == (1, 3, -1)
    assert (out >= 0).sum() == 2


def test_no_accepting_state_leaves_everything_unreachable():
    trans = np.zeros((3, 256), np.int32)
    trans[1, ord("a")] = 2
    dist, close = closing_tables(trans, np.zeros(3, bool), byte_tokens(
        np.array([[ord("a")]], np.uint8), np.array([1]), np.array([0])))
    assert (dist == UNREACHABLE).all() and (close == -1).all()
