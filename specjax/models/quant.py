"""Low-precision matrices (`BlockQuant`), first made for an exact int8 copy of the output head.

`weights=int8|q4|bfloat16` (weight_formats.py) stores every matrix as a BlockQuant; the rest of this
note is about the head copy that float32 models keep.

At batch 1 a decode step is bound by reading weights, and Gemma 3 270M's tied
262,144 × 640 head is 62.6% of them: 671 MB per step in float32. GGUF stores it as Q8_0
(int8 values, one float16 scale per 32); the other formats of the embedded file (Q5_0,
Q4_K, Q6_K) likewise hold, per block of 16 or 32 weights, small integers q with
w = a·q (− b). Kept as int8 q plus float32 a (and b) the head costs ~190 MB per step, and
XLA:CPU fuses the int8 → float32 conversion into a 2-D [1, D] @ [V, D]ᵀ product: one
loop fusion, nothing materialised (27.7 vs 44.4 ms per step, docs/performance.md).

The head: a single row through the fused product, 2–64 rows (speculative verification,
batches) through `matmul_chunked`, which converts one block of rows at a time (a whole-table
conversion would be materialised). The decoder's own linear maps (weight_formats.packed_product)
take one row through `gemv` (fused matrix-vector dots inside a `lax.scan`, whose loop boundary
keeps the producer — RMSNorm, GeGLU — from being recomputed per output element) and more rows
through `matmul_chunked`. All paths hold bit-identical weights —
conversion checks it against the gguf package's dequantisation and keeps float32 only
otherwise — so the choice changes nothing but the order of a dot product's additions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.reductions import max_argmax

CHUNK_ROWS = 2048
# Gemma's head, argmax included (quiet 2-core CPU): 9 rows 41 vs 60 ms, 40 rows 107 vs 132 ms,
# 64 rows 166 vs 200 ms for the float32 GEMM; prefill-sized products stay float32.
MAX_CHUNKED_ROWS = 64


class QuantBuffer(nnx.Variable):
    """Derived, never-trained state (not matched by nnx.Param filters)."""


def device_array(a, dtype=None) -> jax.Array:
    """`a` as a jax array of `dtype` (default: its own). On the CPU backend a read-only numpy array that already
    has that dtype and is 64-byte aligned becomes the device array in place: a memory map of a cached weights file
    (`loading.read_safetensors`) stays file pages, which a start neither copies (a second 1.2 GB of Qwen's memory
    at load) nor reads before a step touches them. Anything else is copied, as `jnp.asarray` does: a writable
    array too, since its owner could change it under the model."""
    if (isinstance(a, np.ndarray) and not a.flags.writeable and (dtype is None or a.dtype == np.dtype(dtype))
            and jax.default_backend() == "cpu"):
        return jax.device_put(a, may_alias=True)
    return jnp.asarray(a, dtype)


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


def _affine_params(qtype_name: str, blocks: np.ndarray) -> tuple[int, np.ndarray, np.ndarray | None] | None:
    """(block size, scale [n, sub], offset [n, sub] or None) of GGUF blocks [n, bytes]."""
    import gguf

    if qtype_name in ("Q8_0", "Q5_0"):
        return 32, _f16(blocks[:, None, 0:2]), None
    if qtype_name == "Q4_K":
        sc, mn = gguf.quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        d, dmin = _f16(blocks[:, None, 0:2]), _f16(blocks[:, None, 2:4])
        # gguf computes (d·sc)·q − dmin·m: the same float32 operations as `dequantized`.
        return 32, d * sc.astype(np.float32), dmin * mn.astype(np.float32)
    if qtype_name == "Q6_K":
        scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
        return 16, _f16(blocks[:, None, 208:210]) * scales, None
    return None


class BlockQuant(nnx.Module):
    """A low-precision matrix [out, in]: values with a float32 scale (and offset) per block along `in`.

    values: int8 [out, in]; uint8 [out, in / 2] holding 4-bit integers (column j in the low
    nibble, column j + in / 2 in the high one, so unpacking is a concatenation, no interleave);
    or bfloat16 [out, in] without scale. w = values · scale (− offset), `scale` [out, nb] with
    nb blocks of in / nb columns (nb = 1: per output channel).
    """

    def __init__(self, values_oi, scale_ob=None, offset_ob=None):
        values = device_array(values_oi)
        if values.dtype not in (jnp.int8, jnp.uint8, jnp.bfloat16):
            raise ValueError(f"BlockQuant values must be int8, uint8 (4-bit pairs) or bfloat16, not {values.dtype}")
        self.values = QuantBuffer(values)
        self.scale = None if scale_ob is None else QuantBuffer(device_array(scale_ob, jnp.float32))
        self.offset = None if offset_ob is None else QuantBuffer(device_array(offset_ob, jnp.float32))

    @classmethod
    def from_arrays(cls, arrays) -> BlockQuant:
        """From a mapping with "values" and optional "scale" / "offset" (what `weight_formats.pack_matrix`,
        `block_quant_from_gguf` and the packed cache hold)."""
        return cls(arrays["values"], arrays.get("scale"), arrays.get("offset"))

    @property
    def n_blocks(self) -> int:
        """Scale blocks per row (1: per output channel, or no scale)."""
        return 1 if self.scale is None else self.scale.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the matrix the values stand for."""
        o, c = self.values.shape
        return o, c * 2 if self.values.dtype == jnp.uint8 else c

    def dequantized(self, live: jax.Array | None = None) -> jax.Array:
        values = self.values[...]
        if live is not None:
            # A no-op XLA cannot prove: inside a loop it ties the int8 → float32 conversion to
            # the loop variable, so loop-invariant code motion cannot hoist a float32 copy.
            values = jnp.where(live >= 0, values, jnp.zeros((), values.dtype))
        return _dequantize(values, _get(self.scale), _get(self.offset))

    def rows(self, ids: jax.Array) -> jax.Array:
        """Dequantized rows `ids` (any shape) → [*ids.shape, in]: an embedding lookup."""
        flat = ids.reshape(-1)
        take = lambda a: None if a is None else jnp.take(a[...], flat, axis=0)
        w = _dequantize(take(self.values), take(self.scale), take(self.offset))
        return w.reshape(*ids.shape, w.shape[-1])

    def matvec(self, x_1i: jax.Array, live: jax.Array | None = None) -> jax.Array:
        """[1, in] → [1, out]. Kept 2-D: that is the form XLA fuses (see module doc).

        XLA also fuses x's producer into the product's loop, recomputing it per output
        element; callers pass x across a loop boundary (the decode loop carries the hidden
        state) so that it arrives computed. `live`: see `dequantized`.
        """
        return x_1i.astype(jnp.float32) @ self.dequantized(live).T

    def matmul_chunked(self, x_mi: jax.Array, chunk: int = CHUNK_ROWS) -> jax.Array:
        """[M, in] → [M, out] for a few rows, converting `chunk` output rows at a time.

        A `lax.scan` over blocks of output rows: each step converts one int8 block to float32
        (2048 × 640 × 4 B = 5 MiB, cache-resident) and multiplies it. For 2–64 rows this is
        ~1.2–1.6× faster on XLA:CPU than the float32 product, which streams 671 MB and packs it
        for a GEMM (docs/performance.md). The scan's blocks depend on its counter, so XLA can
        neither hoist the conversion out of an enclosing loop nor materialise the whole table.
        """
        out_nmr = self._scan_blocks(x_mi, chunk, lambda y_mr: y_mr)
        return jnp.moveaxis(out_nmr, 0, 1).reshape(x_mi.shape[0], -1)

    def argmax_chunked(self, x_mi: jax.Array, chunk: int = CHUNK_ROWS) -> jax.Array:
        """argmax over `out` of `matmul_chunked(x_mi)` (int32 [M]), without materialising it.

        Each block reduces to its (max, first argmax); the first block holding the overall
        max wins, so ties resolve to the lowest index exactly like `jnp.argmax` of the full
        product. Greedy verification needs only this, and the full [M, 262144] argmax alone
        was ~7% of a speculative round.
        """
        def reduce(y_mr):
            return max_argmax(y_mr)

        max_nm, arg_nm = self._scan_blocks(x_mi, chunk, reduce)
        best_m = jnp.argmax(max_nm, axis=0)
        rows = self.shape[0] // max_nm.shape[0]
        local_m = jnp.take_along_axis(arg_nm, best_m[None, :], axis=0)[0]
        return (best_m * rows + local_m).astype(jnp.int32)

    def top_k_chunked(self, x_mi: jax.Array, r: int, chunk: int = CHUNK_ROWS) -> jax.Array:
        """Indices of the r largest entries of each row of `matmul_chunked(x_mi)` (int32 [M, r], best first).

        Each block keeps its own top r; the merge over the blocks' candidates (block-major, so ties
        resolve to the lowest index as in `jax.lax.top_k` and `argmax_chunked`: column 0 is the argmax).
        """
        def reduce(y_mr):
            val_mr, idx_mr = jax.lax.top_k(y_mr, r)
            return val_mr, idx_mr.astype(jnp.int32)

        val_nmr, idx_nmr = self._scan_blocks(x_mi, chunk, reduce)
        n, m, _ = val_nmr.shape
        rows = self.shape[0] // n
        idx_nmr = idx_nmr + (jnp.arange(n, dtype=jnp.int32) * rows)[:, None, None]
        flat = lambda a_nmr: jnp.moveaxis(a_nmr, 0, 1).reshape(m, n * r)
        _, pick_mr = jax.lax.top_k(flat(val_nmr), r)
        return jnp.take_along_axis(flat(idx_nmr), pick_mr, axis=1)

    def gemv(self, x_1i: jax.Array, rows: int, cols: int) -> jax.Array:
        """[1, in] → [1, out] as fused matrix-vector products over blocks of `rows` × `cols` values.

        XLA:CPU fuses a block's conversion into its matrix-vector dot (nothing materialised, the
        values read once) only while the vector is under 16 KiB (`gemv_columns`); past that it
        writes a transposed float32 copy of the block first, 10–20× slower (Qwen's 8,960-wide
        down projection). So the scan runs over (row block, column chunk) pairs and sums the
        chunks. 4-bit pairs are two parts (low nibbles: columns [0, in / 2), high: the rest), each
        its own dot: a concatenation of the nibbles inside the fused loop costs 2× (a select per
        value). Each part's dot is its own scan output, so XLA cannot fuse the sum into one of
        them (an output fusion would break the other's producer fusion).
        """
        values, scale, offset = self.values[...], _get(self.scale), _get(self.offset)
        out_dim, width = values.shape
        parts = (lambda v: v & 15, lambda v: v >> 4) if values.dtype == jnp.uint8 else (lambda v: v,)
        nb = self.n_blocks
        per_chunk = 1 if nb == 1 else cols * nb // self.shape[1]  # scale blocks per chunk
        n_rows, n_cols = out_dim // rows, width // cols
        x_pci = x_1i.astype(jnp.float32).reshape(len(parts), n_cols, cols)

        def block(_, k):
            r, c = k // n_cols, k % n_cols
            v = jax.lax.dynamic_slice(values, (r * rows, c * cols), (rows, cols))

            def blocks(a, p):
                if a is None:
                    return None
                start = 0 if nb == 1 else p * (nb // len(parts)) + c * per_chunk
                return jax.lax.dynamic_slice(a, (r * rows, start), (rows, per_chunk))

            return None, tuple(
                jax.lax.dynamic_index_in_dim(x_pci[p], c, 0) @ _affine(part(v), blocks(scale, p), blocks(offset, p)).T
                for p, part in enumerate(parts))

        outs = jax.lax.scan(block, None, jnp.arange(n_rows * n_cols))[1]  # parts × [n_rows · n_cols, 1, rows]
        return sum(outs).reshape(n_rows, n_cols, rows).sum(axis=1).reshape(1, out_dim)

    def gemv_columns(self, max_cols: int) -> int | None:
        """Columns per chunk for `gemv`: the widest divisor of a part's width within max_cols that holds
        whole scale blocks, or None when no chunk fits (then use `matmul_chunked`)."""
        width = self.values.shape[1]
        block = self.shape[1] // self.n_blocks  # columns per scale block
        for cols in range(min(width, max_cols), 0, -1):
            if width % cols == 0 and (self.n_blocks == 1 or cols % block == 0):
                return cols
        return None

    def _scan_blocks(self, x_mi: jax.Array, chunk: int, out_fn):
        """Stacks out_fn(x @ Wᵀ restricted to each block of `chunk` output rows) over the blocks."""
        o, i = self.shape
        rows = _chunk_rows(o, chunk)
        n = o // rows
        split = lambda a: None if a is None else a[...].reshape(n, rows, *a.shape[1:])
        x = x_mi.astype(jnp.float32)

        def block(_, args):
            w = _dequantize(*args)
            return None, out_fn(jax.lax.dot_general(x, w, (((1,), (1,)), ((), ()))))

        return jax.lax.scan(block, None, (split(self.values), split(self.scale), split(self.offset)))[1]


def _get(var):
    return None if var is None else var[...]


def _dequantize(values, scale, offset) -> jax.Array:
    """float32 [rows, in] from values [rows, in] (int8 / bfloat16) or [rows, in / 2] (uint8 4-bit pairs)."""
    if values.dtype == jnp.uint8:
        values = jnp.concatenate([values & 15, values >> 4], axis=-1)
    return _affine(values, scale, offset)


def _affine(values, scale, offset) -> jax.Array:
    """float32 values · scale (− offset), scale / offset [rows, nb] per block of in / nb columns."""
    w = values.astype(jnp.float32)
    if scale is None:
        return w
    r, i = w.shape
    nb = scale.shape[-1]
    w = w.reshape(r, nb, i // nb) * scale[:, :, None]
    if offset is not None:
        w = w - offset[:, :, None]
    return w.reshape(r, i)


def _chunk_rows(out_dim: int, chunk: int) -> int:
    """The largest divisor of out_dim that is ≤ chunk (the whole dimension if none ≥ 64 exists)."""
    for rows in range(min(chunk, out_dim), 63, -1):
        if out_dim % rows == 0:
            return rows
    return out_dim


def block_quant_from_gguf(tensor) -> dict[str, np.ndarray] | None:
    """Arrays of an exact BlockQuant for a gguf ReaderTensor, or None (format not covered).

    The file's own integers, unpacked from its blocks (no float pass: the gguf package's dequantisation of
    Qwen's matrices took 16 s of its first conversion), with the scales (and offsets) the gguf package
    multiplies them by, so values · scale (− offset) is its float32 dequantisation bit for bit. A Q8_0 block
    holding −128 is not covered (the int8 kernels take weights within ±127).
    """
    import gguf

    qtype = gguf.GGMLQuantizationType(tensor.tensor_type).name
    raw = np.asarray(tensor.data)
    if raw.dtype != np.uint8:
        return None
    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor.tensor_type)]
    out_dim = raw.shape[0]
    in_dim = raw.shape[1] // type_size * block_size
    blocks = raw.reshape(-1, type_size)
    params = _affine_params(qtype, blocks)
    if params is None:
        return None
    sub, a, b = params
    q = _block_integers(qtype, blocks)
    if q.min(initial=0) < -127:
        return None
    arrays = {"values": q.reshape(out_dim, in_dim), "scale": a.reshape(out_dim, in_dim // sub)}
    if b is not None:
        arrays["offset"] = b.reshape(out_dim, in_dim // sub)
    return arrays


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[..., k] bytes → [..., 2, k]: the low nibbles, then the high ones."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-2)


def _block_integers(qtype_name: str, blocks: np.ndarray) -> np.ndarray:
    """int8 [n, values per block]: the integers of GGUF blocks [n, bytes] in the order of their values."""
    n = len(blocks)
    if qtype_name == "Q8_0":
        return np.ascontiguousarray(blocks[:, 2:34]).view(np.int8)
    if qtype_name == "Q5_0":  # 16 bytes of low nibbles (values 0-15, then 16-31) and a 32-bit word of fifth bits
        high = np.unpackbits(np.ascontiguousarray(blocks[:, 2:6]), axis=1, bitorder="little")
        low = _nibbles(blocks[:, 6:22]).reshape(n, 32)
        return ((low | (high << 4)).astype(np.int16) - 16).astype(np.int8)
    if qtype_name == "Q4_K":  # 4 groups of 32 bytes: low nibbles are one sub-block, high nibbles the next
        return _nibbles(blocks[:, 16:144].reshape(n, 4, 32)).reshape(n, 256).astype(np.int8)
    if qtype_name == "Q6_K":  # 2 halves of 128 values: 64 bytes of low nibbles, 32 bytes of 2-bit pairs
        low = _nibbles(blocks[:, :128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)
        pairs = blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        return ((low | ((pairs & 3) << 4)).astype(np.int16) - 32).astype(np.int8).reshape(n, 256)
    raise ValueError(f"no integers for {qtype_name}")
