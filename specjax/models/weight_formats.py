"""Weight formats chosen per load (`weights=`): matrices kept low-precision on the device.

Formats (what a matrix holds; from a GGUF file; from float weights):

- float32: float32 (the head also keeps its exact int8 copy, quant.py); dequantized; as is.
- bfloat16: bfloat16, no scale; rounded; rounded.
- int8: int8 + float32 scale (and offset) per block of `in`; the file's own integers (Q8_0, Q5_0,
  Q4_K, Q6_K: bit-identical to float32); symmetric per block of 32 (Q8_0's layout).
- q4: 4-bit pairs in uint8 + float32 scale and offset per 32; Q4_K blocks as they are, tensors the
  file stores in more bits as exact int8 (like the file itself); per group of 32, asymmetric.

Every linear map of the blocks, the embedding and the head take the format; norms and biases stay
float32. Inside the jitted step a matrix is dequantized and multiplied as the backend's
profile says (`backend_profile.profile_for`, the one backend switch):

- XLA:CPU: up to `BackendProfile.native_max_rows` rows go to specjax's native kernel (`native_kernels`)
  when it could be built. Otherwise XLA:CPU multiplies inside a `lax.scan` over blocks. The scan makes
  the product's input arrive computed (a loop boundary is opaque to fusion; fused into a gemv, XLA
  recomputed RMSNorm / GeGLU per output element, which made a fused int8 body slower than float32). One
  row (batch-1 decode) runs fused matrix-vector dots over (row block, column chunk) pairs, chunks under
  XLA's 16 KiB vector limit for fusing the conversion into the dot (`BlockQuant.gemv`: Qwen's 8,960-wide
  down projection went from ~5–20 ms to 1.3 ms). More rows convert one cache-sized block of ≥ 256 output
  rows at a time and multiply it, instead of packing a whole converted matrix for a GEMM (the multi-row
  cliff of docs/performance.md). The head's one-row product keeps its fused form (quant.py).
- Other backends dequantize and call one `dot_general` (XLA fuses the conversion on GPU / TPU).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from specjax.models import native_kernels
from specjax.models.backend_profile import one_row_padded, profile_for
from specjax.models.config import ConfigError
from specjax.models.quant import BlockQuant, block_quant_from_gguf

WEIGHT_FORMATS = ("float32", "bfloat16", "int8", "q4")
Q4_GROUP = 32


WEIGHT_CHOICES = ("auto", *WEIGHT_FORMATS)


def resolve_weights(name: str, gguf: bool = False) -> str:
    """Checks a `weights=` option (a clear message for anything else) and resolves "auto".

    "auto" is q4 for a GGUF file where a native kernel takes it (the float32 one, AVX-512; or the int8-activation
    path, AVX2 or AVX-512 VNNI, which `activations=auto` then picks): the file's own integers, bit-identical to
    float32's weights, and a step reads a quarter of the bytes (docs/performance.md); float32 otherwise (Hugging
    Face directories, whose q4 would be lossy; accelerators; no native kernel).
    """
    if name not in WEIGHT_CHOICES:
        raise ConfigError(f"weights={name!r} is not one of {', '.join(WEIGHT_CHOICES)}")
    if name != "auto":
        return name
    # The int8 path first: where it is expected, the float32 kernel (AVX-512) is not built just to decide this.
    native = native_kernels.int8_path_expected() or native_kernels.available()
    return "q4" if gguf and profile_for().native_max_rows > 0 and native else "float32"


def block_rows(out_dim: int, in_dim: int, block_bytes: int, min_rows: int = 1) -> int:
    """Output rows per converted block: the largest divisor of out_dim within block_bytes of float32 (or
    min_rows, if more), at most half of out_dim (a one-block scan is removed by XLA, and its fusion
    shield with it)."""
    target = max(1, min(max(block_bytes // (4 * in_dim), min_rows), out_dim // 2))
    for rows in range(target, 0, -1):
        if out_dim % rows == 0:
            return rows
    return out_dim


def packed_product(packed: BlockQuant, x: jax.Array) -> jax.Array:
    """x [..., in] @ Wᵀ → [..., out] in x's dtype, W the low-precision matrix (see module doc)."""
    prof = profile_for()
    o, i = packed.shape
    x_mi = x.reshape(-1, i)
    if native_kernels.applies(packed, x_mi.shape[0], prof.native_max_rows):
        return native_kernels.block_quant_product(packed, x_mi).astype(x.dtype).reshape(*x.shape[:-1], o)
    cols = packed.gemv_columns(prof.gemv_max_cols) if x_mi.shape[0] == 1 and prof.gemv_max_cols else None
    if cols is not None:
        y = packed.gemv(x_mi, block_rows(o, cols, prof.block_bytes), cols)
    elif prof.blockwise:
        y = packed.matmul_chunked(x_mi, block_rows(o, i, prof.block_bytes, prof.min_block_rows))
    else:
        w_oi = packed.dequantized().astype(x.dtype)
        y = one_row_padded(x_mi, lambda m: jax.lax.dot_general(m, w_oi, (((1,), (1,)), ((), ())),
                                                               preferred_element_type=jnp.float32))
    return y.astype(x.dtype).reshape(*x.shape[:-1], o)


# --- packing on the host, one matrix at a time -------------------------------------------------

def pack_matrix(w_oi: np.ndarray, fmt: str) -> dict[str, np.ndarray]:
    """Arrays of a BlockQuant holding w [out, in] in `fmt` ("bfloat16", "int8" or "q4"): quantized, int8 and
    q4 per group of 32 (see `pack_exact` for a GGUF tensor's own integers)."""
    if fmt == "bfloat16":
        return {"values": np.asarray(w_oi, np.float32).astype(ml_dtypes.bfloat16)}
    if fmt == "int8":
        return quantize_int8(w_oi)
    if fmt == "q4":
        return quantize_q4(w_oi)
    raise ConfigError(f"no packed form for weights={fmt!r}")


def pack_exact(tensor, fmt: str) -> dict[str, np.ndarray] | None:
    """The GGUF `tensor`'s own integers as a BlockQuant's arrays in `fmt`, or None (bfloat16, or a GGUF format
    `quant.block_quant_from_gguf` does not cover): int8, and 4 bits in q4 when they fit (Q4_K)."""
    exact = None if fmt == "bfloat16" else block_quant_from_gguf(tensor)
    if exact is not None and fmt == "q4" and "offset" in exact and exact["values"].min() >= 0 \
            and exact["values"].max() <= 15:
        exact["values"] = pack_nibbles(exact["values"].astype(np.uint8))
    return exact


def pack_nibbles(q_oi: np.ndarray) -> np.ndarray:
    """uint8 [out, in / 2]: column j in the low nibble, column j + in / 2 in the high one."""
    half = q_oi.shape[1] // 2
    return (q_oi[:, :half] | (q_oi[:, half:] << 4)).astype(np.uint8)


def quantize_int8(w_oi: np.ndarray, group: int = Q4_GROUP) -> dict[str, np.ndarray]:
    """Symmetric int8 per block of `group` columns (Q8_0's layout; group = in: per output channel).

    scale = max |w| / 127 per block, error ≤ scale / 2 per weight. Blocks of 32, not rows: on
    Gemma 3 270M per-row scales left the greedy continuation after 1–33 tokens on all four test
    prompts (max |Δlogit| 1.4–5.0; docs/performance.md), since a row's outliers set its step.
    """
    o, i = w_oi.shape
    group = math.gcd(group, i)
    g = np.asarray(w_oi, np.float32).reshape(o, i // group, group)
    scale = np.abs(g).max(axis=2) / 127.0
    safe = np.where(scale == 0, 1.0, scale)
    q = np.clip(np.rint(g / safe[:, :, None]), -127, 127).astype(np.int8).reshape(o, i)
    return {"values": q, "scale": scale.astype(np.float32)}


def quantize_q4(w_oi: np.ndarray) -> dict[str, np.ndarray]:
    """Asymmetric 4-bit per group along `in`: w ≈ q·scale − offset, q ∈ 0…15, offset = −min.

    Groups of Q4_GROUP (32) columns, fewer where in / 2 is not a multiple (each half of a row,
    packed into one nibble, must hold whole groups).
    """
    o, i = w_oi.shape
    if i % 2:
        raise ConfigError(f"weights=q4 needs even matrix widths, got {i}")
    group = math.gcd(Q4_GROUP, i // 2)
    g = np.asarray(w_oi, np.float32).reshape(o, i // group, group)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scale = (hi - lo) / 15.0
    safe = np.where(scale == 0, 1.0, scale)
    q = np.clip(np.rint((g - lo[:, :, None]) / safe[:, :, None]), 0, 15).astype(np.uint8).reshape(o, i)
    return {"values": pack_nibbles(q), "scale": scale.astype(np.float32), "offset": (-lo).astype(np.float32)}


def is_matrix(name: str) -> bool:
    """Whether parameter `name` (params.py naming) takes the weight format."""
    return name.endswith(".w") or name in ("embed", "head")


# --- attaching packed matrices to a model ------------------------------------------------------

def iter_linears(model) -> Iterator[tuple[str, object]]:
    """(parameter name of W, Linear module) for every linear map of the decoder blocks."""
    from flax import nnx

    from specjax.models.layers import Linear

    for path, node in nnx.iter_graph(model):
        if isinstance(node, Linear):
            yield ".".join(map(str, path)) + ".w", node


def attach_packed(model, packed: dict[str, BlockQuant], linears: dict | None = None) -> None:
    """Moves the named matrices of `model` to their packed forms, dropping the float32 Params.

    `packed` maps params.py names ("blocks.0.attn.q.w", "embed", "head") to BlockQuant [out, in];
    a tied model's head is its embedding, so the head reads the same buffers. `linears`: `dict(iter_linears(model))`
    when the caller has it (walking the model's graph costs ~40 ms: one walk per matrix was 8 s of a Qwen load).
    """
    for name, lin in (linears if linears is not None else dict(iter_linears(model))).items():
        if name in packed:
            lin.w = None
            lin.packed = packed[name]
    if "embed" in packed:
        model.embed = None
        model.embed_packed = packed["embed"]
        if model.cfg.tie_embeddings:
            model.head_quant = packed["embed"]
    if "head" in packed:
        model.head = None
        model.head_quant = packed["head"]


def packed_matrices(model) -> dict[str, BlockQuant]:
    """The inverse of `attach_packed`: the model's packed matrices by params.py name (a tied head is "embed")."""
    out = {name: lin.packed for name, lin in iter_linears(model) if lin.packed is not None}
    if model.embed_packed is not None:
        out["embed"] = model.embed_packed
    if model.head_quant is not None and model.head_quant is not model.embed_packed:
        out["head"] = model.head_quant
    return out


def pack_model(model, fmt: str) -> None:
    """Converts a float model's matrices to `fmt` in place (HF directories, tests; GGUF files
    convert per tensor from the file instead: packed_cache.py)."""
    if resolve_weights(fmt) == "float32":  # "auto" too: a float model's auto is float32
        return
    from specjax.models.params import model_weights

    weights = model_weights(model)
    packed = {}
    for name, w in weights.items():
        if is_matrix(name):
            w_oi = w.T if name.endswith(".w") else w
            packed[name] = BlockQuant.from_arrays(pack_matrix(np.ascontiguousarray(w_oi), fmt))
    attach_packed(model, packed)


def stored_bytes(model) -> int:
    """Bytes of every array the model keeps (a decode step reads about this much at batch 1)."""
    from flax import nnx

    return sum(int(np.prod(v.shape)) * jnp.dtype(v.dtype).itemsize
               for v in jax.tree.leaves(nnx.state(model)) if hasattr(v, "shape"))
