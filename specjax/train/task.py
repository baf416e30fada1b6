"""The `Task` a trainer runs (trainable split, frozen arrays, loss) and the helpers every task's loss shares.

Batches are dicts of `tokens` [B, T] int32 and `mask` [B, T] float32, where mask[b, t] = 1 says
that token t+1 is a training target (a generated continuation token, not prompt or padding).
The builders live in `tasks.py` (draft models) and `head_tasks.py` (Medusa, EAGLE); both import
this leaf module, so neither imports the other's module at import time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specjax.models.reductions import argmax
from specjax.train import losses
from specjax.train.step import LossFn


@dataclasses.dataclass
class Task:
    """A trainable module split for jit, plus everything its loss reads.

    Attributes:
      kind: "draft", "medusa" or "eagle".
      graphdef: static half of the trainable module.
      params: trainable parameters (nnx.State).
      frozen: pytree of arrays the loss reads but never updates (target, frozen draft parts).
      loss_fn: (params, frozen, batch, key) -> (loss sum, dict of sums incl. "tokens").
      meta: JSON-ready description stored with checkpoints (what `load_draft_checkpoint` rebuilds).
      units: head counts for the sharding rules (`sharding.model_units`).
      export: (params, frozen) -> the module's complete nnx.State (what a decoder loads).
    """

    kind: str
    graphdef: Any
    params: Any
    frozen: Any
    loss_fn: LossFn
    meta: dict
    units: dict
    export: Any = None


def positions_like(tokens_bt: jax.Array) -> jax.Array:
    """Packed rows restart positions at 0 in every row."""
    return jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)


def next_tokens(tokens_bt: jax.Array) -> jax.Array:
    """labels[b, t] = tokens[b, t+1] (0 past the row; the mask is 0 there)."""
    return jnp.concatenate([tokens_bt[:, 1:], jnp.zeros_like(tokens_bt[:, :1])], axis=1)


def accuracy_sums(logits_nv_: jax.Array, labels_n: jax.Array, mask_n: jax.Array, k: int, prefix: str = "") -> dict:
    """Sums of top-1 and top-k hits over masked rows."""
    top1 = (argmax(logits_nv_) == labels_n).astype(jnp.float32)
    topk = losses.rank_below_n(logits_nv_, labels_n, k)
    return {f"{prefix}acc": jnp.sum(top1 * mask_n), f"{prefix}top{k}": jnp.sum(topk * mask_n)}
