"""Verification of a draft (chain or token tree) against the target's logits: pure, jittable functions.

One target forward over the block [last, d_1 … d_k] gives logits at k+1 positions: row i
(0-based) is the target's next-token distribution after d_1 … d_i. Verification walks the
chain: draft token d_{i+1} is checked against position i; the first rejected position
gets a replacement token from the target, and when every draft token is accepted the
target's prediction at position k is a free "bonus" token. A round therefore always emits
accepted + 1 tokens, at least one — never worse than plain decoding per target forward.

Both functions return (accepted_b, tokens_bt): `accepted_b` in 0..k and the emitted
tokens `tokens_bt[:, :accepted_b + 1]` (columns past that are unspecified filler).
Draft positions at or beyond a row's `draft_len_b` are never accepted: the row emits the
target's own token there, exactly as plain decoding would.

Token trees (`tree.py`) generalise the chain: block row 1 + j is node j, whose token is
checked against the target at its parent's row. The tree functions also return `path_bk`,
the accepted node at each depth, so the caller can compact the cache and gather hidden states.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode.sampling import filter_logits, sample_weights
from specjax.decode.spec import trees as tree_lib


def _accepted_prefix(ok_bk: jax.Array) -> jax.Array:
    """Length of the all-True prefix of each row (a chain stops at its first rejection)."""
    return jnp.sum(jnp.cumprod(ok_bk.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def greedy_verify(target_bt: jax.Array, draft_bk: jax.Array, draft_len_b: jax.Array):
    """Accepts the longest draft prefix equal to the target's argmax.

    Since accepted draft tokens equal the argmax, the emitted tokens are simply the
    argmax at positions 0 … accepted: the prefix, then the correction (or the bonus).

    Args:
      target_bt: the target's argmax [B, k+1] over the block [last, d_1 … d_k] (int32;
        `Transformer.greedy_tokens`, or the argmax of masked logits).
      draft_bk: draft tokens [B, k].
      draft_len_b: real proposals per row (0..k).

    Returns:
      (accepted_b [B], tokens_bt [B, k+1]).
    """
    k = draft_bk.shape[1]
    ok_bk = (draft_bk == target_bt[:, :k]) & (jnp.arange(k)[None, :] < draft_len_b[:, None])
    return _accepted_prefix(ok_bk), target_bt


def target_probs(target_logits_btv: jax.Array, temperature, top_k: int, top_p) -> jax.Array:
    """p [B, T, V]: the distribution plain sampling would draw from at each position.

    Uses the very `filter_logits` of `sample`, so temperature / top-k / top-p act exactly as
    in the plain loop — the precondition for the speculative output to be distributed like it.
    """
    b, t, v = target_logits_btv.shape
    x_nv = filter_logits(target_logits_btv.reshape(b * t, v), temperature, top_k, top_p)
    return jax.nn.softmax(x_nv, axis=-1).reshape(b, t, v)


def sampling_verify(
    target_logits_btv: jax.Array,
    draft_bk: jax.Array,
    draft_len_b: jax.Array,
    key: jax.Array,
    temperature,
    top_k: int,
    top_p,
    q_probs_bkv: jax.Array | None = None,
):
    """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023) along a chain.

    Draft token x at position i is accepted with probability min(1, p_i(x) / q_i(x)); at the
    first rejection the token is drawn from the residual norm(max(p_i - q_i, 0)). Then each
    emitted token is distributed exactly as a sample from p_i: P(x) = min(q, p) + (1 - Σ
    min(q, p)) · max(p - q, 0) / Σ max(p - q, 0) = p(x), since Σ max(p - q, 0) = 1 - Σ min(q, p).
    With a deterministic draft (q_probs_bkv None: q = point mass on x) this is "accept with
    probability p(x), else sample from p with x removed and renormalised". Positions past a
    row's draft_len sample from p directly (nothing was proposed there), as does the bonus
    position k.

    Args:
      target_logits_btv: target logits [B, k+1, V]; draft_bk [B, k]; draft_len_b [B].
      key: PRNG key of this round.
      temperature, top_k, top_p: as in `sampling.filter_logits` (temperature > 0).
      q_probs_bkv: draft distribution [B, k, V] (already filtered the same way), or None.

    Returns:
      (accepted_b [B], tokens_bt [B, k+1]).
    """
    b, t, v = target_logits_btv.shape
    k = t - 1
    p_btv = target_probs(target_logits_btv, temperature, top_k, top_p)
    p_x_bk = jnp.take_along_axis(p_btv[:, :k], draft_bk[..., None], axis=-1)[..., 0]
    q_x_bk = (jnp.ones_like(p_x_bk) if q_probs_bkv is None
              else jnp.take_along_axis(q_probs_bkv, draft_bk[..., None], axis=-1)[..., 0])
    key_u, key_c = jax.random.split(key)
    u_bk = jax.random.uniform(key_u, (b, k))
    # u < min(1, p/q) written without the division (q may be 0 at placeholder positions).
    drafted_bk = jnp.arange(k)[None, :] < draft_len_b[:, None]
    accepted_b = _accepted_prefix(drafted_bk & (u_bk * q_x_bk < p_x_bk))

    # One replacement per row, at its first rejection (j < len: the residual; with a point-mass q that
    # is p with the draft token removed) or past its draft (p itself; j = k is the bonus). Only that
    # row of the vocabulary is touched: B rows, not B·(k+1).
    j_b = accepted_b
    p_bv = jnp.take_along_axis(p_btv, j_b[:, None, None], axis=1)[:, 0]
    rejected_b1 = (j_b < draft_len_b)[:, None]
    j_draft_b = jnp.minimum(j_b, k - 1)
    if q_probs_bkv is None:
        x_b = jnp.take_along_axis(draft_bk, j_draft_b[:, None], axis=1)
        resid_bv = jnp.where(jnp.arange(v)[None, :] == x_b, 0.0, p_bv)
    else:
        resid_bv = jnp.maximum(p_bv - jnp.take_along_axis(q_probs_bkv, j_draft_b[:, None, None], axis=1)[:, 0], 0.0)
    dist_bv = jnp.where(rejected_b1, resid_bv, p_bv)
    # The residual is empty only when p == q, where rejection has probability zero; falling
    # back to p there only guards against rounding.
    dist_bv = jnp.where(jnp.sum(dist_bv, axis=-1, keepdims=True) <= 0, p_bv, dist_bv)
    replace_b = sample_weights(key_c, dist_bv)
    draft_bt = jnp.pad(draft_bk, ((0, 0), (0, 1)))
    tokens_bt = jnp.where(jnp.arange(t)[None, :] < accepted_b[:, None], draft_bt, replace_b[:, None])
    return accepted_b, tokens_bt


# ------------------------------------------------------------------------------------------- trees
def _deepest_path(acc_bk: jax.Array, anc_bkk: jax.Array, depth_bk: jax.Array):
    """(accepted_b, path_bk) for the deepest accepted node (ties: lowest index).

    path_bk[b, d] is the node at depth d + 1 on the path to it; -1 past the path.
    """
    k = acc_bk.shape[1]
    score_bk = jnp.where(acc_bk, depth_bk, 0)
    best_b = jnp.argmax(score_bk, axis=1)  # first maximum: the lowest index among equally deep nodes
    accepted_b = jnp.max(score_bk, axis=1).astype(jnp.int32)
    on_bk = jnp.take_along_axis(anc_bkk, best_b[:, None, None], axis=1)[:, 0] & (accepted_b > 0)[:, None]
    sel_bdk = on_bk[:, None, :] & (depth_bk[:, None, :] == jnp.arange(1, k + 1)[None, :, None])
    path_bk = jnp.where(jnp.any(sel_bdk, axis=-1), jnp.argmax(sel_bdk, axis=-1), -1).astype(jnp.int32)
    return accepted_b, path_bk


def tree_greedy_verify(target_bt: jax.Array, draft_bk: jax.Array, parent_bk: jax.Array,
                       draft_len_b: jax.Array):
    """Greedy verification of a token tree: the deepest path that the target's argmax follows.

    Node j is accepted iff j < draft_len, its token equals the target's argmax at its parent's
    block row, and its parent is accepted (the root always is). The round emits the path's
    tokens, then the argmax at the path's last node (the bonus / correction) — i.e. the argmax
    at the block rows [0, 1 + path…], exactly what plain greedy decoding would emit.

    Args:
      target_bt: the target's argmax [B, k+1] over the block [last, node_0 … node_{k-1}].
      draft_bk: node tokens [B, k]; parent_bk: node parents [B, k] (-1: the root).
      draft_len_b: real nodes per row (nodes j >= draft_len_b are never accepted).

    Returns:
      (accepted_b [B], tokens_bt [B, k+1], path_bk [B, k]).
    """
    k = draft_bk.shape[1]
    anc_bkk = tree_lib.ancestor_mask(parent_bk)
    want_bk = jnp.take_along_axis(target_bt, tree_lib.sanitize_parents(parent_bk) + 1, axis=1)
    ok_bk = (draft_bk == want_bk) & (jnp.arange(k)[None, :] < draft_len_b[:, None])
    acc_bk = jnp.all(~anc_bkk | ok_bk[:, None, :], axis=-1)  # every ancestor-or-self matches
    accepted_b, path_bk = _deepest_path(acc_bk, anc_bkk, tree_lib.depths(anc_bkk))
    tokens_bt = jnp.take_along_axis(target_bt, tree_lib.path_rows(path_bk, accepted_b), axis=1)
    return accepted_b, tokens_bt, path_bk


def tree_sampling_verify(
    target_logits_btv: jax.Array,
    draft_bk: jax.Array,
    parent_bk: jax.Array,
    draft_len_b: jax.Array,
    key: jax.Array,
    temperature,
    top_k: int,
    top_p,
    q_probs_bkv: jax.Array | None = None,
):
    """Lossless multi-candidate speculative sampling over a token tree (SpecInfer / EAGLE).

    Recursive rejection, starting at the root with p' = p(root row): the current node's
    children are tried in index order; child x (drawn from q) is accepted with probability
    min(1, p'(x) / q(x)), and the walk moves to it (p' = p at its row); on rejection
    p' ← norm(max(p' − q, 0)). When every child is rejected (or there are none) the round
    ends with a token drawn from p'. Each rejection step is the chain rule of
    `sampling_verify` with target p', so the emitted token is distributed as p at every depth.

    Deterministic candidates (q_probs_bkv None: q = point mass, as top-k trees give) make this
    "accept x with probability p'(x); on rejection zero x in p' and renormalise" — computed
    without any [V]-wide work per node (a token proposed twice under one parent is accepted at
    most once: its second copy has p'(x) = 0). Sampled candidates need q per node (independent
    draws, e.g. siblings sampled i.i.d. from their parent's q) and carry p' over the vocabulary.

    Args:
      target_logits_btv: [B, k+1, V]; draft_bk, parent_bk: [B, k]; draft_len_b: [B].
      key: PRNG key of this round.
      temperature, top_k, top_p: as in `target_probs` (temperature > 0).
      q_probs_bkv: [B, k, V] distribution each node's token was drawn from, or None.

    Returns:
      (accepted_b [B], tokens_bt [B, k+1], path_bk [B, k]).
    """
    b, t, v = target_logits_btv.shape
    k = t - 1
    p_btv = target_probs(target_logits_btv, temperature, top_k, top_p)
    parent_bk = tree_lib.sanitize_parents(parent_bk)
    key_u, key_c = jax.random.split(key)
    u_kb = jax.random.uniform(key_u, (k, b))
    valid_kb = (jnp.arange(k)[:, None] < draft_len_b[None, :])
    if q_probs_bkv is None:
        cur_b, path_bk, accepted_b, final_bv = _walk_point_masses(p_btv, draft_bk, parent_bk, valid_kb, u_kb)
    else:
        cur_b, path_bk, accepted_b, final_bv = _walk_sampled(p_btv, draft_bk, parent_bk, valid_kb, u_kb, q_probs_bkv)
    # The residual is empty only when it had probability zero of being reached; p guards rounding.
    p_cur_bv = jnp.take_along_axis(p_btv, (cur_b + 1)[:, None, None], axis=1)[:, 0]
    final_bv = jnp.where(jnp.sum(final_bv, axis=-1, keepdims=True) <= 0, p_cur_bv, final_bv)
    last_b = sample_weights(key_c, final_bv)
    path_tok_bk = jnp.take_along_axis(draft_bk, jnp.maximum(path_bk, 0), axis=1)
    tokens_bt = jnp.where(jnp.arange(t)[None, :] < accepted_b[:, None], jnp.pad(path_tok_bk, ((0, 0), (0, 1))),
                          last_b[:, None])
    return accepted_b, tokens_bt.astype(jnp.int32), path_bk


def _walk_point_masses(p_btv, draft_bk, parent_bk, valid_kb, u_kb):
    """The recursive walk for point-mass candidates, one node per scan step in index order.

    Topological order makes one pass enough: a node is tested iff its parent is the walk's
    current node (its earlier siblings were rejected, later ones are then skipped). The carry
    is small: the current node, the siblings rejected under it and the mass they removed.
    """
    b, t, v = p_btv.shape
    k = t - 1
    # p(x_j) at the parent's row, for every node: a [B, k] gather from the flattened block.
    flat_bk = (parent_bk + 1) * v + draft_bk
    px_kb = jnp.take_along_axis(p_btv.reshape(b, t * v), flat_bk, axis=1).T

    def step(carry, xs):
        cur_b, rej_bk, removed_b, path_bk, acc_b = carry
        j, tok_b, par_b, px_b, u_b, valid_b = xs
        test_b = valid_b & (par_b == cur_b)
        dup_b = jnp.any(rej_bk & (draft_bk == tok_b[:, None]), axis=1)
        px_b = jnp.where(dup_b, 0.0, px_b)
        # u < p'(x) = p(x) / (1 - removed), without the division.
        accept_b = test_b & (u_b * (1.0 - removed_b) < px_b)
        reject_b = test_b & ~accept_b
        path_bk = path_bk.at[jnp.arange(b), jnp.where(accept_b, acc_b, k)].set(j, mode="drop")
        rej_bk = jnp.where(accept_b[:, None], False, rej_bk | (reject_b[:, None] & (jnp.arange(k) == j)[None, :]))
        removed_b = jnp.where(accept_b, 0.0, removed_b + jnp.where(reject_b, px_b, 0.0))
        cur_b = jnp.where(accept_b, j, cur_b)
        return (cur_b, rej_bk, removed_b, path_bk, acc_b + accept_b.astype(jnp.int32)), None

    init = (jnp.full((b,), -1, jnp.int32), jnp.zeros((b, k), bool), jnp.zeros((b,), p_btv.dtype),
            jnp.full((b, k), -1, jnp.int32), jnp.zeros((b,), jnp.int32))
    xs = (jnp.arange(k, dtype=jnp.int32), draft_bk.T, parent_bk.T, px_kb, u_kb, valid_kb)
    (cur_b, rej_bk, _, path_bk, acc_b), _ = jax.lax.scan(step, init, xs)
    # p' at the end: the current node's row with its rejected children's tokens zeroed.
    final_bv = jnp.take_along_axis(p_btv, (cur_b + 1)[:, None, None], axis=1)[:, 0]
    zero_bk = jnp.where(rej_bk, draft_bk, v)  # v: out of range, dropped
    final_bv = final_bv.at[jnp.arange(b)[:, None], zero_bk].set(0.0, mode="drop")
    return cur_b, path_bk, acc_b, final_bv


def _walk_sampled(p_btv, draft_bk, parent_bk, valid_kb, u_kb, q_bkv):
    """The recursive walk for sampled candidates: p' is carried over the vocabulary."""
    b, t, v = p_btv.shape
    k = t - 1

    def step(carry, xs):
        cur_b, resid_bv, path_bk, acc_b = carry
        j, tok_b, par_b, u_b, valid_b = xs
        test_b = valid_b & (par_b == cur_b)
        q_bv = jax.lax.dynamic_index_in_dim(q_bkv, j, axis=1, keepdims=False)
        px_b = jnp.take_along_axis(resid_bv, tok_b[:, None], axis=1)[:, 0]
        qx_b = jnp.take_along_axis(q_bv, tok_b[:, None], axis=1)[:, 0]
        accept_b = test_b & (u_b * qx_b < px_b)
        reject_b = test_b & ~accept_b
        left_bv = jnp.maximum(resid_bv - q_bv, 0.0)
        mass_b1 = jnp.sum(left_bv, axis=-1, keepdims=True)
        left_bv = jnp.where(mass_b1 > 0, left_bv / jnp.where(mass_b1 > 0, mass_b1, 1.0), resid_bv)
        p_next_bv = jax.lax.dynamic_index_in_dim(p_btv, j + 1, axis=1, keepdims=False)
        resid_bv = jnp.where(accept_b[:, None], p_next_bv, jnp.where(reject_b[:, None], left_bv, resid_bv))
        path_bk = path_bk.at[jnp.arange(b), jnp.where(accept_b, acc_b, k)].set(j, mode="drop")
        cur_b = jnp.where(accept_b, j, cur_b)
        return (cur_b, resid_bv, path_bk, acc_b + accept_b.astype(jnp.int32)), None

    init = (jnp.full((b,), -1, jnp.int32), p_btv[:, 0], jnp.full((b, k), -1, jnp.int32), jnp.zeros((b,), jnp.int32))
    xs = (jnp.arange(k, dtype=jnp.int32), draft_bk.T, parent_bk.T, u_kb, valid_kb)
    (cur_b, resid_bv, path_bk, acc_b), _ = jax.lax.scan(step, init, xs)
    return cur_b, path_bk, acc_b, resid_bv
