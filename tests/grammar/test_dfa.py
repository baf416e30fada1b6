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
    monkeypatch.setattr(_dfa, "_refine", lambda part, t, exact: real(part, t, True) if exact else np.zeros_like(part))
    block, count = _dfa.minimize(trans, accept)
    want, want_count = _naive_blocks(trans, accept)
    assert count == want_count and _same_partition(list(block), want)
