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

The kernel reads each matrix in tiles of 16 output rows (`tile_layout`, csrc/int8_activation_gemm.cc):
`tile_model` re-lays every packed matrix of a loaded model, in place, as a `TiledBlockQuant` (compact
scales where they are exact: the same products in fewer bytes). Every product of a tiled matrix
runs in the kernel, whatever its row count (prefill too); lookups (`rows`) and `dequantized` undo the
layout, so any other use stays correct.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models import native_kernels
from specjax.models.config import ConfigError
from specjax.models.layers import RMSNorm
from specjax.models.quant import BlockQuant, QuantBuffer, _get, device_array
from specjax.models.reductions import argmax
from specjax.models.tile_layout import LANES, kernel_block, tile_arrays, untile_blocks, untile_values
from specjax.models.transformer import Attention
from specjax.models.weight_formats import attach_packed

__all__ = ["ACTIVATION_CHOICES", "TiledBlockQuant", "check", "fixed_order_reductions", "laid_out", "resolve",
           "tile_model", "tileable"]

ACTIVATION_CHOICES = ("auto", "float32", "int8")


def resolve(activations: str, weights: str, dtype: str = "float32") -> str:
    """Checks an `activations=` option against the resolved `weights=` format and dtype (one clear line
    otherwise) and resolves "auto": int8 for int8 / q4 matrices in float32 where the kernels run (x86-64 with
    AVX2 + FMA or AVX-512 VNNI; llama.cpp's arithmetic, and since attention and norms sum in a fixed order, greedy
    speculation still reproduces plain decoding), float32 otherwise (float weights, bfloat16, accelerators)."""
    check(activations, weights, dtype)
    if activations != "auto":
        return activations
    takes = weights in ("int8", "q4") and dtype == "float32" and jax.default_backend() == "cpu"
    return "int8" if takes and native_kernels.int8_path_expected() else "float32"


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


class TiledBlockQuant(BlockQuant):
    """A BlockQuant laid out for the int8 activation kernel (`tile_layout`); every product goes through it.

    `scale` (`offset`) is float32, or in the compact form int8 sub-scales with float32 `scale_super`
    (`offset_super`) [out, nb / group].
    """

    tiled = True
    PARTS = ("values", "scale", "offset", "scale_super", "offset_super")  # `arrays`' keys, as far as present

    def __init__(self, values, scale, offset=None, scale_super=None, offset_super=None):
        as_buffer = lambda a: None if a is None else QuantBuffer(device_array(a))
        self.values, self.scale, self.offset = as_buffer(values), as_buffer(scale), as_buffer(offset)
        self.scale_super, self.offset_super = as_buffer(scale_super), as_buffer(offset_super)

    @classmethod
    def from_block_quant(cls, packed: BlockQuant, compact: bool = True) -> TiledBlockQuant:
        return cls(**tile_arrays(packed.values[...], packed.scale[...], _get(packed.offset), compact))

    @property
    def compact(self) -> bool:
        """Whether the scales are int8 sub-scales with float32 super-scales."""
        return self.scale_super is not None

    def _parts(self) -> tuple:
        return tuple(_get(a) for a in (self.values, self.scale, self.offset, self.scale_super, self.offset_super))

    def arrays(self) -> dict[str, jax.Array]:
        """The stored arrays by constructor argument name (what `TiledBlockQuant(**arrays)` takes back)."""
        return {k: a for k, a in zip(self.PARTS, self._parts(), strict=True) if a is not None}

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
    return packed.scale is not None and kernel_block(out, width, packed.n_blocks, q4) is not None


def laid_out(matrices: Iterable[tuple[str, BlockQuant]], compact: bool = True, progress=lambda s: None
             ) -> Iterator[tuple[str, TiledBlockQuant]]:
    """Each (name, packed matrix) of `matrices` that the int8 kernel takes, laid out for it, one at a time: with
    matrices that come one at a time too and a caller that keeps none, one layout is in memory at a time
    (`packed_cache.lay_out` writes each to the cache file, `tile_model` puts each in the model, freeing the
    one it replaces). Matrices laid out already come as they are; the others (bfloat16, rows not a multiple
    of 16) are skipped. `compact` as in `tile_model`; `progress` hears one line when there is work."""
    told = False
    for name, packed in matrices:
        if isinstance(packed, TiledBlockQuant):
            yield name, packed
        elif tileable(packed):
            if not told:
                progress("laying out matrices for int8 activations")
                told = True
            yield name, TiledBlockQuant.from_block_quant(packed, compact)


def _popped(matrices: dict) -> Iterator[tuple[str, BlockQuant]]:
    """The items of `matrices`, each taken out as it comes (so the dict does not keep a replaced one alive)."""
    for name in list(matrices):
        yield name, matrices.pop(name)


def tile_model(model, compact: bool = True, progress=lambda s: None) -> int:
    """Re-lays the packed matrices of `model` (linear maps, embedding, head) for the int8 activation kernel,
    in place, and returns how many are laid out for it (including any that already were: a model loaded from
    the tiled cache). A matrix it cannot take (bfloat16, rows not a multiple of 16) stays as it is, multiplied
    with float32 activations; a tied embedding and head stay one object.
    `compact`: scales that factor exactly (GGUF K-quants) as int8 sub-scales (`tile_layout`); False keeps
    every scale float32 (the same products, more bytes: for comparisons). `progress` hears one line when
    there is work to do."""
    from specjax.models.weight_formats import iter_linears, packed_matrices

    linears, count = dict(iter_linears(model)), 0
    for name, tiled in laid_out(_popped(packed_matrices(model)), compact, progress):  # the one replaced is freed
        attach_packed(model, {name: tiled}, linears)
        count += 1
    if count:
        fixed_order_reductions(model)
    return count


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
