"""Sampling transformations: exact top-k / top-p sets, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode.sampling import SamplingConfig, SamplingError, categorical, filter_logits, sample, sample_weights

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


@pytest.mark.parametrize("v", [1, 7, 50, 1000])
def test_sample_weights_follows_the_weights(v):
    """The two-level inverse CDF draws w/sum(w) (vocabularies whose size is no multiple of the block
    width included); chi-square at the 0.999 level over the tokens of positive weight."""
    w = np.random.default_rng(v).gamma(0.3, size=v).astype(np.float32)
    w[::3] = 0.0 if v > 1 else w[::3]
    n = 40000
    draws = np.asarray(jax.jit(jax.vmap(lambda k: sample_weights(k, jnp.asarray(w)[None])[0]))(
        jax.random.split(jax.random.key(v), n)))
    counts = np.bincount(draws, minlength=v)
    assert counts[w == 0].sum() == 0
    expect = n * w / w.sum()
    big = expect >= 5  # chi-square needs expected counts >= 5; pool the rest
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expect[big], expect[~big].sum())
    keep = exp > 0
    stat = float(np.sum((obs[keep] - exp[keep]) ** 2 / exp[keep]))
    dof = int(keep.sum()) - 1
    # Wilson–Hilferty approximation of the chi-square 0.999 quantile (no scipy in the test deps).
    crit = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3 if dof else 1e-6
    assert stat <= crit, (stat, dof, crit)


def test_categorical_never_draws_masked_tokens_of_a_large_vocabulary():
    v = 262144
    logits = jnp.full((4, v), -jnp.inf).at[:, jnp.array([5, 70000, v - 1])].set(jnp.array([0.0, 1.0, 2.0]))
    draws = jax.jit(jax.vmap(lambda k: categorical(k, logits)))(jax.random.split(jax.random.key(0), 3000))
    freq = np.bincount(np.asarray(draws).ravel(), minlength=v)[[5, 70000, v - 1]] / draws.size
    assert np.asarray(draws).size == 12000 and set(np.unique(np.asarray(draws))) <= {5, 70000, v - 1}
    np.testing.assert_allclose(freq, np.exp([0, 1, 2]) / np.exp([0, 1, 2]).sum(), atol=0.02)


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
