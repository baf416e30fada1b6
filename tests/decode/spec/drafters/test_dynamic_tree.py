"""EAGLE-2 dynamic tree selection: pool growth, re-ranking, topological order, slot masks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode.spec.drafters import dynamic_tree as dt


@functools.partial(jax.jit, static_argnames=("depth", "top_k", "budget"))
def _grow(lp_bpv, depth, top_k, budget):
    """Pool and tree where the draft's log-probs after pool node p are lp_bpv[:, 1 + p] (row 0: the root)."""
    b = lp_bpv.shape[0]
    pool = dt.root_pool(lp_bpv[:, 0], top_k)
    frontier = jnp.broadcast_to(jnp.arange(top_k, dtype=jnp.int32), (b, top_k))
    for _ in range(1, depth):
        lp_bfv = jnp.take_along_axis(lp_bpv, 1 + frontier[:, :, None], axis=1)
        pool, children = dt.expand(pool, frontier, lp_bfv, top_k)
        frontier = dt.select_frontier(pool, children, top_k)
    return pool, dt.select_tree(pool, budget)


def _random_logp(b, depth, top_k, v, seed):
    x = np.random.default_rng(seed).normal(size=(b, 1 + dt.pool_size(depth, top_k), v)) * 3
    return jax.nn.log_softmax(jnp.asarray(x, jnp.float32), axis=-1)


@pytest.mark.parametrize("depth,top_k,budget", [(1, 4, 3), (3, 3, 10), (4, 2, 12)])
def test_tree_is_the_top_budget_of_the_pool_and_topologically_closed(depth, top_k, budget):
    pool, tree = _grow(_random_logp(3, depth, top_k, 20, depth), depth, top_k, budget)
    assert pool.size == dt.pool_size(depth, top_k)
    pool, tree = jax.device_get((pool, tree))
    for b in range(3):
        scores = np.asarray(pool.score_bp[b])
        expected = set(np.argsort(-scores, kind="stable")[:budget].tolist())
        parent = np.asarray(tree.parent_bn[b])
        assert sorted(np.asarray(tree.score_bn[b]).tolist(), reverse=True) == sorted(scores[list(expected)],
                                                                                    reverse=True)
        for j in range(budget):
            assert -1 <= parent[j] < j  # topological: parents first
            if parent[j] >= 0:
                assert tree.depth_bn[b, j] == tree.depth_bn[b, parent[j]] + 1
                assert tree.score_bn[b, j] <= tree.score_bn[b, parent[j]]
            else:
                assert tree.depth_bn[b, j] == 1


def test_scores_are_cumulative_log_probs_along_paths():
    lp = _random_logp(1, 3, 3, 12, 7)
    pool, _ = jax.device_get(_grow(lp, 3, 3, 1))
    for p in range(pool.size):
        parent = int(pool.parent_bp[0, p])
        tok = int(pool.tokens_bp[0, p])
        base = 0.0 if parent < 0 else float(pool.score_bp[0, parent])
        np.testing.assert_allclose(float(pool.score_bp[0, p]), base + float(lp[0, 1 + parent, tok]), rtol=1e-6)
    # Frontier selection expanded the best nodes: every depth-3 entry's parent is a top-3 depth-2 node.
    depth2 = [p for p in range(pool.size) if pool.depth_bp[0, p] == 2]
    best2 = sorted(depth2, key=lambda p: -float(pool.score_bp[0, p]))[:3]
    parents3 = {int(pool.parent_bp[0, p]) for p in range(pool.size) if pool.depth_bp[0, p] == 3}
    assert parents3 == set(best2)


def test_ties_keep_parents_before_children():
    """A certain child (log-prob 0) ties with its parent: the parent must still be chosen first."""
    lp = jnp.full((1, 7, 6), -1e9).at[:, :, 2].set(0.0)  # every node's only likely child is token 2
    _, tree = _grow(lp, 2, 2, 2)
    assert tree.parent_bn[0].tolist() == [-1, 0] and tree.tokens_bn[0].tolist() == [2, 2]


def test_slot_mask():
    anc = jnp.array([[[True, False, False], [True, True, False]]])  # 2 queries over 3 tree slots
    mask = dt.slot_mask(anc, jnp.array([2]), 6)
    assert mask[0].tolist() == [[True, True, True, False, False, False],
                                [True, True, True, True, False, False]]
