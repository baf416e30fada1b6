"""Chain verification of a draft against the target's logits: pure, jittable functions.

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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode.sampling import filter_logits


def _accepted_prefix(ok_bk: jax.Array) -> jax.Array:
    """Length of the all-True prefix of each row (a chain stops at its first rejection)."""
    return jnp.sum(jnp.cumprod(ok_bk.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def greedy_verify(target_logits_btv: jax.Array, draft_bk: jax.Array, draft_len_b: jax.Array):
    """Accepts the longest draft prefix equal to the target's argmax.

    Since accepted draft tokens equal the argmax, the emitted tokens are simply the
    argmax at positions 0 … accepted: the prefix, then the correction (or the bonus).

    Args:
      target_logits_btv: target logits [B, k+1, V] over the block [last, d_1 … d_k].
      draft_bk: draft tokens [B, k].
      draft_len_b: real proposals per row (0..k).

    Returns:
      (accepted_b [B], tokens_bt [B, k+1]).
    """
    k = draft_bk.shape[1]
    target_bt = jnp.argmax(target_logits_btv, axis=-1).astype(jnp.int32)
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
    q_bkv = jax.nn.one_hot(draft_bk, v, dtype=p_btv.dtype) if q_probs_bkv is None else q_probs_bkv
    p_x_bk = jnp.take_along_axis(p_btv[:, :k], draft_bk[..., None], axis=-1)[..., 0]
    q_x_bk = jnp.take_along_axis(q_bkv, draft_bk[..., None], axis=-1)[..., 0]
    key_u, key_c = jax.random.split(key)
    u_bk = jax.random.uniform(key_u, (b, k))
    # u < min(1, p/q) written without the division (q may be 0 at placeholder positions).
    drafted_bk = jnp.arange(k)[None, :] < draft_len_b[:, None]
    accepted_b = _accepted_prefix(drafted_bk & (u_bk * q_x_bk < p_x_bk))

    # A candidate replacement at every position, then pick the one at the first rejection:
    # computing all k+1 is cheaper than a data-dependent gather of one distribution per row.
    resid_bkv = jnp.maximum(p_btv[:, :k] - q_bkv, 0.0)
    dist_bkv = jnp.where(drafted_bk[..., None], resid_bkv, p_btv[:, :k])
    dist_btv = jnp.concatenate([dist_bkv, p_btv[:, k:]], axis=1)
    # The residual is empty only when p == q, where rejection has probability zero; falling
    # back to p there only guards against rounding.
    empty_bt1 = jnp.sum(dist_btv, axis=-1, keepdims=True) <= 0
    dist_btv = jnp.where(empty_bt1, p_btv, dist_btv)
    replace_bt = jax.random.categorical(key_c, jnp.log(dist_btv), axis=-1).astype(jnp.int32)
    draft_bt = jnp.pad(draft_bk, ((0, 0), (0, 1)))
    tokens_bt = jnp.where(jnp.arange(t)[None, :] < accepted_b[:, None], draft_bt, replace_bt)
    return accepted_b, tokens_bt
