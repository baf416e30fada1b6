"""Moore minimisation (`_dfa.minimize`) against a plain Python refinement on random DFAs, hash collisions included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.grammar import _dfa


def _naive_blocks(trans: np.ndarray, accept: np.ndarray) -> tuple[list[int], int]:
    """Moore refinement with tuples: -1 (reject) is one extra sink state. (block per state, blocks with the sink's)"""
    n = len(accept)
    part = [int(a) for a in accept] + [2]
    succ = [[int(x) if x >= 0 else n for x in row] for row in trans] + [[n] * trans.shape[1]]
    while True:
        sigs = [(part[q], *(part[x] for x in succ[q])) for q in range(n + 1)]
        ids = {s: i for i, s in enumerate(dict.fromkeys(sigs))}
        new = [ids[s] for s in sigs]
        if len(set(new)) == len(set(part)):
            return new[:n], len(set(new))
        part = new


def _same_partition(a, b) -> bool:
    pairs = set(zip(a, b, strict=True))
    return len(pairs) == len(set(a)) == len(set(b))


dfas = st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**16))


def _random_dfa(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    trans = np.where(rng.random((n, k)) < 0.8, rng.integers(0, n, (n, k)), -1).astype(np.int32)
    return trans, rng.random(n) < 0.3


@settings(deadline=None, max_examples=80)
@given(dfas)
def test_minimize_equals_plain_refinement(spec):
    trans, accept = _random_dfa(*spec)
    block, count = _dfa.minimize(trans, accept)
    want, want_count = _naive_blocks(trans, accept)
    assert count == want_count and _same_partition(list(block), want)


@pytest.mark.parametrize("seed", range(5))
def test_a_colliding_hash_falls_back_to_the_exact_rounds(monkeypatch, seed):
    # Every row hashing alike merges everything: not a congruence, so minimize must redo the rounds exactly.
    trans, accept = _random_dfa(30, 4, seed)
    real = _dfa._refine
    monkeypatch.setattr(_dfa, "_refine", lambda part, t, exact, absorbing=None: real(part, t, True) if exact
                        else np.zeros_like(part))
    block, count = _dfa.minimize(trans, accept)
    want, want_count = _naive_blocks(trans, accept)
    assert count == want_count and _same_partition(list(block), want)


def _exact_blocks(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """The exact rounds (`row_ids` comparing whole rows), the reference for larger automata."""
    n = len(accept)
    t = np.vstack([np.where(trans < 0, n, trans), np.full((1, trans.shape[1]), n)]).astype(np.int64)
    return _dfa._refine(np.append(accept.astype(np.int64), 2), t, exact=True)[:n]


@settings(deadline=None, max_examples=80)
@given(dfas)
def test_hashed_rounds_alone_equal_plain_refinement(spec):
    trans, accept = _random_dfa(*spec)
    n = len(accept)
    t = np.vstack([np.where(trans < 0, n, trans), np.full((1, trans.shape[1]), n)]).astype(np.int64)
    block = _dfa._refine(np.append(accept.astype(np.int64), 2), t, exact=False)
    want, _ = _naive_blocks(trans, accept)
    assert _same_partition(list(block[:n]), want)


@pytest.mark.parametrize(("n", "seed"), [(300, 0), (2000, 1), (5000, 2)])
def test_worklist_refinement_on_chains_equals_the_exact_rounds(n, seed):
    """Length counters (long chains whose states differ only by their distance to the end, the shape that made
    whole-table rounds slow), some with shortcuts and copies, against the exact whole-table rounds."""
    rng = np.random.default_rng(seed)
    trans = np.full((n, 4), -1, np.int32)
    trans[:-1, 0] = np.arange(1, n)  # the chain
    trans[:, 1] = np.arange(n)  # a self-loop: rows differ only through the chain
    jumps = rng.random(n) < 0.05
    trans[jumps, 2] = rng.integers(0, n, jumps.sum())
    trans[n // 2:, 3] = np.arange(n // 2, n)[::-1]  # a second chain in reverse over half the states
    accept = np.zeros(n, bool)
    accept[-1] = accept[n // 3] = True
    want = _exact_blocks(trans, accept)
    t = np.vstack([np.where(trans < 0, n, trans), np.full((1, 4), n)]).astype(np.int64)
    # The hashed rounds on their own (minimize would hide a wrong result behind its exact fallback).
    hashed = _dfa._refine(np.append(accept.astype(np.int64), 2), t, exact=False)[:n]
    assert _same_partition(list(hashed), list(want))
    assert _same_partition(list(_dfa.minimize(trans, accept)[0]), list(want))


def _naive_rounds(trans: np.ndarray, part: list[int], rounds: int) -> list[int]:
    """``rounds`` Moore rounds with tuples (every transition defined)."""
    for _ in range(rounds):
        sigs = [(part[q], *(part[x] for x in trans[q])) for q in range(len(part))]
        ids = {s: i for i, s in enumerate(dict.fromkeys(sigs))}
        part = [ids[s] for s in sigs]
    return part


@settings(deadline=None, max_examples=80)
@given(dfas, st.integers(0, 6))
def test_bounded_rounds_equal_plain_rounds(spec, rounds):
    # The mask tables' "alike after every string of at most L symbols" (tables._bounded_classes): stopping after
    # L rounds must give Moore's L-th partition, not the fixpoint.
    trans, accept = _random_dfa(*spec)
    t = np.where(trans < 0, 0, trans).astype(np.int64)
    t[0] = 0  # state 0 plays the dead state: absorbing, alone in its block
    start = [2] + [int(a) for a in accept[1:]]
    want = _naive_rounds(t, start, rounds)
    for absorbing in (None, 0):  # leaving the edges into the dead state out of the worklist changes nothing
        got = _dfa.refine_rounds(np.array(start, np.int64), t, rounds, absorbing)
        assert _same_partition(list(got), want)


def test_bounded_rounds_refuse_a_state_that_is_not_absorbing():
    t = np.array([[1], [0]], np.int64)
    with pytest.raises(ValueError, match="not absorbing"):
        _dfa.refine_rounds(np.array([0, 1], np.int64), t, 3, absorbing=0)


def test_bounded_rounds_compare_whole_rows_not_hashes(monkeypatch):
    # Every row hashing alike would merge everything: the bounded rounds never trust a hash.
    monkeypatch.setattr(_dfa, "_row_multipliers", lambda k: np.zeros(k, np.int64))
    trans, accept = _random_dfa(30, 4, 7)
    t = np.where(trans < 0, 0, trans).astype(np.int64)
    start = [int(a) for a in accept]
    got = _dfa.refine_rounds(np.array(start, np.int64), t, 5)
    assert _same_partition(list(got), _naive_rounds(t, start, 5))


def _accepts(dfa: _dfa.ByteDFA, word: tuple[int, ...]) -> bool:
    q = 0
    for b in word:
        q = int(dfa.trans[q, b])
        if q < 0:
            return False
    return bool(dfa.accept[q])


def _byte_dfa(n: int, k: int, seed: int) -> _dfa.ByteDFA:
    trans, accept = _random_dfa(n, k, seed)
    full = np.full((n, 256), -1, np.int32)
    full[:, :k] = trans
    return _dfa.ByteDFA(full, accept)


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 3), st.integers(0, 2**16))
def test_difference_accepts_what_a_accepts_and_b_does_not(na, nb, k, seed):
    """Every word up to length 5 over the bytes both use; the result is minimal with no dead states."""
    import itertools

    a, b = _byte_dfa(na, k, seed), _byte_dfa(nb, k, seed + 1)
    got = _dfa.difference(a, b)
    for n in range(6):
        for word in itertools.product(range(k), repeat=n):
            assert _accepts(got, word) == (_accepts(a, word) and not _accepts(b, word)), word
    assert len(set(_dfa.minimize(got.trans, got.accept)[0])) == len(got.accept)
    alive = _dfa.coreachable(got.trans, got.accept)
    assert alive[got.trans[got.trans >= 0]].all()
