"""Chunked prefill (`loop.prefill` with max_chunk): long prompts run in blocks equal one block."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import loop
from specjax.decode.backend import CPU
from specjax.decode.generate import GenerateConfig, Generator
from specjax.decode.shapes import prompt_bucket


@pytest.mark.parametrize(("t", "max_chunk", "chunk"), [(16, 512, 16), (512, 512, 512), (768, 512, 256),
                                                      (1536, 512, 512), (8192, 512, 512), (48, 16, 16),
                                                      (96, 16, 16), (24, 16, 8)])
def test_chunk_is_the_largest_power_of_two_dividing_the_bucket(t, max_chunk, chunk):
    assert loop.prefill_chunk(t, max_chunk) == chunk
    assert t % chunk == 0


def test_every_prompt_bucket_is_cut_into_blocks_of_at_least_a_quarter_chunk():
    for n in range(1, 20_000, 37):
        t = prompt_bucket(n)
        assert loop.prefill_chunk(t, 512) >= min(t, 128)  # 3 * 2^k buckets: blocks of 2^k


@pytest.mark.parametrize("max_chunk", [8, 16])
def test_blocks_equal_one_block_with_ragged_rows_and_a_sliding_window(tiny_model, max_chunk):
    """The tiny model's window (4) is shorter than a block, so local layers must mask across blocks."""
    b, t, slots = 3, 48, 56
    rng = np.random.default_rng(0)
    prompt_bt = jnp.asarray(rng.integers(3, 64, (b, t)), jnp.int32)
    len_b = jnp.asarray([48, 30, 7], jnp.int32)
    run = jax.jit(loop.prefill, static_argnums=(4, 5))
    one = run(tiny_model, tiny_model.init_cache(b, slots), prompt_bt, len_b, None, (0, 2))  # with EAGLE-3 taps
    blocks = run(tiny_model, tiny_model.init_cache(b, slots), prompt_bt, len_b, max_chunk, (0, 2))
    assert one[3].shape == (b, t, 2 * tiny_model.cfg.d_model)
    for a, c in zip(jax.tree.leaves(one), jax.tree.leaves(blocks), strict=True):
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-5, atol=1e-5)


def test_generation_with_blocked_prefill_gives_the_same_tokens(tiny_model):
    from conftest import ByteTokenizer

    prompts = ["abcabcabc" * 7, "hello world " * 9, "xyz"]  # bucket 128: blocks of 16 below
    cfg = GenerateConfig(max_new_tokens=12, batch_size=3)
    plain, _ = Generator(tiny_model, ByteTokenizer()).generate(prompts, cfg)
    small = dataclasses.replace(CPU, prefill_chunk=16)
    blocked, _ = Generator(tiny_model, ByteTokenizer(), profile=small).generate(prompts, cfg)
    assert [c.tokens for c in blocked] == [c.tokens for c in plain]
