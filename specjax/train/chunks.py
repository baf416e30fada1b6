"""Row-chunked loss evaluation: vocabulary logits never exist for more than `chunk` rows at once.

A 262,144-entry vocabulary makes one float32 logit row 1 MiB; a batch of 8 × 256 tokens would
need 2 GiB per logit tensor (and the same again for the teacher and for the gradient). Scanning
over chunks of rows with `jax.checkpoint` on the chunk body keeps only one chunk's logits alive in
the forward pass and recomputes them in the backward pass.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def logits_nv(hidden_nd: jax.Array, table_vd: jax.Array, softcap: float | None = None) -> jax.Array:
    """float32 logits of rows of hidden states against a [V, D] head table (the tied embedding)."""
    out = jax.lax.dot_general(hidden_nd.astype(table_vd.dtype), table_vd, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32)
    return out if softcap is None else jnp.tanh(out / softcap) * softcap


def scan_row_chunks(fn: Callable[..., dict], consts, rows: tuple[jax.Array, ...], chunk: int) -> dict:
    """Sums `fn(consts, *row_chunk)` over chunks of `chunk` rows.

    Args:
      fn: maps (consts, arrays of [chunk, ...]) to a dict of scalar sums; padded rows arrive with
        zeros, so `fn` must weigh rows by a mask that is one of `rows` (zero on padding).
      consts: pytree shared by every chunk (head tables); gradients flow into it.
      rows: arrays with a common leading row dimension N.
      chunk: rows per chunk (the last chunk is zero-padded).

    Returns:
      The dict of sums over all rows.
    """
    n = rows[0].shape[0]
    chunk = min(chunk, n)
    pad = (-n) % chunk
    split = tuple(jnp.pad(r, [(0, pad)] + [(0, 0)] * (r.ndim - 1)).reshape(-1, chunk, *r.shape[1:]) for r in rows)
    body_fn = jax.checkpoint(fn)
    out0 = jax.eval_shape(fn, consts, *(s[0] for s in split))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out0)

    def body(carry, xs):
        return jax.tree.map(jnp.add, carry, body_fn(consts, *xs)), None

    total, _ = jax.lax.scan(body, zeros, split)
    return total
