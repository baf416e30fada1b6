"""EAGLE head: shapes, cached == uncached, tree masks across calls, abstract Gemma 3 270M shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from specjax.models.config import ConfigError, gemma3_270m
from specjax.models.eagle import EagleConfig, EagleHead

# Jitted: the first eager call of each op shape compiles op by op (seconds on a shared CPU).
_call = nnx.jit(lambda h, *a, **kw: h(*a, **kw))


@pytest.fixture(scope="module")
def head():
    return EagleHead(EagleConfig.from_target(tiny_config()), rngs=nnx.Rngs(3))


def _inputs(t, b=2):
    feat = jax.random.normal(jax.random.key(0), (b, t, 32))
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, 64)
    embed = jax.random.normal(jax.random.key(2), (64, 32)) * 0.1
    return feat, tokens, embed


def test_config_from_target():
    cfg = EagleConfig.from_target(gemma3_270m())
    assert cfg.layer.n_layers == 1 and cfg.layer.layer_kinds == ("global",)
    assert cfg.d_model == 640 and cfg.embed_multiplier == pytest.approx(640**0.5)
    with pytest.raises(ConfigError, match="one global layer"):
        EagleConfig(layer=gemma3_270m(), vocab_size=10)


def test_cached_equals_uncached(head):
    t = 7
    feat, tokens, embed = _inputs(t)
    pos = jnp.broadcast_to(jnp.arange(t), (2, t))
    ref, none = _call(head, feat, tokens, embed, pos)
    assert ref.shape == (2, t, 32) and none is None
    cache = head.init_cache(2, 12)
    zero = jnp.zeros((2,), jnp.int32)
    out1, cache = _call(head, feat[:, :4], tokens[:, :4], embed, pos[:, :4], cache, zero)
    outs = [out1]
    for i in range(4, t):  # then one pair at a time
        o, cache = _call(head, feat[:, i:i + 1], tokens[:, i:i + 1], embed, pos[:, i:i + 1], cache, zero + i)
        outs.append(o)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), ref, atol=1e-5)


def test_explicit_mask_hides_siblings(head):
    """Two branches written as separate blocks: with an ancestor mask, branch 2 ignores branch 1."""
    feat, tokens, embed = _inputs(3, b=1)
    pos = jnp.array([[0, 1, 1]])
    # Uncached reference: pairs 0 -> 1 and 0 -> 2 (a tree), tree mask from parents.
    tree_mask = jnp.array([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)
    ref, _ = _call(head, feat, tokens, embed, pos, block_mask_btt=tree_mask)
    cache = head.init_cache(1, 4)
    _, cache = _call(head, feat[:, :2], tokens[:, :2], embed, pos[:, :2], cache, jnp.array([0]))
    mask_bts = jnp.array([[[True, False, True, False]]])  # root slot 0 and itself (slot 2), not slot 1
    out, _ = _call(head, feat[:, 2:], tokens[:, 2:], embed, pos[:, 2:], cache, jnp.array([2]), mask_bts=mask_bts)
    np.testing.assert_allclose(out[:, 0], ref[:, 2], atol=1e-5)


def test_eval_shape_on_gemma3_270m():
    cfg = EagleConfig.from_target(gemma3_270m())
    head = nnx.eval_shape(lambda: EagleHead(cfg, rngs=nnx.Rngs(0)))
    cache = jax.eval_shape(lambda: head.init_cache(2, 64))
    args = (jax.ShapeDtypeStruct((2, 5, 640), jnp.float32), jax.ShapeDtypeStruct((2, 5), jnp.int32),
            jax.ShapeDtypeStruct((262_144, 640), jnp.float32), jax.ShapeDtypeStruct((2, 5), jnp.int32))
    out, new_cache = jax.eval_shape(lambda h, c, *a: h(*a, cache=c, start_b=jnp.zeros((2,), jnp.int32)),
                                    head, cache, *args)
    assert out.shape == (2, 5, 640) and new_cache.k[0].shape == (2, 64, 1, 256)
    assert new_cache.v[0].shape == (2, 1, 256, 64)  # values are stored transposed


def test_shape_mismatch_message(head):
    feat, tokens, embed = _inputs(2)
    with pytest.raises(ConfigError, match="width 32 over 64 tokens"):
        head(feat, tokens, embed[:10], jnp.zeros((2, 2), jnp.int32))
