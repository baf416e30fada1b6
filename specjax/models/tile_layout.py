"""The int8 kernel's matrix layout (csrc/int8_activation_gemm.cc): tiles of 16 output rows and compact scales.

`tile_arrays` turns a row-major `BlockQuant`'s arrays into what the kernel reads, on device (jitted):

* values: within each tile of 16 rows the rows' 4-byte words alternate (a transpose of uint32 [16, words] per
  tile), so one 64-byte vector holds one word of each of the 16 rows;
* scales (offsets) [out, nb] → the tiles' [out / 16][nb][16], so one vector load gives 16 rows' scales; blocks
  wider than MAX_BLOCK columns are split (x is quantized at least that finely);
* compact scales: a K-quant's block scales are d · c_b, a float16 per 256 columns times a small integer, exact
  float32 products. `factor_blocks` recovers such factors from the float32 scales alone (no loader change), and
  they are stored as int8 sub-scales with super-scales [out, nb / group] (float16 where exact, as GGUF's d always
  is, else float32): 1 + 2 / group bytes per block and row instead of 4 (from llama.cpp's files; `factor_blocks`
  says which). The kernel forms sub · super, the
  very float32 value, so products keep their bits;
* float16 scales: where the scales do not factor but each is a float16 (GGUF's Q8_0, Q5_0, Q4_0: one float16
  per 32 columns), they are stored as such, 2 bytes per block and row instead of 4 (Gemma 3 270M: 29 MB of its
  ~290 MB step, its tied head's included); the kernel widens them, exactly.

Everything here is exact and reversible (`untile_values`, `untile_blocks`): lookups and dequantization of a
tiled matrix give the row-major matrix's values bit for bit.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from specjax.models.config import ConfigError

# Saved with the tiled arrays of a model (packed_cache.tiled_file): change it with any change of what
# `tile_arrays` produces or of how that file is written, so no start reads a layout the kernel no longer
# expects (or one that cannot be mapped in place).
LAYOUT_VERSION = "4"  # 2: float16 scales where exact (Q8_0, Q5_0); 3: float16 super-scales; 4: 64-byte aligned file

LANES = 16  # output rows per tile (one int32 lane of csrc/simd16.h's vectors each)
MAX_BLOCK = 32  # larger scale blocks (per-channel scales) are split: x is quantized per block
SUPER_COLUMNS = 256  # columns per super-scale in the compact form (GGUF's K-quant super-blocks)


def kernel_block(out: int, width: int, nb: int, q4: bool) -> int | None:
    """The kernel's block width for a matrix with nb scale blocks, or None for shapes it cannot take."""
    block = width // nb
    if block > MAX_BLOCK and block % MAX_BLOCK == 0:
        block = MAX_BLOCK
    if out % LANES or block % 16 or block > 64 or (q4 and (width // 2) % block):
        return None
    return block


# llama.cpp's K-quant scale integers: the block with the largest scale of a super-block gets exactly this many
# units of d (Q4_K scales and mins: 63; Q6_K: -128, i.e. d = -max / 128; 127 for others' symmetric rounding).
DENOMINATORS = (63, 128, 127)


def _factor_denominators(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(integers, factor) for groups a [..., group]: factor = max |a| / n for the first n of DENOMINATORS that
    makes every a an integer times it (max |a| / n is d exactly when max |a| = n · |d| exactly)."""
    top = jnp.max(jnp.abs(a), axis=-1, keepdims=True)
    sub, sup, found = jnp.zeros(a.shape, jnp.int32), jnp.zeros(top.shape, jnp.float32), top == 0
    for n in DENOMINATORS:
        # A full array hidden from XLA's simplifier, which turns a division by a broadcast scalar into a product
        # with its reciprocal, one ulp off. The integers are rounded, then checked by the exact product.
        f = top / jax.lax.optimization_barrier(jnp.full_like(top, n))
        q = jnp.round(a / jnp.where(f > 0, f, 1.0))
        good = ~found & jnp.all(q * f == a, axis=-1, keepdims=True)
        sub, sup, found = jnp.where(good, q.astype(jnp.int32), sub), jnp.where(good, f, sup), found | good
    return sub, sup


@functools.partial(jax.jit, static_argnames="group")
def factor_blocks(a: jax.Array, group: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """float32 a [out, nb] → (sub int8 [out, nb], super float32 [out, nb / group], ok) with
    sub · super == a exactly wherever `ok` (a bool scalar) holds.

    A group of a K-quant's scales is d · c_b (d a float16, c_b a small integer), products that are exact in
    float32, and llama.cpp gives the group's largest scale exactly 63 (Q4_K) or -128 (Q6_K) units of d: d is
    that scale over 63, 128 or 127 (`_factor_denominators`). Other exact factorizations (a quantizer that leaves
    the largest block below those) are not searched for: such matrices keep float32 scales. A group whose
    integers would include +128 (from a negative d: Q6_K) takes a negative super-scale.
    """
    out, nb = a.shape
    a = a.reshape(out, nb // group, group)
    sub, sup = _factor_denominators(a)
    flip = jnp.any(sub == 128, axis=-1, keepdims=True)
    sub, sup = jnp.where(flip, -sub, sub), jnp.where(flip, -sup, sup)
    ok = jnp.all((sub >= -128) & (sub <= 127)) & jnp.all(sub.astype(jnp.float32) * sup == a)
    return sub.astype(jnp.int8).reshape(out, nb), sup[..., 0], ok


def _super_group(block: int, nb: int) -> int:
    """Blocks per super-scale: those of one SUPER_COLUMNS span (fewer where the row is narrower), or 1."""
    return math.gcd(nb, SUPER_COLUMNS // block) if SUPER_COLUMNS % block == 0 else 1


@functools.partial(jax.jit, static_argnames=("block", "group"))
def _tiles(values: jax.Array, scale: jax.Array, offset: jax.Array | None, block: int, group: int):
    """(tiles with float32 scales, tiles with compact scales (float32 super-scales) or None when group < 2,
    {"compact", "float16", "super16"}: whether the compact form is exact, whether every scale / every
    super-scale is a float16). One program per shape (loading a model compiles a handful, not one per operation);
    the caller narrows to float16 what the flags allow."""
    width = values.shape[1] * (2 if values.dtype == jnp.uint8 else 1)
    split = lambda a: jnp.repeat(a.astype(jnp.float32), width // a.shape[1] // block, axis=1)
    parts = {"scale": split(scale)} | ({} if offset is None else {"offset": split(offset)})
    is_half = lambda a: jnp.all(a.astype(jnp.float16).astype(jnp.float32) == a)
    full = {"values": word_tiles(values)} | {k: per_tile(a) for k, a in parts.items()}
    exact = {"float16": jnp.all(jnp.stack([is_half(a) for a in parts.values()])), "compact": jnp.bool_(False),
             "super16": jnp.bool_(False)}
    if group < 2:
        return full, None, exact
    compact, ok, super16 = {"values": full["values"]}, jnp.bool_(True), jnp.bool_(True)
    for name, a in parts.items():
        sub, sup, good = factor_blocks(a, group)
        compact[name], compact[f"{name}_super"] = per_tile(sub), per_tile(sup)
        ok, super16 = ok & good, super16 & is_half(sup)
    return full, compact, exact | {"compact": ok, "super16": super16}


def _swap_tiles(a: jax.Array, to_tiles: bool) -> jax.Array:
    """[out, n] in rows ↔ in tiles: within each group of 16 rows the [16, n] block transposed to [n, 16]
    (to_tiles) or back (jnp: works in-graph)."""
    out, n = a.shape
    inner = (LANES, n) if to_tiles else (n, LANES)
    return a.reshape(out // LANES, *inner).transpose(0, 2, 1).reshape(out, n)


def _swap_words(values: jax.Array, to_tiles: bool) -> jax.Array:
    """`_swap_tiles` on 4-byte words of int8 / uint8 values [out, bytes] (same shape and dtype)."""
    out, nbytes = values.shape
    words = jax.lax.bitcast_convert_type(values.reshape(out, nbytes // 4, 4), jnp.uint32)
    return jax.lax.bitcast_convert_type(_swap_tiles(words, to_tiles), values.dtype).reshape(out, nbytes)


def word_tiles(values: jax.Array) -> jax.Array:
    """Row-major [out, bytes] → tiles of 16 rows whose 4-byte words alternate (same shape and dtype)."""
    return _swap_words(values, True)


def untile_values(tiled: jax.Array) -> jax.Array:
    """Whole tiles of a tiled matrix back to BlockQuant's row-major values."""
    return _swap_words(tiled, False)


def per_tile(a: jax.Array) -> jax.Array:
    """Row-major [out, n] → the tiles' [out / 16][n][16] (as [out, n])."""
    return _swap_tiles(a, True)


def untile_blocks(a: jax.Array, sup: jax.Array | None = None) -> jax.Array:
    """A tiled [out, nb] scale (offset) back to row-major float32; compact: sub-scales times their tiled
    super-scales `sup` (exact: the float32 the full form holds)."""
    rows = _swap_tiles(a, False).astype(jnp.float32)  # float16 scales: exactly the float32 they stand for
    if sup is None:
        return rows
    sup = _swap_tiles(sup, False).astype(jnp.float32)
    return rows * jnp.repeat(sup, a.shape[1] // sup.shape[1], axis=1)


def tile_arrays(values: jax.Array, scale: jax.Array, offset: jax.Array | None, compact: bool = True
                ) -> dict[str, jax.Array]:
    """A row-major BlockQuant's arrays → the kernel's ("values", "scale", and where they apply "offset",
    "scale_super", "offset_super"), on device. `compact`: the fewest bytes that are exact (compact scales, else
    float16 scales, else float32: see the module doc); False keeps float32 scales (the same products, more bytes).

    Raises:
      ConfigError: a shape the kernel does not take.
    """
    values = jnp.asarray(values)
    q4 = values.dtype == jnp.uint8
    out, nbytes = values.shape
    width = nbytes * (2 if q4 else 1)
    block = kernel_block(out, width, scale.shape[1], q4)
    if block is None:
        raise ConfigError(f"activations=int8 cannot take a {out} x {width} matrix with scale blocks of "
                          f"{width // scale.shape[1]}")
    group = _super_group(block, width // block) if compact else 1
    full, factored, exact = _tiles(values, jnp.asarray(scale), None if offset is None else jnp.asarray(offset),
                                   block, group)
    half = lambda tiles, names: tiles | {k: tiles[k].astype(jnp.float16) for k in names if k in tiles}
    if factored is not None and bool(exact["compact"]):
        return half(factored, ("scale_super", "offset_super")) if bool(exact["super16"]) else factored
    if compact and bool(exact["float16"]):
        return half(full, ("scale", "offset"))
    return full
