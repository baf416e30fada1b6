"""Medusa heads: shapes, zero init = base head, abstract Gemma 3 270M shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.models.config import ConfigError, gemma3_270m
from specjax.models.draft_vocab import HeadTable
from specjax.models.medusa import MedusaConfig, MedusaHeads, randomize


def test_zero_init_heads_predict_the_base_heads_token(tiny_model):
    tokens = jnp.array([[5, 9, 13, 7, 22]])
    hidden_btd, _ = nnx.jit(lambda m, x: m(x, jnp.arange(5)[None]))(tiny_model, tokens)
    heads = MedusaHeads(MedusaConfig(d_model=32, n_heads=3, n_layers=2))
    feat_bthd = heads(hidden_btd)
    assert feat_bthd.shape == (1, 5, 3, 32)
    head = HeadTable.full(tiny_model.embed[...])
    base = jnp.argmax(tiny_model.logits(hidden_btd), -1)
    for h in range(3):
        assert jnp.array_equal(jnp.argmax(head.logits(feat_bthd[:, :, h]), -1), base)


def test_random_heads_differ_and_stay_finite():
    heads = randomize(MedusaHeads(MedusaConfig(d_model=16, n_heads=2)), jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 16))
    y = nnx.jit(lambda h, x: h(x))(heads, x)
    assert y.shape == (4, 2, 16) and bool(jnp.all(jnp.isfinite(y)))
    assert not np.allclose(y[:, 0], y[:, 1]) and not np.allclose(y[:, 0], x)


def test_eval_shape_on_gemma3_270m():
    cfg = MedusaConfig.from_target(gemma3_270m(), n_heads=4)
    heads = nnx.eval_shape(lambda: MedusaHeads(cfg))
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(heads, nnx.Param)))
    assert n_params == 4 * (640 * 640 + 640)
    out = jax.eval_shape(lambda h, x: h(x), heads, jax.ShapeDtypeStruct((2, 640), jnp.float32))
    assert out.shape == (2, 4, 640)


def test_bad_config_and_width():
    with pytest.raises(ConfigError, match="n_heads must be a positive integer"):
        MedusaConfig(d_model=8, n_heads=0)
    with pytest.raises(ConfigError, match="width 8"):
        MedusaHeads(MedusaConfig(d_model=8))(jnp.zeros((1, 4)))
