"""Backend profiles (`decode/backend.py`): chosen once per backend, and value-neutral — the accelerator
profile (no CPU workarounds, first iteration peeled for the clock) gives CPU's tokens, run on CPU."""

from __future__ import annotations

import jax
import pytest
from conftest import ByteTokenizer

from specjax.decode import GenerateConfig, Generator, SamplingConfig, SpecConfig, SpeculativeGenerator, loop
from specjax.decode.backend import ACCELERATOR, CPU, profile_for
from specjax.models.kv_cache import IN_PLACE_COMPILER_OPTIONS

PROMPTS = ["abcabcabc", "hello hello", "xyz", "the cat the cat"]


def test_each_backend_selects_its_profile():
    assert profile_for("cpu") is CPU
    assert profile_for("gpu") is ACCELERATOR and profile_for("tpu") is ACCELERATOR
    assert profile_for() is (CPU if jax.default_backend() == "cpu" else ACCELERATOR)
    assert CPU.options == IN_PLACE_COMPILER_OPTIONS and ACCELERATOR.options == {}
    assert CPU.int8_head and CPU.live_counter and CPU.head_barrier and CPU.first_token_cond
    assert not (ACCELERATOR.int8_head or ACCELERATOR.live_counter or ACCELERATOR.head_barrier
                or ACCELERATOR.first_token_cond)
    assert ACCELERATOR.live(jax.numpy.int32(3)) is None
    assert CPU.min_product_rows == 0 and ACCELERATOR.min_product_rows == 8
    assert CPU.spec_min_accept == 2.0 and ACCELERATOR.spec_min_accept == 1.0


@pytest.mark.parametrize("shape", [(32,), (1, 32), (1, 1, 32), (3, 32), (2, 1, 32)])
def test_one_row_products_run_on_eight_rows_under_the_accelerator_profile(monkeypatch, shape):
    """The padding changes the product's shape XLA sees, not its values; more rows are left as they are."""
    import jax.numpy as jnp

    from specjax.models import backend_profile

    x = jax.random.normal(jax.random.key(0), shape)
    w = jax.random.normal(jax.random.key(1), (32, 48))
    want = jnp.einsum("...i,io->...o", x, w)
    monkeypatch.setattr(backend_profile, "profile_for", lambda backend=None: ACCELERATOR)
    fn = lambda x, w: backend_profile.one_row_product(x, w)  # a new function: nothing cached from other tests
    got = jax.jit(fn)(x, w)
    assert got.shape == want.shape
    assert jnp.allclose(got, want, rtol=1e-5, atol=1e-5)
    hlo = jax.jit(fn).lower(x, w).as_text()
    assert ("tensor<8x32xf32>" in hlo) == (x.size == 32)


def test_a_one_token_forward_keeps_its_logits_with_padded_products(monkeypatch, tiny_model):
    import jax.numpy as jnp

    from specjax.models import backend_profile

    tokens, positions = jnp.array([[5]], jnp.int32), jnp.array([[0]], jnp.int32)
    want = tiny_model.logits(tiny_model(tokens, positions)[0])
    monkeypatch.setattr(backend_profile, "profile_for", lambda backend=None: ACCELERATOR)
    got = tiny_model.logits(tiny_model(tokens, positions)[0])
    assert jnp.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.8, top_p=0.9, seed=4)],
                         ids=["greedy", "sampled"])
def test_plain_decoding_gives_the_same_tokens_under_both_profiles(tiny_model, sampling):
    cfg = GenerateConfig(max_new_tokens=12, batch_size=2, sampling=sampling, ignore_eos=True)
    got = {}
    for profile in (CPU, ACCELERATOR):
        gen = Generator(tiny_model, ByteTokenizer(), profile=profile)
        loop.CLOCK.t = None
        outs, stats = gen.generate(PROMPTS, cfg)
        got[profile.name] = [o.tokens for o in outs]
        assert loop.CLOCK.t is not None and stats.ttft_ms > 0  # the first-token clock fired either way
        assert all(len(t) == 12 for t in got[profile.name])
    assert got["cpu"] == got["accelerator"]


def test_speculative_decoding_gives_the_same_tokens_under_both_profiles(tiny_model):
    cfg = GenerateConfig(max_new_tokens=12, batch_size=2, ignore_eos=True)
    got = {}
    for profile in (CPU, ACCELERATOR):
        gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), profile=profile)
        got[profile.name] = [o.tokens for o in gen.generate(PROMPTS, cfg, SpecConfig(k=3, adaptive=False))[0]]
    plain = [o.tokens for o in Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, cfg)[0]]
    assert got["cpu"] == got["accelerator"] == plain


def test_the_accelerator_profile_drops_the_int8_head_copy_and_keeps_the_tokens():
    import numpy as np
    from conftest import tiny_config
    from flax import nnx

    from specjax.models.quant import BlockQuant
    from specjax.models.transformer import Transformer

    model = Transformer(tiny_config(), rngs=nnx.Rngs(2))
    rng = np.random.default_rng(0)
    v, d = model.cfg.vocab_size, model.cfg.d_model
    values = rng.integers(-127, 128, (v, d)).astype(np.int8)
    scale = np.full((v, 1), 2.0 ** -6, np.float32)
    assert model.head is None  # tied: the embedding is the head table
    model.embed[...] = jax.numpy.asarray(values * scale)  # exactly what the int8 copy holds
    model.head_quant = BlockQuant(values, scale)
    cfg = GenerateConfig(max_new_tokens=10, batch_size=1, ignore_eos=True)  # one row: the int8 product
    cpu, acc = Generator(model, ByteTokenizer(), profile=CPU), Generator(model, ByteTokenizer(), profile=ACCELERATOR)
    assert cpu.model.head_quant is not None and acc.model.head_quant is None
    assert model.head_quant is not None  # the caller's model is left as it was
    prompts = PROMPTS[:2]
    assert [o.tokens for o in cpu.generate(prompts, cfg)[0]] == [o.tokens for o in acc.generate(prompts, cfg)[0]]


def test_the_fusion_fence_keeps_values_and_survives_compilation():
    """The CPU profile's fence before the one-row head (`fusion_fence`) is a one-trip while loop XLA can
    neither inline nor see through (an optimization barrier is removed before fusion on CPU)."""
    import jax.numpy as jnp
    import numpy as np

    from specjax.models.backend_profile import fusion_fence

    x = np.random.default_rng(0).normal(size=(1, 1, 64)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(64, 512)).astype(np.float32)
    with_nan = np.where(np.arange(64) == 0, np.nan, x).astype(np.float32)
    for value in (x, with_nan):
        for counter in (0, 7, -1):  # a loop counter (one trip), and a negative one (no trip)
            np.testing.assert_array_equal(np.asarray(jax.jit(fusion_fence)(value, jnp.int32(counter))), value)

    def head(x, w, steps):
        return CPU.head_input(x * jax.lax.rsqrt(jnp.mean(x * x)), steps) @ w

    text = jax.jit(head).lower(x, w, jnp.int32(3)).compile().as_text()
    assert " while(" in text  # not inlined: the norm cannot be fused into the product
    np.testing.assert_allclose(np.asarray(jax.jit(head)(x, w, jnp.int32(3))), (x / np.sqrt(np.mean(x * x))) @ w,
                               rtol=1e-5, atol=1e-5)
    assert ACCELERATOR.head_input(x, jnp.int32(3)) is x


def test_packed_one_row_products_run_on_eight_rows_under_the_accelerator_profile(monkeypatch):
    """Packed weights take the accelerator's dequantize-and-multiply path, padded like float ones."""
    import jax.numpy as jnp
    import numpy as np

    from specjax.models import backend_profile, weight_formats
    from specjax.models.quant import BlockQuant

    rng = np.random.default_rng(0)
    packed = BlockQuant(rng.integers(-127, 128, (48, 32)).astype(np.int8), np.full((48, 1), 2.0 ** -6, np.float32))
    x = jax.random.normal(jax.random.key(0), (1, 1, 32))
    for module in (backend_profile, weight_formats):
        monkeypatch.setattr(module, "profile_for", lambda backend=None: ACCELERATOR)
    fn = lambda x: weight_formats.packed_product(packed, x)
    got = jax.jit(fn)(x)
    want = x.reshape(1, 32) @ packed.dequantized().T
    assert got.shape == (1, 1, 48) and jnp.allclose(got.reshape(1, 48), want, rtol=1e-5, atol=1e-5)
    assert "tensor<8x32xf32>" in jax.jit(fn).lower(x).as_text()
