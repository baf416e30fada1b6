"""EAGLE-2 dynamic draft trees (Li et al. 2024) with static shapes: expand, keep the best, re-rank.

A node's score is the draft's cumulative log-probability of its path from the root (the last
committed token) — EAGLE-2's estimate of the chance the whole path is accepted. Drafting grows a
candidate *pool* depth by depth:

  depth 1: the top-K tokens after the root (K = top_k);
  depth d+1: the K best-scoring depth-d nodes (the *frontier*) are expanded by the draft, each
    into its top-K children: K·K new candidates, all of which join the pool.

Then the `budget` best-scoring pool entries become the tree (re-ranking). Because a child's score
is its parent's plus a log-probability <= 0, and ties are broken towards the earlier (shallower)
pool entry, every chosen node's parent is chosen too, and ranks before it: the best-first order
is topological, as `Draft` requires (parent -1 = the root, else an earlier node).

Everything here is pure and shape-static: pool size = K + (depth-1)·K², known at trace time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models import layers


@struct.dataclass
class Pool:
    """Candidates collected so far (P entries per row, depth-major).

    Attributes:
      tokens_bp: draft-vocabulary index of each candidate's token.
      parent_bp: pool index of its parent, -1 for children of the root.
      score_bp: cumulative log-probability of its path.
      depth_bp: 1 for children of the root.
    """

    tokens_bp: jax.Array
    parent_bp: jax.Array
    score_bp: jax.Array
    depth_bp: jax.Array

    @property
    def size(self) -> int:
        return self.tokens_bp.shape[1]


def pool_size(depth: int, top_k: int) -> int:
    """Candidates a dynamic tree of this depth and top-k collects."""
    return top_k + (depth - 1) * top_k * top_k


def top_log_probs(logits_xv: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """(log-probabilities, indices) of the top-K entries of each row of logits.

    top_k on the raw logits, then minus logsumexp: no [.., V] log-softmax is materialised (V is
    up to 262,144 here).
    """
    top_xk, idx_xk = layers.top_k(logits_xv, top_k)
    return top_xk - jax.nn.logsumexp(logits_xv, axis=-1, keepdims=True), idx_xk


def root_pool(logits_bv: jax.Array, top_k: int) -> Pool:
    """Depth 1: the top-K tokens after the root, scored by their log-probability (logits need not be normalised)."""
    score_bk, tok_bk = top_log_probs(logits_bv, top_k)
    b = logits_bv.shape[0]
    return Pool(tokens_bp=tok_bk.astype(jnp.int32), parent_bp=jnp.full((b, top_k), -1, jnp.int32),
                score_bp=score_bk, depth_bp=jnp.ones((b, top_k), jnp.int32))


def expand(pool: Pool, frontier_bf: jax.Array, logits_bfv: jax.Array, top_k: int) -> tuple[Pool, jax.Array]:
    """Adds the top-K children of every frontier node to the pool.

    Args:
      pool: the pool so far (P entries).
      frontier_bf: pool indices of the F nodes that were just run through the draft.
      logits_bfv: the draft's logits (or log-probabilities) after each of them [B, F, V].
      top_k: children per node.

    Returns:
      (pool with P + F·K entries, pool indices [B, F·K] of the new children).
    """
    b, f, _ = logits_bfv.shape
    child_lp_bfk, child_tok_bfk = top_log_probs(logits_bfv, top_k)
    parent_score_bf = jnp.take_along_axis(pool.score_bp, frontier_bf, axis=1)
    parent_depth_bf = jnp.take_along_axis(pool.depth_bp, frontier_bf, axis=1)
    new = Pool(
        tokens_bp=child_tok_bfk.reshape(b, f * top_k).astype(jnp.int32),
        parent_bp=jnp.repeat(frontier_bf, top_k, axis=1).astype(jnp.int32),
        score_bp=(parent_score_bf[:, :, None] + child_lp_bfk).reshape(b, f * top_k),
        depth_bp=jnp.repeat(parent_depth_bf + 1, top_k, axis=1),
    )
    start = pool.size
    merged = jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=1), pool, new)
    return merged, start + jnp.broadcast_to(jnp.arange(f * top_k, dtype=jnp.int32), (b, f * top_k))


def best(score_bc: jax.Array, n: int) -> jax.Array:
    """Positions of the n highest scores per row; ties go to the earlier position (stable sort)."""
    return jnp.argsort(-score_bc, axis=1, stable=True)[:, :n].astype(jnp.int32)


def select_frontier(pool: Pool, children_bc: jax.Array, top_k: int) -> jax.Array:
    """Pool indices of the top-K scoring nodes among the given (newest) children."""
    score_bc = jnp.take_along_axis(pool.score_bp, children_bc, axis=1)
    return jnp.take_along_axis(children_bc, best(score_bc, top_k), axis=1)


@struct.dataclass
class Tree:
    """The chosen tree, topologically ordered (N nodes per row).

    Attributes:
      tokens_bn: draft-vocabulary index of each node's token.
      parent_bn: tree index of each node's parent, -1 for the root's children.
      score_bn: cumulative log-probability of each node's path.
      depth_bn: 1 for the root's children.
    """

    tokens_bn: jax.Array
    parent_bn: jax.Array
    score_bn: jax.Array
    depth_bn: jax.Array


def select_tree(pool: Pool, budget: int) -> Tree:
    """The `budget` best-scoring pool entries as a tree (EAGLE-2 re-ranking), best first.

    Best-first is a topological order: a parent scores at least as high as its child and, on a
    tie, comes first (it is earlier in the pool and `best` is stable). So a prefix of the nodes is
    itself a tree — the most likely one of its size — which is what lets `len_b` cut a tree short
    by confidence.
    """
    b, p = pool.tokens_bp.shape
    chosen_bn = best(pool.score_bp, budget)
    tree_index_bp = jnp.full((b, p), -1, jnp.int32).at[jnp.arange(b)[:, None], chosen_bn].set(
        jnp.broadcast_to(jnp.arange(budget, dtype=jnp.int32), (b, budget)))
    pool_parent_bn = jnp.take_along_axis(pool.parent_bp, chosen_bn, axis=1)
    parent_bn = jnp.where(pool_parent_bn < 0, -1,
                          jnp.take_along_axis(tree_index_bp, jnp.maximum(pool_parent_bn, 0), axis=1))
    take = lambda x_bp: jnp.take_along_axis(x_bp, chosen_bn, axis=1)
    return Tree(tokens_bn=take(pool.tokens_bp), parent_bn=parent_bn, score_bn=take(pool.score_bp),
                depth_bn=take(pool.depth_bp))


def slot_mask(anc_bfm: jax.Array, start_b: jax.Array, num_slots: int) -> jax.Array:
    """Cache visibility [B, F, S] for frontier queries whose ancestors sit in a tree region of the cache.

    Slots below start_b are committed context (visible to all); slot start_b + m is the m-th
    tree slot, visible to frontier node f iff anc_bfm[b, f, m] (its ancestors and itself);
    slots past the tree region are stale.
    """
    m = anc_bfm.shape[2]
    j_bs = jnp.arange(num_slots)[None, :] - start_b[:, None]
    in_tree_bs = (j_bs >= 0) & (j_bs < m)
    j_clip_bfs = jnp.broadcast_to(jnp.clip(j_bs, 0, m - 1)[:, None, :], (*anc_bfm.shape[:2], num_slots))
    tree_vis_bfs = jnp.take_along_axis(anc_bfm, j_clip_bfs, axis=2)
    return (j_bs < 0)[:, None, :] | (in_tree_bs[:, None, :] & tree_vis_bfs)
