"""The int8-activation and fixed-order kernels on AVX2 (csrc/simd16.h): the same bits as on AVX-512.

Most x86-64 CPUs users have (laptops, AMD before Zen 4) have AVX2 and FMA but no AVX-512. The kernels are
written once on 16 lanes; `SPECJAX_NATIVE_ISA=avx2` builds the AVX2 form on this AVX-512 machine, and every
result must equal the AVX-512 form's bit for bit (the same lane operations, one horizontal-sum tree, exact
integer block sums), so a model decodes the same tokens on either kind of CPU.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx
from test_fixed_order import _arrays, _call
from test_native_kernels import LAYOUTS, _matrix, cpu_builds

from specjax.models import native_kernels, transformer, weight_formats
from specjax.models.int8_activations import TiledBlockQuant, tile_model

# Both forms build on x86-64 with AVX-512 VNNI (and so AVX2) and a C++ compiler.
needs_both = pytest.mark.skipif(not cpu_builds("avx512_vnni", "avx512bw", "avx2", "fma", "f16c"),
                                reason="needs an AVX-512 VNNI CPU to compare with the AVX2 form")


@pytest.fixture
def forms(monkeypatch):
    """Runs fn() under the native (AVX-512) build and under the AVX2 one; returns both results as numpy."""

    def run(fn):
        out = []
        for isa in ("native", "avx2"):
            monkeypatch.setenv(native_kernels.ISA_ENV, isa)
            native_kernels._load.cache_clear()
            assert native_kernels.int8_path_available(), native_kernels.unavailable_reason("int8")
            out.append(np.asarray(fn()))
        return out

    yield run
    monkeypatch.delenv(native_kernels.ISA_ENV, raising=False)
    native_kernels._load.cache_clear()


@needs_both
def test_the_avx2_form_is_a_different_library(monkeypatch):
    names = []
    for isa in ("native", "avx2"):
        monkeypatch.setenv(native_kernels.ISA_ENV, isa)
        native_kernels._load.cache_clear()
        names.append([native_kernels.target_name(k) for k in native_kernels.INT8_PATH])
    native_kernels._load.cache_clear()
    assert all(a != b for a, b in zip(*names, strict=True))


@needs_both
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("rows", [1, 3, 5, 9, 13])  # remainders of 8-row (AVX-512) and 4-row (AVX2) register tiles
def test_int8_products_are_bit_identical(forms, layout, rows):
    tiled = TiledBlockQuant.from_block_quant(_matrix(layout, 48, 128, seed=rows))
    x = np.random.default_rng(rows).standard_normal((rows, 128)).astype(np.float32) * 4
    x[0, :32] = 0.0  # an all-zero block: scale 0
    avx512, avx2 = forms(lambda: native_kernels.block_quant_product(tiled, jnp.asarray(x)))
    np.testing.assert_array_equal(avx2, avx512)


@needs_both
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("t, start", [(6, [9, 31]), (40, [3, 21])])
def test_attention_is_bit_identical(forms, window, t, start):
    q, kc, vc, kb, vb = _arrays(np.random.default_rng(t), 2, t, 64)
    q[1, 0] *= 40.0  # scores far apart: exp of large negative numbers, lanes that underflow to 0
    avx512, avx2 = forms(lambda: _call(q, kc, vc, kb, vb, start, window=window)[0])
    np.testing.assert_array_equal(avx2, avx512)


@needs_both
def test_rms_norm_is_bit_identical(forms):
    rng = np.random.default_rng(3)
    x, scale = rng.standard_normal((9, 96)).astype(np.float32) * 3, rng.standard_normal(96).astype(np.float32)
    avx512, avx2 = forms(lambda: native_kernels.fixed_order_rms_norm(jnp.asarray(x), jnp.asarray(scale), 1e-6))
    np.testing.assert_array_equal(avx2, avx512)


@needs_both
def test_a_tiled_model_gives_the_same_hidden_states(forms):
    """A prefill and a decoding block through every kernel of the int8 path."""
    model = transformer.Transformer(tiny_config(d_model=64, n_heads=4, head_dim=16, ffn_dim=128), rngs=nnx.Rngs(5))
    weight_formats.pack_model(model, "q4")
    tile_model(model)
    prompt, block = jnp.arange(3, 40)[None] % 50, jnp.asarray([[7, 19, 3, 3, 40, 11]])
    p = prompt.shape[1]

    def run():
        _, cache = model(prompt, jnp.arange(p)[None], model.init_cache(1, 64), jnp.zeros((1,), jnp.int32))
        hidden, _ = model(block, p + jnp.arange(6)[None], cache, jnp.asarray([p]))
        return hidden

    avx512, avx2 = forms(run)
    np.testing.assert_array_equal(avx2, avx512)
