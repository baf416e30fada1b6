"""The int8 kernel's matrix layout (`tile_layout`): compact scales are exact or not used at all."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from test_native_kernels import _matrix

from specjax.models.int8_activations import TiledBlockQuant
from specjax.models.tile_layout import factor_blocks


@pytest.mark.parametrize("layout", ["q4+offset", "int8/16", "int8/32+offset"])
def test_scales_that_do_not_factor_stay_float32(layout):
    tiled = TiledBlockQuant.from_block_quant(_matrix(layout, 32, 512))
    assert not tiled.compact and tiled.scale.dtype == jnp.float32


def test_factor_blocks_is_exact_or_says_no():
    # d over 63 and over 128 from the largest block, a negative d (its -128 becomes a +128), an all-zero group,
    # a zero d
    d = np.float32([[3.0517578e-05, -0.0123], [1.5, 0.0]]).astype(np.float16).astype(np.float32)
    c = np.array([[[1, 63, 0, 7], [-128, 127, 2, -5]], [[0, 0, 0, 0], [9, 9, 9, 9]]])
    a = (np.repeat(d, 4, axis=1) * c.reshape(2, 8)).astype(np.float32)
    sub, sup, ok = factor_blocks(jnp.asarray(a), 4)
    assert bool(ok) and sub.dtype == jnp.int8 and sup.shape == (2, 2)
    np.testing.assert_array_equal(np.asarray(sub, np.float32) * np.repeat(np.asarray(sup), 4, axis=1), a)
    assert np.abs(np.asarray(sub, np.int32)).max() <= 128
    for bad in ((1.0, 255.0, 1.0, 1.0), (1.0, 1.0 + 2**-20, 1.0, 1.0), (1.0, 1e-30, 1.0, 1.0)):
        assert not bool(factor_blocks(jnp.asarray([bad], jnp.float32), 4)[2]), bad  # integers past int8, no factor


@pytest.mark.parametrize(("low", "high", "top"), [(0, 63, 63), (-128, 127, -128)])  # Q4_K scales / mins, Q6_K
def test_llama_cpp_scales_factor_exactly_and_others_stay_float32(low, high, top):
    """llama.cpp gives a super-block's largest scale exactly 63 (Q4_K) or -128 (Q6_K) units of d: d comes from
    that scale alone. Without such a block the group is not factored (the matrix keeps float32 scales)."""
    rng = np.random.default_rng(0)
    d = (rng.uniform(1e-4, 2e-3, (64, 4)) * rng.choice([-1, 1], (64, 4))).astype(np.float16).astype(np.float32)
    c = rng.integers(low, high + 1, (64, 4, 16))
    c[:, :, 5] = top
    a = jnp.asarray((d[..., None] * c).reshape(64, 64).astype(np.float32))
    sub, sup, ok = factor_blocks(a, 16)
    assert bool(ok)
    np.testing.assert_array_equal(np.asarray(sub, np.float32) * np.repeat(np.asarray(sup), 16, axis=1), a)
    c[:, :, 5] = 3  # no block at the denominator
    assert not bool(factor_blocks(jnp.asarray((d[..., None] * c).reshape(64, 64).astype(np.float32)), 16)[2])
