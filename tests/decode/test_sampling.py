"""Sampling transformations: exact top-k / top-p sets, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode.sampling import SamplingConfig, SamplingError, filter_logits, sample

LOGITS = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))


def kept(x):
    return np.isfinite(np.asarray(x[0])).nonzero()[0].tolist()


def test_top_k_keeps_k_most_likely():
    assert kept(filter_logits(LOGITS, 1.0, 2, 1.0)) == [0, 1]


@pytest.mark.parametrize(("p", "expect"), [(0.5, [0]), (0.51, [0, 1]), (0.7, [0, 1]), (0.86, [0, 1, 2, 3]),
                                           (1.0, [0, 1, 2, 3, 4])])
def test_top_p_keeps_smallest_set_reaching_p(p, expect):
    assert kept(filter_logits(LOGITS, 1.0, 0, jnp.float32(p) if p < 1 else p)) == expect


def test_temperature_sharpens():
    x = filter_logits(LOGITS, 0.5, 0, 1.0)
    np.testing.assert_allclose(jax.nn.softmax(x)[0], jax.nn.softmax(LOGITS / 0.5)[0], rtol=1e-6)


def test_sample_frequencies_follow_filtered_distribution():
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    keys = jax.random.split(jax.random.key(0), 20000)
    draws = jax.vmap(lambda k: sample(LOGITS, k, cfg)[0])(keys)
    freq = np.bincount(np.asarray(draws), minlength=5) / len(keys)
    np.testing.assert_allclose(freq, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], atol=0.015)


def test_greedy_is_argmax():
    assert int(sample(LOGITS, jax.random.key(0), SamplingConfig())[0]) == 0


@pytest.mark.parametrize(("kw", "msg"), [({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")},
                         "temperature"), ({"top_k": -2}, "top_k"), ({"top_k": 1.5}, "top_k"),
                         ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p")])
def test_invalid_values_are_refused(kw, msg):
    with pytest.raises(SamplingError, match=msg):
        SamplingConfig(**kw)


def test_top_k_larger_than_vocab_is_refused():
    with pytest.raises(SamplingError, match="vocabulary"):
        SamplingConfig(temperature=1.0, top_k=10).check_vocab(5)
