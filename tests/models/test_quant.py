"""Exact int8 copies of GGUF-quantised weights."""

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models.quant import MAX_CHUNKED_ROWS, BlockQuant, block_quant_from_gguf, device_array


class FakeTensor:
    def __init__(self, w_oi: np.ndarray, qtype):
        self.tensor_type = qtype
        self.data = gguf.quants.quantize(w_oi, qtype)


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0])
def test_int8_copy_reproduces_gguf_dequantisation_bit_for_bit(qtype):
    w = np.random.default_rng(0).standard_normal((24, 64)).astype(np.float32)
    t = FakeTensor(w, qtype)
    arrays = block_quant_from_gguf(t)
    assert arrays is not None and arrays["values"].dtype == np.int8
    bq = BlockQuant.from_arrays(arrays)
    np.testing.assert_array_equal(np.asarray(bq.dequantized()), gguf.quants.dequantize(t.data, qtype))


def test_a_q8_0_block_holding_minus_128_is_not_copied():
    """The int8 kernels take weights within ±127: such a tensor is quantized from its float values instead."""
    t = FakeTensor(np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    assert block_quant_from_gguf(t) is not None
    t.data = t.data.copy()
    t.data[2, 2 + 34 + 5] = 0x80  # row 2, second block, sixth value: −128
    assert block_quant_from_gguf(t) is None


def test_unsupported_formats_are_left_in_float32():
    t = FakeTensor(np.ones((4, 32), np.float32), gguf.GGMLQuantizationType.F16)
    assert block_quant_from_gguf(t) is None


def test_head_uses_the_copy_for_one_row_only_and_agrees(tiny_model):
    from specjax.models.params import build_model, model_weights

    weights = model_weights(tiny_model)
    t = FakeTensor(weights["embed"], gguf.GGMLQuantizationType.Q8_0)
    weights["embed"] = gguf.quants.dequantize(t.data, t.tensor_type)
    model = build_model(tiny_model.cfg, weights)
    h = jnp.asarray(np.random.default_rng(2).standard_normal((3, 1, 32)), jnp.float32)
    ref_one, ref_many = model.logits(h[:1]), model.logits(h)
    arrays = block_quant_from_gguf(t)
    model.head_quant = BlockQuant(arrays["values"], arrays["scale"])
    np.testing.assert_allclose(model.logits(h[:1]), ref_one, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(model.logits(h[:1], live=jnp.int32(3)), ref_one, rtol=1e-6, atol=1e-5)
    # A few rows: the block-wise int8 product on CPU (same weights, other summation order).
    np.testing.assert_allclose(model.logits(h), ref_many, rtol=1e-6, atol=1e-5)
    many = jnp.asarray(np.random.default_rng(3).standard_normal((1, MAX_CHUNKED_ROWS + 1, 32)), jnp.float32)
    ref = model.logits(many)
    model.head_quant = None
    np.testing.assert_array_equal(ref, model.logits(many))  # beyond MAX_CHUNKED_ROWS: the float32 table


@pytest.mark.parametrize("with_offset", [False, True])
def test_chunked_product_equals_the_dequantised_product(with_offset):
    rng = np.random.default_rng(4)
    values = rng.integers(-127, 128, (512, 64)).astype(np.int8)
    scale = rng.random((512, 2)).astype(np.float32)
    offset = rng.random((512, 2)).astype(np.float32) if with_offset else None
    bq = BlockQuant(values, scale, offset)
    x = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)
    want = np.asarray(x) @ np.asarray(bq.dequantized()).T
    for chunk in (128, 100, 2048):  # four blocks; a non-divisor (→ 64-row blocks); one block
        np.testing.assert_allclose(bq.matmul_chunked(x, chunk), want, rtol=1e-5, atol=1e-3)


@pytest.mark.real_model
def test_every_quantised_tensor_of_the_embedded_model_is_covered():
    """The head is what is used; every format of the file being covered keeps it general."""
    from specjax.models.gguf_loader import open_gguf
    from specjax.models.loading import default_model_path

    reader = open_gguf(default_model_path())
    quantised = [t for t in reader.tensors if t.tensor_type != gguf.GGMLQuantizationType.F32]
    kinds = {gguf.GGMLQuantizationType(t.tensor_type).name for t in quantised}
    assert kinds == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    for t in quantised:
        arrays = block_quant_from_gguf(t)
        assert arrays is not None, t.name


def test_chunked_argmax_equals_argmax_of_the_product_ties_included():
    rng = np.random.default_rng(5)
    values = rng.integers(-3, 4, (512, 64)).astype(np.int8)  # few distinct values: many exact ties
    values[[7, 300, 301]] = 3  # the same (largest) row three times: the first must win
    bq = BlockQuant(values, np.ones((512, 2), np.float32))
    x = jnp.asarray(np.concatenate([np.ones((1, 64)), rng.standard_normal((4, 64))]), jnp.float32)
    want = np.argmax(np.asarray(bq.matmul_chunked(x, 128)), axis=1)
    assert want[0] == 7
    np.testing.assert_array_equal(bq.argmax_chunked(x, 128), want)


def test_chunked_top_k_equals_top_k_of_the_product_and_its_first_column_the_argmax():
    rng = np.random.default_rng(6)
    values = rng.integers(-3, 4, (512, 64)).astype(np.int8)
    values[[7, 300, 301]] = 3  # tied best rows in two blocks: lowest index first, as jax.lax.top_k orders them
    bq = BlockQuant(values, np.ones((512, 2), np.float32))
    x = jnp.asarray(np.concatenate([np.ones((1, 64)), rng.standard_normal((4, 64))]), jnp.float32)
    product = bq.matmul_chunked(x, 128)
    for r in (1, 3, 8):
        got = np.asarray(bq.top_k_chunked(x, r, 128))
        np.testing.assert_array_equal(got, np.asarray(jax.lax.top_k(product, r)[1]))
        np.testing.assert_array_equal(got[:, 0], bq.argmax_chunked(x, 128))
    assert np.asarray(bq.top_k_chunked(x, 3, 128))[0].tolist() == [7, 300, 301]


def test_device_array_takes_an_aligned_host_buffer_in_place_and_copies_anything_else(tmp_path):
    """A read-only, 64-byte aligned numpy array of the wanted dtype (a view of a weights file's memory map) becomes
    the device array without a copy; a misaligned view, a dtype change or a writable array is copied, with the
    same values. Other backends always copy (to the device)."""
    on_cpu = jax.default_backend() == "cpu"
    path = tmp_path / "w.bin"
    np.arange(1024, dtype=np.float32).tofile(path)
    mapped = np.memmap(path, np.uint8, mode="r")
    aligned, misaligned = mapped[64:576].view(np.float32), mapped[4:516].view(np.float32)
    assert aligned.ctypes.data % 64 == 0 and misaligned.ctypes.data % 64 != 0
    cases = [(aligned, None, True), (aligned, jnp.float32, True), (misaligned, None, False),
             (aligned, jnp.bfloat16, False), (np.asarray(aligned).tolist(), jnp.float32, False)]
    writable = np.memmap(path, np.uint8, mode="c")[64:576].view(np.float32)  # copy-on-write: same pages, writable
    assert writable.ctypes.data % 64 == 0 and writable.flags.writeable
    assert device_array(writable).unsafe_buffer_pointer() != writable.ctypes.data
    for host, dtype, in_place in cases:
        got = device_array(host, dtype)
        assert (got.unsafe_buffer_pointer() == aligned.ctypes.data) == (in_place and on_cpu)
        want = np.asarray(host, np.float32)
        np.testing.assert_array_equal(np.asarray(got, np.float32), want.astype(got.dtype).astype(np.float32))
