"""Training losses on logits and features: knowledge distillation, Medusa-1, EAGLE.

Every function returns per-row values (sums are taken by the caller with the loss mask), so
gradient accumulation and data parallelism can weight every token equally. Rows are flattened
tokens: `_nv` is [rows, vocab], `_nd` is [rows, features].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_n(logits_nv: jax.Array, labels_n: jax.Array) -> jax.Array:
    """-log softmax(logits)[label] per row, in float32."""
    logp_nv = jax.nn.log_softmax(logits_nv.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp_nv, labels_n[:, None], axis=-1)[:, 0]


def kl_n(teacher_logits_nv: jax.Array, student_logits_nv: jax.Array, temperature: float) -> jax.Array:
    """KL(teacher ‖ student) per row, both distributions softened by `temperature`."""
    t_logp = jax.nn.log_softmax(teacher_logits_nv.astype(jnp.float32) / temperature, axis=-1)
    s_logp = jax.nn.log_softmax(student_logits_nv.astype(jnp.float32) / temperature, axis=-1)
    return jnp.sum(jnp.exp(t_logp) * (t_logp - s_logp), axis=-1)


def kd_n(
    student_logits_nv: jax.Array,
    teacher_logits_nv: jax.Array,
    labels_n: jax.Array,
    temperature: float,
    kl_weight: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Distillation loss per row: kl_weight · T² · KL(teacher_T ‖ student_T) + (1 - kl_weight) · CE.

    The T² factor (Hinton et al.) keeps the KL gradient's scale independent of the temperature.

    Returns:
      (loss_n, kl_n, ce_n).
    """
    kl = kl_n(teacher_logits_nv, student_logits_nv, temperature)
    ce = cross_entropy_n(student_logits_nv, labels_n)
    return kl_weight * temperature**2 * kl + (1.0 - kl_weight) * ce, kl, ce


def rank_below_n(logits_nv: jax.Array, labels_n: jax.Array, k: int) -> jax.Array:
    """1.0 where the label is among the k highest logits (ties counted in the label's favour)."""
    label_logit_n = jnp.take_along_axis(logits_nv, labels_n[:, None], axis=-1)
    higher_n = jnp.sum(logits_nv > label_logit_n, axis=-1)
    return (higher_n < k).astype(jnp.float32)


def medusa_weights(n_heads: int, decay: float) -> jax.Array:
    """Head k (1-based) weighs decay**(k-1), as in Medusa-1's λ_k schedule."""
    return decay ** jnp.arange(n_heads, dtype=jnp.float32)


def medusa_targets(tokens_bt: jax.Array, mask_bt: jax.Array, n_heads: int) -> tuple[jax.Array, jax.Array]:
    """Shifted targets of every head: head k (1-based) at position t predicts token t + k + 1.

    The base LM head predicts t + 1; Medusa head k looks k tokens further. Positions whose target
    falls past the row, or whose target token is not a loss token, are masked.

    Returns:
      (labels_kbt, valid_kbt) with valid_kbt float32.
    """
    b, t = tokens_bt.shape
    pad = jnp.zeros((b, n_heads + 1), tokens_bt.dtype)
    tok_ext = jnp.concatenate([tokens_bt, pad], axis=1)
    # mask_bt[b, t] says that token t+1 is a loss target; target t + k + 1 is valid when the
    # mask at t + k says so (mask_ext is zero past the row).
    mask_ext = jnp.concatenate([mask_bt.astype(jnp.float32), jnp.zeros((b, n_heads + 1))], axis=1)
    labels = jnp.stack([jax.lax.dynamic_slice_in_dim(tok_ext, k + 2, t, axis=1) for k in range(n_heads)])
    valid = jnp.stack([jax.lax.dynamic_slice_in_dim(mask_ext, k + 1, t, axis=1) for k in range(n_heads)])
    return labels, valid


def smooth_l1_n(pred_nd: jax.Array, target_nd: jax.Array, beta: float = 1.0) -> jax.Array:
    """Mean over features of the smooth-L1 (Huber / beta) distance, as EAGLE's regression loss."""
    diff = jnp.abs(pred_nd.astype(jnp.float32) - target_nd.astype(jnp.float32))
    per = jnp.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta)
    return jnp.mean(per, axis=-1)


def eagle_n(
    pred_feat_nd: jax.Array,
    target_feat_nd: jax.Array,
    logits_nv: jax.Array,
    labels_n: jax.Array,
    label_valid_n: jax.Array,
    feature_weight: float,
    ce_weight: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """EAGLE loss per row: feature_weight · smoothL1(f̂, f) + ce_weight · CE(head(f̂), label).

    `logits_nv` are the frozen head's logits of the predicted features (over the reduced draft
    vocabulary when one is used); rows whose label is outside that vocabulary have
    label_valid_n = 0 and contribute only the regression term.

    Returns:
      (loss_n, regression_n, ce_n) with ce_n zero where the label is not valid.
    """
    reg = smooth_l1_n(pred_feat_nd, target_feat_nd)
    ce = cross_entropy_n(logits_nv, jnp.where(label_valid_n > 0, labels_n, 0)) * label_valid_n
    return feature_weight * reg + ce_weight * ce, reg, ce
