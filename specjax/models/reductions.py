"""Reductions over the vocabulary axis that XLA runs poorly as written.

`jnp.argmax` lowers to a variadic (value, index) reduce. XLA:CPU emits it as a scalar loop: 1.26 ms
for one row of Gemma's 262,144 logits on this 2-core machine, about 4% of a batch-1 decode step,
and the same ~5 ns per entry inside the block-wise greedy head. A max over blocks, the first block
holding it, then the argmax inside that block alone reads the row once with a vectorised max and
~sqrt(V) entries with the slow reduce: 0.06 ms (benchmarks/argmax.py). The result is the same index,
ties and NaN included, so this is no backend-specific tuning: plain XLA ops on every backend.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# Below this many entries the plain reduce is as fast (at 2,048 the two levels still win 1.5×).
MIN_TWO_LEVEL = 1024
# Block widths are powers of two in this range.
MAX_BLOCK = 1024
MIN_BLOCK = 64


def block_width(n: int) -> int:
    """Entries per block for an axis of n: near sqrt(n) (both levels read about as little), the largest
    power of two dividing n from there down to MIN_BLOCK, else that power of two (the axis is padded)."""
    target = min(MAX_BLOCK, max(MIN_BLOCK, 1 << max(0, math.isqrt(n) - 1).bit_length()))
    width = target
    while width >= MIN_BLOCK:
        if n % width == 0:
            return width
        width //= 2
    return target


def argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` as int32, computed in two levels (see module doc and `max_argmax`)."""
    return max_argmax(x)[1]


def max_argmax(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(max, argmax as int32) over the last axis in two levels (see module doc); numpy's answers.

    The first maximum (the lowest index among ties); index 0 for a row of -inf; the first NaN, with
    NaN as the maximum, when a row holds one. XLA:CPU's max reduce drops NaN (fast min/max) where
    argmax's own reducer does not, so an input whose sum is NaN (a NaN, or +inf beside -inf) takes
    `jnp.argmax` whole: one vectorised sum decides, and finite logits never pay for the slow path.
    Padding, when the axis has no power-of-two divisor in range, is the lowest value at the end: it
    can only tie, and a tie goes to the lower index.
    """
    *lead, n = x.shape
    if n < MIN_TWO_LEVEL:
        return _exact(x)
    width = block_width(n)
    pad = -n % width
    if pad:
        lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
        x = jnp.concatenate([x, jnp.full((*lead, pad), lowest, x.dtype)], axis=-1)

    def two_level(x):
        blocks = x.reshape(*lead, -1, width)
        block_max = jnp.max(blocks, axis=-1)
        block = jnp.argmax(block_max, axis=-1).astype(jnp.int32)
        inside = jnp.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :]
        return jnp.max(block_max, axis=-1), block * width + jnp.argmax(inside, axis=-1).astype(jnp.int32)

    if not jnp.issubdtype(x.dtype, jnp.floating):
        return two_level(x)
    return jax.lax.cond(jnp.isnan(jnp.sum(x)), _exact, two_level, x)


def _exact(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One-level (max, argmax): the max is the entry argmax picks, so NaN when it picks a NaN."""
    idx = jnp.argmax(x, axis=-1).astype(jnp.int32)
    return jnp.take_along_axis(x, idx[..., None], axis=-1)[..., 0], idx
