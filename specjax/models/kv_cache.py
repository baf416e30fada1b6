"""KV cache pytree and the attention masks that read it.

The cache is allocated once per generation call with a static length. Each sequence of
the batch writes its new keys/values at its own slot offset (`start_b`), so prompts of
different lengths and ragged speculative acceptance need no padding bookkeeping beyond
one integer per row. Slots at or beyond a row's committed length may hold stale values
(prompt padding, rejected drafts): the masks below never let a query see them, and the
next write overwrites them. This is how rollback works — by position, never by copying.

Values are stored transposed, [batch, kv_heads, head_dim, slots]; keys slot-major, [batch, slots,
kv_heads, head_dim]. XLA:CPU computes a decode step's attention as K·qᵀ ([slots, head_dim] times
[head_dim, heads]) and Vᵀ·pᵀ ([head_dim, slots] times [slots, heads]): the big cache matrix on the
left, read in these layouts as stored. With slot-major values it copied every layer's whole value
cache into [head_dim, slots] on every step: at batch 8 on Gemma 3 270M 0.82 ms a layer at 832 slots and
1.11 ms at 840, ~13% of a plain decode step (docs/performance.md, rule 10).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

# Compiler options for programs that carry a KV cache through a while loop. With XLA:CPU's default
# copy insertion, a loop-carried buffer that is read and then updated in place in the same iteration
# is copied (twice) every iteration: 19 MB per token for Gemma 3 270M at 176 slots, growing with the
# context. Region-based analysis proves the reads happen before the write and drops the copies
# (docs/performance.md, "KV cache writes"). A DebugOptions field: other backends ignore it.
IN_PLACE_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}


@struct.dataclass
class KVCache:
    """Per-layer keys `k[l]` [batch, slots, kv_heads, head_dim] and values `v[l]` [batch, kv_heads, head_dim, slots]."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def num_slots(self) -> int:
        return self.k[0].shape[1]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def slot_major(self) -> list[jax.Array]:
        """Every layer's keys, then every layer's values, all as [batch, slots, kv_heads, head_dim].

        For inspection and tests (the hot path never pays for this transpose): a cache compared slot by
        slot against another must see its values in the keys' layout.
        """
        return list(self.k) + [jnp.moveaxis(c, -1, 1) for c in self.v]

    @classmethod
    def zeros(cls, n_layers: int, batch: int, slots: int, n_kv_heads: int, head_dim: int, dtype):
        return cls(
            k=tuple(jnp.zeros((batch, slots, n_kv_heads, head_dim), dtype) for _ in range(n_layers)),
            v=tuple(jnp.zeros((batch, n_kv_heads, head_dim, slots), dtype) for _ in range(n_layers)),
        )


def write_block(cache: jax.Array, new_btkh: jax.Array, start_b: jax.Array, slot_axis: int = 0) -> jax.Array:
    """Writes each row's T new entries at slots start_b[b] … start_b[b]+T-1 (keys: slot-major).

    `slot_axis` is the slot axis of one row of `cache` and of `new_btkh[b]` (2 for the transposed values,
    `write_transposed`). The caller guarantees start_b + T <= slots (dynamic_update_slice would
    otherwise clamp the offset and silently shift the write).
    """
    update = lambda c, x, s: lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), s, axis=slot_axis)
    return jax.vmap(update)(cache, new_btkh, start_b)


def transposed(x_btkh: jax.Array) -> jax.Array:
    """A block's values [B, T, kv_heads, head_dim] in the value cache's layout [B, kv_heads, head_dim, T]."""
    return jnp.transpose(x_btkh, (0, 2, 3, 1))


def write_transposed(cache_bkhs: jax.Array, new_btkh: jax.Array, start_b: jax.Array) -> jax.Array:
    """`write_block` for the transposed value cache: row b's T new values at slots start_b[b] … +T-1."""
    return write_block(cache_bkhs, transposed(new_btkh), start_b, slot_axis=2)


def causal_block_mask(t: int) -> jax.Array:
    """[T, T] lower-triangular visibility inside one block of new tokens."""
    return jnp.tril(jnp.ones((t, t), dtype=bool))


def attention_masks(
    positions_bt: jax.Array,
    start_b: jax.Array,
    num_slots: int,
    block_mask_btt: jax.Array,
    window: int | None,
) -> tuple[jax.Array, jax.Array | None]:
    """Visibility [B, T, S] of cache slots for a block of T queries written at start_b.

    A slot s is visible to query t of row b when it is committed (s < start_b) or it is a
    block slot j = s - start_b that block_mask_btt[b, t, j] allows. Committed slot s holds
    position s; block slot j holds positions_bt[b, j]. Local layers also require
    q_pos - k_pos < window.

    Returns:
      (global_mask_bts, local_mask_bts); the local one is None when window is None.
    """
    t = positions_bt.shape[1]
    s_s = jnp.arange(num_slots)
    j_bs = s_s[None, :] - start_b[:, None]
    in_block_bs = (j_bs >= 0) & (j_bs < t)
    j_clip_bs = jnp.clip(j_bs, 0, t - 1)
    block_vis_bts = jnp.take_along_axis(
        block_mask_btt, jnp.broadcast_to(j_clip_bs[:, None, :], (*block_mask_btt.shape[:2], num_slots)), axis=2
    )
    committed_bs = j_bs < 0
    global_bts = committed_bs[:, None, :] | (in_block_bs[:, None, :] & block_vis_bts)
    if window is None:
        return global_bts, None
    kpos_bs = jnp.where(in_block_bs, jnp.take_along_axis(positions_bt, j_clip_bs, axis=1), s_s[None, :])
    near_bts = (positions_bt[:, :, None] - kpos_bs[:, None, :]) < window
    return global_bts, global_bts & near_bts


def move_slots(cache: KVCache, src_bt: jax.Array, dst_bt: jax.Array) -> KVCache:
    """Copies each row's entries at slots src_bt[b, t] to slots dst_bt[b, t], in every layer.

    All sources are read before any destination is written, so overlapping moves are safe.
    A destination >= num_slots is dropped (how a caller masks out unused entries). Costs a
    gather and a scatter of T entries per layer: after a token-tree round this compacts the
    accepted path into consecutive slots without copying the cache.

    Args:
      cache: the cache to update.
      src_bt, dst_bt: int slot indices [B, T] (sources are clipped into range).
    """
    b = src_bt.shape[0]
    src_bt = jnp.clip(src_bt, 0, cache.num_slots - 1)
    rows_b1 = jnp.arange(b)[:, None]

    def move_keys(c_bskh):
        return c_bskh.at[rows_b1, dst_bt].set(c_bskh[rows_b1, src_bt], mode="drop")

    def move_values(c_bkhs):  # [B, T, kv_heads, head_dim] entries: the advanced indices' dims come first
        return c_bkhs.at[rows_b1, :, :, dst_bt].set(c_bkhs[rows_b1, :, :, src_bt], mode="drop")

    return KVCache(k=tuple(move_keys(c) for c in cache.k), v=tuple(move_values(c) for c in cache.v))
