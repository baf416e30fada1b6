"""The int8 kernel's matrix layout (csrc/int8_activation_gemm.cc): tiles of 16 output rows and compact scales.

`tile_arrays` turns a row-major `BlockQuant`'s arrays into what the kernel reads, on the host with numpy (the
kernel is a CPU kernel; jitted, each matrix shape compiled its own program: 14 of them, 2.6 s of Gemma's first
start):

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

import math

import jax
import jax.numpy as jnp
import numpy as np

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


def _factor_denominators(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(integers, factor) for groups a [..., group]: factor = max |a| / n for the first n of DENOMINATORS that
    makes every a an integer times it (max |a| / n is d exactly when max |a| = n · |d| exactly)."""
    top = np.max(np.abs(a), axis=-1, keepdims=True)
    sub, sup, found = np.zeros(a.shape, np.int32), np.zeros(top.shape, np.float32), top == 0
    for n in DENOMINATORS:
        f = top / np.float32(n)  # IEEE division (XLA had to be kept from making it a product with 1 / n)
        q = np.round(a / np.where(f > 0, f, np.float32(1)))
        good = ~found & np.all(q * f == a, axis=-1, keepdims=True)
        sub, sup, found = np.where(good, q.astype(np.int32), sub), np.where(good, f, sup), found | good
    return sub, sup


def factor_blocks(a, group: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """float32 a [out, nb] → (sub int8 [out, nb], super float32 [out, nb / group], ok) with
    sub · super == a exactly wherever `ok` holds.

    A group of a K-quant's scales is d · c_b (d a float16, c_b a small integer), products that are exact in
    float32, and llama.cpp gives the group's largest scale exactly 63 (Q4_K) or -128 (Q6_K) units of d: d is
    that scale over 63, 128 or 127 (`_factor_denominators`). Other exact factorizations (a quantizer that leaves
    the largest block below those) are not searched for: such matrices keep float32 scales. A group whose
    integers would include +128 (from a negative d: Q6_K) takes a negative super-scale.
    """
    a = np.asarray(a, np.float32)
    out, nb = a.shape
    a = a.reshape(out, nb // group, group)
    sub, sup = _factor_denominators(a)
    flip = np.any(sub == 128, axis=-1, keepdims=True)
    sub, sup = np.where(flip, -sub, sub), np.where(flip, -sup, sup)
    ok = bool(np.all((sub >= -128) & (sub <= 127)) and np.all(sub.astype(np.float32) * sup == a))
    return sub.astype(np.int8).reshape(out, nb), sup[..., 0], ok


def _super_group(block: int, nb: int) -> int:
    """Blocks per super-scale: those of one SUPER_COLUMNS span (fewer where the row is narrower), or 1."""
    return math.gcd(nb, SUPER_COLUMNS // block) if SUPER_COLUMNS % block == 0 else 1


def _tiles(values: np.ndarray, scale: np.ndarray, offset: np.ndarray | None, block: int, group: int):
    """(tiles with float32 scales, tiles with compact scales (float32 super-scales) or None when group < 2,
    {"compact", "float16", "super16"}: whether the compact form is exact, whether every scale / every
    super-scale is a float16). The caller narrows to float16 what the flags allow."""
    width = values.shape[1] * (2 if values.dtype == np.uint8 else 1)
    split = lambda a: np.repeat(np.asarray(a, np.float32), width // a.shape[1] // block, axis=1)
    parts = {"scale": split(scale)} | ({} if offset is None else {"offset": split(offset)})
    is_half = lambda a: bool(np.all(a.astype(np.float16).astype(np.float32) == a))
    full = {"values": word_tiles(values)} | {k: per_tile(a) for k, a in parts.items()}
    exact = {"float16": all(is_half(a) for a in parts.values()), "compact": False, "super16": False}
    if group < 2:
        return full, None, exact
    compact, ok, super16 = {"values": full["values"]}, True, True
    for name, a in parts.items():
        sub, sup, good = factor_blocks(a, group)
        compact[name], compact[f"{name}_super"] = per_tile(sub), per_tile(sup)
        ok, super16 = ok and good, super16 and is_half(sup)
    return full, compact, exact | {"compact": ok, "super16": super16}


def _swap_tiles(a, to_tiles: bool):
    """[out, n] in rows ↔ in tiles: within each group of 16 rows the [16, n] block transposed to [n, 16]
    (to_tiles) or back. numpy or jnp arrays (untiling works in-graph)."""
    out, n = a.shape
    inner = (LANES, n) if to_tiles else (n, LANES)
    return a.reshape(out // LANES, *inner).transpose(0, 2, 1).reshape(out, n)


def word_tiles(values) -> np.ndarray:
    """Row-major [out, bytes] → tiles of 16 rows whose 4-byte words alternate (same shape and dtype; numpy)."""
    values = np.ascontiguousarray(values)
    return np.ascontiguousarray(_swap_tiles(values.view(np.uint32), True)).view(values.dtype)


def untile_values(tiled: jax.Array) -> jax.Array:
    """Whole tiles of a tiled matrix back to BlockQuant's row-major values (jnp: in-graph)."""
    out, nbytes = tiled.shape
    words = jax.lax.bitcast_convert_type(tiled.reshape(out, nbytes // 4, 4), jnp.uint32)
    return jax.lax.bitcast_convert_type(_swap_tiles(words, False), tiled.dtype).reshape(out, nbytes)


def per_tile(a) -> np.ndarray:
    """Row-major [out, n] → the tiles' [out / 16][n][16] (as [out, n]; numpy)."""
    return np.ascontiguousarray(_swap_tiles(np.asarray(a), True))


def untile_blocks(a: jax.Array, sup: jax.Array | None = None) -> jax.Array:
    """A tiled [out, nb] scale (offset) back to row-major float32; compact: sub-scales times their tiled
    super-scales `sup` (exact: the float32 the full form holds)."""
    rows = _swap_tiles(a, False).astype(jnp.float32)  # float16 scales: exactly the float32 they stand for
    if sup is None:
        return rows
    sup = _swap_tiles(sup, False).astype(jnp.float32)
    return rows * jnp.repeat(sup, a.shape[1] // sup.shape[1], axis=1)


def tile_arrays(values, scale, offset=None, compact: bool = True) -> dict[str, np.ndarray]:
    """A row-major BlockQuant's arrays → the kernel's ("values", "scale", and where they apply "offset",
    "scale_super", "offset_super"), numpy on the host. `compact`: the fewest bytes that are exact (compact
    scales, else float16 scales, else float32: see the module doc); False keeps float32 scales (the same products,
    more bytes).

    Raises:
      ConfigError: a shape the kernel does not take.
    """
    values = np.asarray(values)
    q4 = values.dtype == np.uint8
    out, nbytes = values.shape
    width = nbytes * (2 if q4 else 1)
    block = kernel_block(out, width, scale.shape[1], q4)
    if block is None:
        raise ConfigError(f"activations=int8 cannot take a {out} x {width} matrix with scale blocks of "
                          f"{width // scale.shape[1]}")
    group = _super_group(block, width // block) if compact else 1
    full, factored, exact = _tiles(values, np.asarray(scale), None if offset is None else np.asarray(offset),
                                   block, group)
    half = lambda tiles, names: tiles | {k: tiles[k].astype(np.float16) for k in names if k in tiles}
    if factored is not None and exact["compact"]:
        return half(factored, ("scale_super", "offset_super")) if exact["super16"] else factored
    if compact and exact["float16"]:
        return half(full, ("scale", "offset"))
    return full
