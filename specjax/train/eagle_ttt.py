"""Training-time test (EAGLE-3, Li et al. 2025): the EAGLE head trained on its own predicted features.

At inference the head drafts autoregressively: depth 1 reads the target's feature, every later depth
reads the head's own previous output (`decode/spec/drafters/eagle.py`). Trained only on the target's
features (teacher forcing), it never sees its own outputs as inputs, and its acceptance falls off with
depth (0.38 / 0.15 / 0.05 / 0 measured on Gemma 3 270M). Training-time test unrolls the head for
`n_steps` steps over a whole packed row at once:

* step 0 is the ordinary forward: pair r is (f_r, x_{r+1}) at position r, causal over the row; its
  output g⁰_r predicts f_{r+1} and the token x_{r+2};
* step j ≥ 1 continues the chain rooted at every r: pair (g^{j-1}_r, x_{r+j+1}) at position r + j. It
  sees exactly what the drafter's depth j + 1 sees: the true pairs 0 … r (step 0's keys) and the
  chain's own earlier steps (the same r in steps 1 … j), nothing else. Its output g^j_r predicts
  f_{r+j+1} and x_{r+j+2}.

The tokens x are the data's (the target's own continuations), so step j is the head's input when its
first j drafts were right, the only case in which depth j + 1 can be accepted. All steps share one KV
cache of `n_steps` × L slots (step j writes block j); `slot_mask` says which slots each query sees.
The cost of a step grows about linearly with `n_steps`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.models.eagle import EagleHead


def slot_mask(length: int, step: int, n_steps: int) -> jax.Array:
    """Which of the n_steps·L cache slots query r of step `step` sees: [L, n_steps·L] bool.

    Slot s belongs to step s // L and chain s % L: step 0's slots are visible causally (s ≤ r), a
    later step's slot only on the query's own chain (s % L == r) and only up to `step` itself.
    """
    r = jnp.arange(length)[:, None]
    s = jnp.arange(n_steps * length)[None, :]
    block, chain = s // length, s % length
    return jnp.where(block == 0, chain <= r, (block <= step) & (chain == r))


def unrolled(head: EagleHead, feat_btd: jax.Array, tokens_bt: jax.Array, embed_vd: jax.Array,
             n_steps: int) -> list[jax.Array]:
    """The head's predictions g^j [B, L, D], L = T - 1, for steps j = 0 … n_steps - 1 (module doc).

    Args:
      head: the EAGLE head.
      feat_btd: the target's features f_t of a packed row [B, T, D].
      tokens_bt: the row's tokens [B, T].
      embed_vd: the target's embedding table.
      n_steps: unrolled steps (1 = ordinary teacher-forced EAGLE training).
    """
    b, t, _ = feat_btd.shape
    length = t - 1
    positions_bl = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    if n_steps == 1:  # no cache: the plain causal forward
        return [head(feat_btd[:, :-1], tokens_bt[:, 1:], embed_vd, positions_bl)[0]]
    cache = head.init_cache(b, n_steps * length)
    tokens_ext = jnp.pad(tokens_bt, ((0, 0), (0, n_steps)))  # a chain running past the row reads 0: masked out
    feats, preds = feat_btd[:, :-1], []
    for j in range(n_steps):
        mask_bls = jnp.broadcast_to(slot_mask(length, j, n_steps), (b, length, n_steps * length))
        g_bld, cache = head(feats, tokens_ext[:, 1 + j:1 + j + length], embed_vd, positions_bl + j, cache,
                            jnp.full((b,), j * length, jnp.int32), mask_bts=mask_bls)
        preds.append(g_bld)
        feats = g_bld
    return preds


def step_targets(tokens_bt: jax.Array, mask_bt: jax.Array, feat_btd: jax.Array, step: int) -> dict:
    """What step `step`'s predictions are scored against, per chain root r ([B, L] / [B, L, D], L = T - 1).

    Returns a dict of:
      labels: the token x_{r+step+2} (0 past the row).
      label: 1 where that token is a training target inside the row (mask[b, t] = 1 says token t+1 is).
      feat: the target's feature f_{r+step+1} (zeros past the row).
      reg_mask: 1 where that feature is inside the data: the feature's own position or the token it
        predicts is a target.
    """
    t = tokens_bt.shape[1]
    length, pad = t - 1, step + 2
    mask_in = jnp.pad(mask_bt[:, :-1].astype(jnp.float32), ((0, 0), (0, pad)))  # mask[t] for t <= T - 2
    label = mask_in[:, step + 1:step + 1 + length]
    labels = jnp.pad(tokens_bt, ((0, 0), (0, pad)))[:, step + 2:step + 2 + length]
    feat = jnp.pad(feat_btd, ((0, 0), (0, pad), (0, 0)))[:, step + 1:step + 1 + length]
    reg_mask = jnp.maximum(mask_in[:, step:step + length], label)
    return {"labels": labels, "label": label, "feat": feat, "reg_mask": reg_mask}
