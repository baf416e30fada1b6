"""The two-level argmax gives exactly numpy's argmax (and max): ties, NaN, infinities, padding."""

from datetime import timedelta

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.models.reductions import MIN_TWO_LEVEL, argmax, block_width, max_argmax


def _check(x: np.ndarray) -> None:
    got_max, got_arg = jax.jit(max_argmax)(jnp.asarray(x))
    assert got_arg.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got_arg), np.argmax(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(got_max), np.max(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(jax.jit(argmax)(jnp.asarray(x))), np.argmax(x, axis=-1))


# Sizes with a power-of-two block (262,144: Gemma; 151,936: Qwen's head; 2,048: a head block) and
# sizes that need padding (151,665: Qwen's tokenizer; odd numbers), below and above the threshold.
SIZES = [7, MIN_TWO_LEVEL - 1, MIN_TWO_LEVEL, 2048, 5000, 4097, 151_665, 151_936, 262_144]


@pytest.mark.parametrize("n", SIZES)
def test_random_rows(n):
    rng = np.random.default_rng(n)
    _check(rng.normal(size=(3, n)).astype(np.float32))
    _check(rng.normal(size=(2, 2, n)).astype(np.float32))  # leading axes: [B, T, V] verification logits


@settings(max_examples=60, deadline=timedelta(seconds=30))  # each new shape compiles
@given(n=st.sampled_from(SIZES[2:6]), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["ties", "nan", "neg_inf", "pos_inf", "few_values", "ints"]))
def test_special_values_resolve_like_numpy(n, seed, kind):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4, n)).astype(np.float32)
    where = rng.integers(0, n, size=(4, 3))
    if kind == "ties":  # the same maximum at several places, across and inside blocks
        for r in range(4):
            x[r, where[r]] = 10.0
    elif kind == "nan":  # the first NaN wins, wherever the maximum is
        x[0, where[0, 0]] = np.nan
        x[1, where[1]] = np.nan
        x[2, where[2, 0]], x[2, where[2, 1]] = np.inf, np.nan
    elif kind == "neg_inf":  # masked rows: all -inf, or one allowed token
        x[0] = -np.inf
        x[1] = -np.inf
        x[1, where[1, 0]] = 0.5
    elif kind == "pos_inf":
        x[:, where[:, 0]] = np.inf
    elif kind == "few_values":  # many ties everywhere
        x = rng.integers(0, 3, size=(4, n)).astype(np.float32)
    else:
        x = rng.integers(-5, 5, size=(4, n)).astype(np.int32)
    _check(x)  # numpy's argmax returns the first NaN and its max is NaN (assert_array_equal: NaN == NaN)


def test_block_widths_are_powers_of_two_near_the_square_root():
    assert block_width(262_144) == 512 and block_width(151_936) == 128 and block_width(2048) == 64
    assert block_width(151_665) == 512  # no power-of-two divisor: padded to a multiple of 512
