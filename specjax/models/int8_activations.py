"""`activations=int8`: low-precision matrices multiplied with int8 activations on XLA:CPU (W4A8 / W8A8).

With `weights=q4|int8` the float32 native kernel (`native_kernels`, "float32") converts every weight to
float32 and multiplies in float32; that conversion and the FMAs make a product of more than a few rows
compute-bound on a CPU (a verification of 9 rows cost 3–4.5 one-row products). llama.cpp instead
quantizes the activations to int8 and sums integer products. The "int8" native kernel does the same:
each row of x is quantized per block of the matrix's columns (x8 = round(127·x / max|x|), one float32
scale per block: finer than llama.cpp's blocks of 256), the block sums are exact integer dot products
(AVX-512 VNNI, 64 per instruction; on AVX2, maddubs / madd: the same integers, csrc/simd16.h), and the
blocks are combined in float32 in one fixed order. A row's
result is therefore the same whatever the number of rows in the call: speculative verification gives
each row exactly what a one-row step gives it, so greedy speculative output still equals plain greedy.

The numbers change (an activation rounding per element, relative step 1/254 of a block's largest |x|):
docs/performance.md reports the greedy agreement and perplexity against float32 on both real models.
`activations=float32` keeps the bit-identical weights and float32 products (`activations=auto`, the CLI's
default, is int8 where these kernels run).

The kernel reads each matrix in tiles of 16 output rows (csrc/int8_activation_gemm.cc explains the
layout): `tile_model` re-lays every packed matrix of a loaded model, in place, as a `TiledBlockQuant`
with the same array shapes (sharding rules and byte counts stay valid). Every product of a tiled matrix
runs in the kernel, whatever its row count (prefill too); lookups (`rows`) and `dequantized` undo the
layout, so any other use stays correct.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models import native_kernels
from specjax.models.config import ConfigError
from specjax.models.layers import RMSNorm
from specjax.models.quant import BlockQuant, QuantBuffer, _get
from specjax.models.reductions import argmax
from specjax.models.transformer import Attention

ACTIVATION_CHOICES = ("auto", "float32", "int8")
LANES = 16  # output rows per tile (one int32 lane of csrc/simd16.h's vectors each)
MAX_BLOCK = 32  # larger scale blocks (per-channel scales) are split: x is quantized per block
SUPER_COLUMNS = 256  # columns per super-scale in the compact form (GGUF's K-quant super-blocks)


def resolve(activations: str, weights: str, dtype: str = "float32") -> str:
    """Checks an `activations=` option against the resolved `weights=` format and dtype (one clear line
    otherwise) and resolves "auto": int8 for int8 / q4 matrices in float32 where the kernels run (x86-64 with
    AVX2 + FMA or AVX-512 VNNI; llama.cpp's arithmetic, and since attention and norms sum in a fixed order, greedy
    speculation still reproduces plain decoding), float32 otherwise (float weights, bfloat16, accelerators)."""
    check(activations, weights, dtype)
    if activations != "auto":
        return activations
    takes = weights in ("int8", "q4") and dtype == "float32" and jax.default_backend() == "cpu"
    return "int8" if takes and native_kernels.int8_path_available() else "float32"


def check(activations: str, weights: str, dtype: str = "float32") -> None:
    """Checks an `activations=` option against the resolved `weights=` format (one clear line otherwise)."""
    if activations not in ACTIVATION_CHOICES:
        raise ConfigError(f"activations={activations!r} is not one of {', '.join(ACTIVATION_CHOICES)}")
    if activations == "int8":
        if weights not in ("int8", "q4"):
            raise ConfigError(f"activations=int8 needs weights=int8 or q4 (or auto resolving to one), not {weights}")
        if dtype != "float32":
            raise ConfigError(f"activations=int8 needs dtype=float32, not {dtype}")
        for kind in native_kernels.INT8_PATH:
            if not native_kernels.available(kind):
                raise ConfigError(f"activations=int8 needs specjax's {kind} CPU kernel (x86-64, AVX2 or AVX-512), "
                                  f"unavailable here: {native_kernels.unavailable_reason(kind)}")


def _block(out: int, width: int, nb: int, q4: bool) -> int | None:
    """The kernel's block width for a matrix with nb scale blocks, or None for shapes it cannot take."""
    block = width // nb
    if block > MAX_BLOCK and block % MAX_BLOCK == 0:
        block = MAX_BLOCK
    if out % LANES or block % 16 or block > 64 or (q4 and (width // 2) % block):
        return None
    return block


def _odd_parts(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """float32 a = ±odd · 2^e exactly: (odd int32 ≥ 0, e int32), odd = 0 for zeros."""
    bits = jax.lax.bitcast_convert_type(a, jnp.int32) & 0x7FFFFFFF
    exp = bits >> 23
    sig = jnp.where(exp > 0, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
    zeros = jax.lax.population_count((sig & -sig) - 1)  # trailing zero bits (32 for sig = 0)
    odd = jnp.where(sig > 0, sig >> jnp.minimum(zeros, 31), 0)
    return odd, jnp.maximum(exp, 1) - 150 + jnp.minimum(zeros, 31)


@functools.partial(jax.jit, static_argnames="group")
def factor_blocks(a: jax.Array, group: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """float32 a [out, nb] → (sub int8 [out, nb], super float32 [out, nb / group], ok) with
    sub · super == a exactly wherever `ok` (a bool scalar) holds.

    A group of a K-quant's scales is d · c_b (d a float16, c_b a small integer), products that are exact in
    float32. The largest such factor: the gcd of the blocks' odd significands times the smallest power of two
    among them; each block's integer is then at most |c_b|, so it fits int8 wherever the file's does (a group
    whose integers would include +128, from a negative d, takes a negative super-scale).
    """
    out, nb = a.shape
    a = a.reshape(out, nb // group, group)
    odd, e = _odd_parts(a)
    g = functools.reduce(jnp.gcd, [odd[..., i] for i in range(group)])[..., None]
    k = jnp.min(jnp.where(odd > 0, e, 1 << 20), axis=-1, keepdims=True)
    shift = jnp.where(odd > 0, e - k, 0)
    mag = jnp.left_shift(jnp.where(odd > 0, odd // jnp.maximum(g, 1), 0), jnp.clip(shift, 0, 7))
    sub = jnp.where(a < 0, -mag, mag)
    # A negative float16 d (Q6_K allows it) makes c = -128 a +128: such a group takes a negative super-scale.
    flip = jnp.any(sub == 128, axis=-1, keepdims=True)
    sub = jnp.where(flip, -sub, sub)
    sup = jnp.where(g > 0, jnp.ldexp(g.astype(jnp.float32), jnp.where(g > 0, k, 0)), 0.0)
    sup = jnp.where(flip, -sup, sup)
    fits = (shift <= 7) & (sub >= -128) & (sub <= 127)
    ok = jnp.all(fits) & jnp.all(sub.astype(jnp.float32) * sup == a)
    sub, sup = sub.astype(jnp.int8).reshape(out, nb), sup[..., 0]
    return sub, sup, ok


def _super_group(width: int, block: int, nb: int) -> int:
    """Blocks per super-scale: those of one SUPER_COLUMNS span (fewer where the row is narrower), or 1."""
    return math.gcd(nb, SUPER_COLUMNS // block) if SUPER_COLUMNS % block == 0 else 1


@functools.partial(jax.jit, static_argnames="block")
def _tiled(values: jax.Array, scale: jax.Array, offset: jax.Array | None, block: int):
    out, nbytes = values.shape
    g, width = out // LANES, nbytes * (2 if values.dtype == jnp.uint8 else 1)
    words = jax.lax.bitcast_convert_type(values.reshape(g, LANES, nbytes // 4, 4), jnp.uint32)
    tiled = jax.lax.bitcast_convert_type(words.transpose(0, 2, 1), values.dtype).reshape(out, nbytes)

    def split(a):  # wide blocks split: x quantized per block
        return None if a is None else jnp.repeat(a, width // a.shape[1] // block, axis=1)
    return tiled, split(scale), split(offset)


def _per_tile(a: jax.Array | None) -> jax.Array | None:
    """Row-major [out, n] → the tiles' [out / 16][n][16] (as [out, n])."""
    if a is None:
        return None
    out, n = a.shape
    return a.reshape(out // LANES, LANES, n).transpose(0, 2, 1).reshape(out, n)


def _compact(scale: jax.Array, offset: jax.Array | None, group: int):
    """(sub-scale, super-scale, sub-offset, super-offset) of blocks that factor exactly, else None."""
    if group < 2:
        return None
    parts = [factor_blocks(a, group) for a in (scale, offset) if a is not None]
    if not all(bool(ok) for _, _, ok in parts):
        return None
    (s, ss, _), rest = parts[0], parts[1:]
    return (s, ss, *(rest[0][:2] if rest else (None, None)))


def tile_arrays(values: jax.Array, scale: jax.Array, offset: jax.Array | None, compact: bool = True):
    """(values, scale, offset, scale super, offset super) of a row-major BlockQuant → the kernel's tiles
    (values in the same shape; jitted, on device).

    Values: within each tile of 16 rows the rows' 4-byte words alternate (a transpose of uint32
    [16, words] per tile). Scales [out, nb] → [tiles, nb, 16]. Scale blocks wider than MAX_BLOCK
    columns are split (their scale and offset repeated), so x is quantized at least that finely.
    With `compact`, scales (and offsets) that factor exactly per SUPER_COLUMNS columns (`factor_blocks`:
    every GGUF K-quant) become int8 sub-scales and float32 super-scales [out, nb / group] (tiled alike);
    otherwise both supers are None and the scales stay float32.

    Raises:
      ConfigError: a shape the kernel does not take (`tileable`).
    """
    q4 = values.dtype == jnp.uint8
    out, nbytes = values.shape
    width = nbytes * (2 if q4 else 1)
    block = _block(out, width, scale.shape[1], q4)
    if block is None:
        raise ConfigError(f"activations=int8 cannot take a {out} x {width} matrix with scale blocks of "
                          f"{width // scale.shape[1]}")
    as_f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)
    tiled, scale, offset = _tiled(jnp.asarray(values), as_f32(scale), as_f32(offset), block)
    factored = _compact(scale, offset, _super_group(width, block, scale.shape[1])) if compact else None
    if factored is not None:
        scale, scale_super, offset, offset_super = factored
    else:
        scale_super = offset_super = None
    return (tiled, *map(_per_tile, (scale, offset, scale_super, offset_super)))


def untile_values(tiled: jax.Array) -> jax.Array:
    """Whole tiles of a tiled matrix back to BlockQuant's row-major values (jnp: works in-graph)."""
    out, nbytes = tiled.shape
    words = jax.lax.bitcast_convert_type(tiled.reshape(out // LANES, nbytes // 4, LANES, 4), jnp.uint32)
    rows = jax.lax.bitcast_convert_type(words.transpose(0, 2, 1), tiled.dtype)  # [g, 16, words, 4]
    return rows.reshape(out, nbytes)


def untile_blocks(a: jax.Array, sup: jax.Array | None = None) -> jax.Array:
    """A tiled [out, nb] scale (offset) back to row-major float32; compact: sub-scales times their tiled
    super-scales `sup` (exact: the float32 the full form holds)."""
    out, nb = a.shape
    rows = lambda t: t.reshape(out // LANES, t.shape[1], LANES).transpose(0, 2, 1).reshape(out, t.shape[1])
    if sup is None:
        return rows(a)
    return rows(a).astype(jnp.float32) * jnp.repeat(rows(sup), nb // sup.shape[1], axis=1)


class TiledBlockQuant(BlockQuant):
    """A BlockQuant laid out for the int8 activation kernel; every product goes through that kernel.

    `scale` (`offset`) is float32, or in the compact form int8 sub-scales with float32 `scale_super`
    (`offset_super`) [out, nb / group] (`tile_arrays`).
    """

    tiled = True

    def __init__(self, values, scale, offset=None, scale_super=None, offset_super=None):
        if scale_super is None:
            super().__init__(values, scale, offset)
            self.scale_super = self.offset_super = None
            return
        self.values = QuantBuffer(jnp.asarray(values))
        self.scale = QuantBuffer(jnp.asarray(scale, jnp.int8))
        self.offset = None if offset is None else QuantBuffer(jnp.asarray(offset, jnp.int8))
        self.scale_super = QuantBuffer(jnp.asarray(scale_super, jnp.float32))
        self.offset_super = None if offset_super is None else QuantBuffer(jnp.asarray(offset_super, jnp.float32))

    @classmethod
    def from_block_quant(cls, packed: BlockQuant, compact: bool = True) -> TiledBlockQuant:
        return cls(*tile_arrays(packed.values[...], packed.scale[...], _get(packed.offset), compact))

    @property
    def compact(self) -> bool:
        """Whether the scales are int8 sub-scales with float32 super-scales."""
        return self.scale_super is not None

    def _parts(self) -> tuple:
        return tuple(_get(a) for a in (self.values, self.scale, self.offset, self.scale_super, self.offset_super))

    def _row_major(self, values, scale, offset, scale_super=None, offset_super=None) -> BlockQuant:
        off = None if offset is None else untile_blocks(offset, offset_super)
        return BlockQuant(untile_values(values), untile_blocks(scale, scale_super), off)

    def dequantized(self, live: jax.Array | None = None) -> jax.Array:
        return self._row_major(*self._parts()).dequantized(live)

    def rows(self, ids: jax.Array) -> jax.Array:
        """Rows `ids` (an embedding lookup): the tiles holding them, back to row-major, then the rows."""
        flat = ids.reshape(-1)

        def take(a):  # the tiles holding the rows, as [n * 16, per_row]
            if a is None:
                return None
            t = jnp.take(a.reshape(-1, LANES * a.shape[1]), flat // LANES, axis=0)
            return t.reshape(-1, a.shape[1])
        tiles = self._row_major(*map(take, self._parts()))
        own = jnp.arange(flat.shape[0]) * LANES + flat % LANES
        return tiles.rows(own).reshape(*ids.shape, self.shape[1])

    def matvec(self, x_1i: jax.Array, live: jax.Array | None = None) -> jax.Array:
        return native_kernels.block_quant_product(self, x_1i)

    def matmul_chunked(self, x_mi: jax.Array, chunk: int = 0) -> jax.Array:
        return native_kernels.block_quant_product(self, x_mi)

    def argmax_chunked(self, x_mi: jax.Array, chunk: int = 0) -> jax.Array:
        return argmax(native_kernels.block_quant_product(self, x_mi))

    def top_k_chunked(self, x_mi: jax.Array, r: int, chunk: int = 0) -> jax.Array:
        return jax.lax.top_k(native_kernels.block_quant_product(self, x_mi), r)[1]

    def gemv_columns(self, max_cols: int) -> int | None:
        return None


def tileable(packed: BlockQuant) -> bool:
    """Whether the int8 activation kernel takes this matrix (scaled int8 / 4-bit values, 16-row tiles, blocks)."""
    out, width = packed.shape
    q4 = packed.values.dtype == jnp.uint8
    return packed.scale is not None and _block(out, width, packed.n_blocks, q4) is not None


def tile_model(model, compact: bool = True) -> int:
    """Re-lays the packed matrices of `model` (linear maps, embedding, head) for the int8 activation kernel,
    in place, and returns how many it took. A matrix it cannot take (bfloat16, rows not a multiple of 16)
    stays as it is, multiplied with float32 activations; a tied embedding and head stay one object.
    `compact`: scales that factor exactly (GGUF K-quants) as int8 sub-scales (`tile_arrays`); False keeps
    every scale float32 (the same products, more bytes: for comparisons)."""
    from specjax.models.weight_formats import iter_linears

    done: dict[int, BlockQuant] = {}

    def tiled(packed):
        if packed is None or isinstance(packed, TiledBlockQuant) or not tileable(packed):
            return packed
        if id(packed) not in done:
            done[id(packed)] = TiledBlockQuant.from_block_quant(packed, compact)
        return done[id(packed)]

    for _, lin in iter_linears(model):
        lin.packed = tiled(lin.packed)
    model.embed_packed = tiled(model.embed_packed)
    model.head_quant = tiled(model.head_quant)
    if done:
        fixed_order_reductions(model)
    return len(done)


def fixed_order_reductions(model) -> None:
    """Puts `model`'s attention and RMS norms in the native fixed-order kernels (`native_kernels`).

    int8 rounding turns a last-place difference in x into a whole step now and then, so no sum that feeds
    an int8 product may depend on the program's shapes: then a verification block gives each position what a
    one-token step gives it, and greedy speculative decoding reproduces plain decoding bit for bit. Shapes the
    kernels do not take (widths not a multiple of 16) keep XLA's reductions.
    """
    for _, node in nnx.iter_modules(model):
        width = node.scale.shape[-1] if isinstance(node, RMSNorm) else node.h if isinstance(node, Attention) else 1
        if width % LANES == 0:
            node.fixed_order = True
