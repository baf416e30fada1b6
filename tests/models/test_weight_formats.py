"""weights=bfloat16|int8|q4: packing error bounds, the packed forward against the dequantized
weights' float forward, one row against many, the GGUF conversion cache, and the backend profile."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import full_logits, tiny_config
from flax import nnx

import specjax.models.transformer as transformer
import specjax.models.weight_formats as wf
from specjax.models.backend_profile import ACCELERATOR
from specjax.models.config import ConfigError
from specjax.models.params import build_model, model_weights
from specjax.models.quant import BlockQuant, _dequantize
from specjax.models.transformer import Transformer

FORMATS = ("bfloat16", "int8", "q4")


def dequantized_np(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """float32 [out, in] of packed arrays, computed here in numpy (independent of quant.py)."""
    v = arrays["values"]
    if v.dtype == np.uint8:
        v = np.concatenate([v & 15, v >> 4], axis=1)
    w = v.astype(np.float32)
    if "scale" not in arrays:
        return w
    o, i = w.shape
    nb = arrays["scale"].shape[1]
    w = w.reshape(o, nb, i // nb) * arrays["scale"][:, :, None]
    if "offset" in arrays:
        w = w - arrays["offset"][:, :, None]
    return w.reshape(o, i)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(48, 64), (8, 32), (5, 20)])
def test_round_trip_error_is_within_half_a_step(fmt, shape):
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 0.1
    arrays = wf.pack_matrix(w, fmt)
    back = dequantized_np(arrays)
    np.testing.assert_array_equal(np.asarray(_dequantize(*(jnp.asarray(arrays[k]) if k in arrays else None
                                                         for k in ("values", "scale", "offset")))), back)
    if fmt == "bfloat16":
        bound = np.abs(w) * 2.0**-8
    else:
        step = np.repeat(arrays["scale"], w.shape[1] // arrays["scale"].shape[1], axis=1)
        bound = step / 2 * (1 + 1e-5) + 1e-7
        assert arrays["values"].dtype == (np.int8 if fmt == "int8" else np.uint8)
        assert arrays["values"].shape[1] == (w.shape[1] if fmt == "int8" else w.shape[1] // 2)
    assert np.all(np.abs(back - w) <= bound)
    # and not trivially: the format does lose precision
    assert np.abs(back - w).max() > 0


def test_q4_uses_all_sixteen_levels_and_groups_of_32():
    w = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)
    arrays = wf.pack_matrix(w, "q4")
    assert arrays["scale"].shape == (4, 4)
    q = np.concatenate([arrays["values"] & 15, arrays["values"] >> 4], axis=1)
    assert q.min() == 0 and q.max() == 15


def gguf_blocks(qtype, rows: int, cols: int, seed: int = 2) -> np.ndarray:
    """Raw GGUF blocks [rows, bytes]: gguf-py quantizes Q8_0 itself; Q5_0 and K-quant blocks are random bytes
    with sane float16 (super-)block scales."""
    rng = np.random.default_rng(seed)
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for at in {"Q4_K": (0, 2), "Q6_K": (208,)}.get(qtype.name, (0,)):
        raw[:, :, at:at + 2] = d
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype, fmt, values_dtype", [
    (gguf.GGMLQuantizationType.Q8_0, "int8", np.int8), (gguf.GGMLQuantizationType.Q8_0, "q4", np.int8),
    (gguf.GGMLQuantizationType.Q4_K, "q4", np.uint8), (gguf.GGMLQuantizationType.Q4_K, "int8", np.int8),
    (gguf.GGMLQuantizationType.Q6_K, "q4", np.int8), (gguf.GGMLQuantizationType.Q5_0, "int8", np.int8),
    (gguf.GGMLQuantizationType.Q5_0, "q4", np.int8)])
def test_gguf_blocks_are_kept_exactly(qtype, fmt, values_dtype):
    """Random blocks (every bit pattern of the integers and sub-block scales) unpacked without a float pass
    reproduce the gguf package's float32 dequantisation bit for bit."""
    class Tensor:
        tensor_type = qtype
        data = gguf_blocks(qtype, rows=8, cols=512)

    w = gguf.quants.dequantize(Tensor.data, qtype)
    arrays = wf.pack_exact(Tensor, fmt)
    assert arrays["values"].dtype == values_dtype
    np.testing.assert_array_equal(dequantized_np(arrays), w)


def test_unknown_format_is_refused_clearly():
    with pytest.raises(ConfigError, match="weights='int3' is not one of auto, float32, bfloat16, int8, q4"):
        wf.resolve_weights("int3")


def packed_and_reference(fmt: str, seed: int = 0, **cfg_changes):
    """(a tiny model in `fmt`, the float32 model holding exactly its dequantized weights)."""
    model = Transformer(tiny_config(**cfg_changes), rngs=nnx.Rngs(seed))
    weights = model_weights(model)
    wf.pack_model(model, fmt)
    ref = dict(weights)
    for name in weights:
        if wf.is_matrix(name):
            packed = model.embed_packed if name == "embed" else (
                model.head_quant if name == "head" else dict(wf.iter_linears(model))[name].packed)
            deq = np.asarray(packed.dequantized())
            ref[name] = deq.T if name.endswith(".w") else deq
    return model, build_model(model.cfg, ref)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tied", [True, False])
def test_packed_forward_equals_the_float_forward_of_its_dequantized_weights(fmt, tied):
    model, ref = packed_and_reference(fmt, tie_embeddings=tied, qkv_bias=not tied)
    assert model.embed is None and all(lin.w is None for _, lin in wf.iter_linears(model))
    assert (model.head_quant is model.embed_packed) == tied
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 64, (2, 9)), jnp.int32)
    np.testing.assert_allclose(full_logits(model, tokens), full_logits(ref, tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_row_equals_many_rows(fmt):
    """Batch-1 decode and k+1 / batch-8 verification read the same weights the same way."""
    model, _ = packed_and_reference(fmt)
    h = jnp.asarray(np.random.default_rng(4).standard_normal((8, 9, 32)), jnp.float32)
    many = jax.jit(lambda m, x: m.logits(x))(model, h)
    for b, t in [(0, 0), (3, 5), (7, 8)]:
        one = jax.jit(lambda m, x: m.logits(x, live=jnp.int32(0)))(model, h[b:b + 1, t:t + 1])
        np.testing.assert_allclose(one[0, 0], many[b, t], rtol=1e-5, atol=1e-5)
    lin = model.blocks[0].mlp.up
    rows = jax.jit(lambda m, x: m(x))(lin, h)
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(lin, h[2:3, 4:5])[0, 0], rows[2, 4], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["int8", "q4"])
def test_accelerator_profile_computes_the_same_product(fmt, monkeypatch):
    model, _ = packed_and_reference(fmt)
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, 64, (2, 7)), jnp.int32)
    cpu = full_logits(model, tokens)
    # Every module that asks for the profile gets the accelerators' one (plain dequantize + dot).
    for module in (wf, transformer):
        monkeypatch.setattr(module, "profile_for", lambda backend=None: ACCELERATOR)
    assert not ACCELERATOR.blockwise
    np.testing.assert_allclose(full_logits(model, tokens), cpu, rtol=1e-5, atol=1e-5)


def random_packed(fmt: str, shape: tuple[int, int], group: int = 32) -> dict[str, np.ndarray]:
    w = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    return wf.quantize_int8(w, group) if fmt == "int8" else wf.pack_matrix(w, fmt)


@pytest.mark.parametrize("fmt,group,max_cols,cols", [
    ("int8", 32, 64, 64), ("int8", 256, 100, 64), ("int8", 256, 4095, 256), ("int8", 32, 4095, 256),
    ("q4", 32, 64, 64), ("q4", 32, 4095, 128), ("bfloat16", 32, 80, 64)])
def test_gemv_in_column_chunks_equals_the_dequantized_product(fmt, group, max_cols, cols):
    """One-row products summed over (row block, column chunk) pairs, 4-bit halves as two parts."""
    arrays = random_packed(fmt, (96, 256), group)
    packed = BlockQuant.from_arrays(arrays)
    assert packed.gemv_columns(max_cols) == cols
    x = np.random.default_rng(7).standard_normal((1, 256)).astype(np.float32)
    y = jax.jit(lambda p, x: p.gemv(x, 24, cols))(packed, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(y), x @ dequantized_np(arrays).T, rtol=1e-5, atol=1e-4)


def unfused_dots(hlo: str) -> int:
    """Dots in optimised HLO whose computation converts nothing: their matrix was materialised in float32."""
    count, body = 0, []
    for line in hlo.splitlines():
        if line.endswith("{") and not line.startswith(" "):
            body = []
        elif line == "}":
            count += any(" dot(" in b for b in body) and not any(" convert(" in b for b in body)
        else:
            body.append(line)
    return count


@pytest.mark.parametrize("fmt", ["int8", "q4"])
def test_one_row_products_convert_inside_the_dot_even_when_wide(fmt):
    """Past 4,095 columns XLA:CPU stops fusing the conversion into a one-row dot and writes a transposed
    float32 copy of every block (~15× slower); `gemv` chunks the columns so every dot stays fused."""
    packed = BlockQuant.from_arrays(random_packed(fmt, (64, 8960)))
    x = jnp.ones((1, 8960), jnp.float32)

    def hlo(fn):
        return jax.jit(fn).lower(packed, x).compile().as_text()

    assert unfused_dots(hlo(wf.packed_product)) == 0
    assert unfused_dots(hlo(lambda p, x: p.matmul_chunked(x, 32))) > 0  # the check can fail


def test_gemv_columns_refuses_chunks_that_split_a_scale_block():
    packed = BlockQuant.from_arrays(random_packed("int8", (8, 256), 128))
    assert packed.gemv_columns(100) is None
    assert packed.gemv_columns(128) == 128


def test_block_rows_never_make_a_one_block_scan():
    assert wf.block_rows(2048, 640, 1 << 20) == 256
    assert wf.block_rows(256, 640, 1 << 20) == 128  # fits one block, split in two
    assert wf.block_rows(151936, 1536, 1 << 20) == 128  # 151936 = 2^7 · 1187
    assert wf.block_rows(7, 4, 1 << 20) == 1


def test_packed_models_store_fewer_bytes():
    sizes = {}
    for fmt in ("float32", *FORMATS):
        model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
        wf.pack_model(model, fmt)
        sizes[fmt] = wf.stored_bytes(model)
    assert sizes["q4"] < sizes["int8"] < sizes["bfloat16"] < sizes["float32"]


def test_block_quant_refuses_float32_values():
    with pytest.raises(ValueError, match="int8, uint8"):
        BlockQuant(np.zeros((2, 2), np.float32))


def test_auto_is_the_files_own_integers_where_the_native_kernel_runs(monkeypatch):
    """weights=auto: q4 for GGUF files (bit-identical weights) when a CPU kernel takes them; float32 for float
    checkpoints (q4 would be lossy), on accelerators and without the kernel."""
    import dataclasses

    from specjax.models import backend_profile, native_kernels
    from specjax.models.loading import resolved_weights

    native = native_kernels.available() or native_kernels.int8_path_available()
    assert wf.resolve_weights("auto", gguf=True) == ("q4" if native else "float32")
    assert wf.resolve_weights("auto", gguf=False) == "float32"
    assert resolved_weights(None, "auto") == resolved_weights("x.gguf", "auto") == wf.resolve_weights("auto", True)
    assert resolved_weights("/some/hf_dir", "auto") == "float32"
    assert resolved_weights(None, "int8") == "int8" and resolved_weights("/some/hf_dir", "q4") == "q4"
    monkeypatch.setattr(wf, "profile_for", lambda backend=None: backend_profile.ACCELERATOR)
    assert wf.resolve_weights("auto", gguf=True) == "float32"
    monkeypatch.setattr(wf, "profile_for", lambda backend=None: dataclasses.replace(backend_profile.CPU))
    # An AVX2 CPU: no float32 kernel (AVX-512 code), the int8-activation path builds: q4, for activations=auto.
    monkeypatch.setattr(native_kernels, "_load", lambda kind="float32": (None, "no AVX-512") if kind == "float32"
                        else (f"target_{kind}", None))
    assert wf.resolve_weights("auto", gguf=True) == "q4"
    monkeypatch.setattr(native_kernels, "_load", lambda kind="float32": (None, "no compiler"))
    assert wf.resolve_weights("auto", gguf=True) == "float32"
