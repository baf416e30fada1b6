"""Model invariants on tiny random weights: cached decoding equals the full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import forward, full_logits, logits_of, tiny_config
from flax import nnx

from specjax.models.config import ConfigError, gemma3_270m
from specjax.models.kv_cache import attention_masks, causal_block_mask, write_block, write_transposed
from specjax.models.params import param_shapes
from specjax.models.transformer import _attend, _split_attention

TOL = 2e-5  # float32; the two paths sum attention over different (masked) lengths


@pytest.mark.parametrize("prefill", [1, 3, 9])
def test_cached_decoding_matches_full_forward_past_the_window(tiny_model, prefill):
    tokens = jax.random.randint(jax.random.key(1), (2, 14), 0, 64)
    ref = full_logits(tiny_model, tokens)
    cache = tiny_model.init_cache(2, 20)
    pos = jnp.broadcast_to(jnp.arange(prefill), (2, prefill))
    h, cache = forward(tiny_model, tokens[:, :prefill], pos, cache, jnp.zeros((2,), jnp.int32))
    outs = [logits_of(tiny_model, h)]
    for i in range(prefill, 14):
        p = jnp.full((2, 1), i, jnp.int32)
        h, cache = forward(tiny_model, tokens[:, i:i + 1], p, cache, p[:, 0])
        outs.append(logits_of(tiny_model, h))
    np.testing.assert_allclose(jnp.concatenate(outs, 1), ref, atol=TOL)


def test_multi_token_block_after_cache_and_ragged_rows(tiny_model):
    """Rows at different lengths append a 3-token block (what verification does)."""
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, 64)
    ref = full_logits(tiny_model, tokens)
    lens = jnp.array([5, 8])
    cache = tiny_model.init_cache(2, 16)
    pos = jnp.broadcast_to(jnp.arange(12), (2, 12))
    # Prefill everything, then rewrite from each row's length: stale slots must not leak.
    _, cache = forward(tiny_model, jnp.zeros_like(tokens), pos, cache, jnp.zeros((2,), jnp.int32))
    _, cache = forward(tiny_model, tokens[:, :8], pos[:, :8], cache, jnp.zeros((2,), jnp.int32))
    block = jnp.stack([tokens[0, 5:8], tokens[1, 8:11]])
    bpos = lens[:, None] + jnp.arange(3)
    h, _ = forward(tiny_model, block, bpos, cache, lens)
    got = logits_of(tiny_model, h)
    np.testing.assert_allclose(got[0], ref[0, 5:8], atol=TOL)
    np.testing.assert_allclose(got[1], ref[1, 8:11], atol=TOL)


@pytest.mark.parametrize("window", [None, 5])
def test_split_attention_equals_attending_to_the_written_cache(window):
    """Ragged starts, stale slots after each row's start, a tree-shaped block mask, global and local layers."""
    b, t, slots, kv, g, h = 3, 4, 20, 2, 2, 8
    keys = jax.random.split(jax.random.key(5), 5)
    q = jax.random.normal(keys[0], (b, t, kv, g, h))
    cache = jax.random.normal(keys[1], (b, slots, kv, h)), jax.random.normal(keys[2], (b, kv, h, slots))
    k_new, v_new = jax.random.normal(keys[3], (b, t, kv, h)), jax.random.normal(keys[4], (b, t, kv, h))
    start = jnp.array([0, 7, slots - t])
    tree = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)  # nodes 1, 2 siblings
    pos = start[:, None] + jnp.array([0, 1, 1, 2])[None, :]
    glob, local = attention_masks(pos, start, slots, jnp.broadcast_to(tree, (b, t, t)), window)
    mask = glob if window is None else local
    written = write_block(cache[0], k_new, start), write_transposed(cache[1], v_new, start)
    np.testing.assert_allclose(_split_attention(q, cache, k_new, v_new, mask, start),
                               _attend(q, *written, mask), atol=1e-5)


def test_window_changes_the_result(tiny_model):
    """Guards the test above: without the window the logits differ, so it is exercised."""
    tokens = jax.random.randint(jax.random.key(3), (1, 12), 0, 64)
    wide = nnx.merge(*nnx.split(tiny_model))
    wide.cfg = tiny_model.cfg.replace(sliding_window=64)
    assert float(jnp.abs(full_logits(wide, tokens) - full_logits(tiny_model, tokens)).max()) > 1e-3


def test_attention_mask_window_and_stale_slots():
    pos = jnp.array([[6, 7]])
    g, local = attention_masks(pos, jnp.array([6]), 10, causal_block_mask(2)[None], window=3)
    expect_g = np.zeros((2, 10), bool)
    expect_g[0, :7] = True
    expect_g[1, :8] = True
    np.testing.assert_array_equal(g[0], expect_g)
    expect_l = expect_g.copy()
    expect_l[0, :4] = False  # query 6 sees 4, 5, 6
    expect_l[1, :5] = False  # query 7 sees 5, 6, 7
    np.testing.assert_array_equal(local[0], expect_l)


def test_bfloat16_runs_close_to_float32(tiny_model):
    tokens = jax.random.randint(jax.random.key(4), (1, 8), 0, 64)
    graphdef, state = nnx.split(tiny_model)
    bf = nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(jnp.bfloat16), state))
    bf.dtype = jnp.bfloat16
    diff = jnp.abs(full_logits(bf, tokens) - full_logits(tiny_model, tokens)).max()
    assert full_logits(bf, tokens).dtype == jnp.float32
    assert float(diff) < 0.1  # bf16 has 8 mantissa bits; logits here are O(1)


def test_gemma3_270m_shapes_abstractly():
    shapes = param_shapes(gemma3_270m())
    total = sum(int(np.prod(s)) for s in shapes.values())
    assert shapes["embed"] == (262_144, 640)
    assert shapes["blocks.0.attn.q.w"] == (640, 1024)
    assert 260e6 < total < 280e6
    assert shapes["embed"][0] * 640 / total == pytest.approx(0.626, abs=0.005)


def test_config_rejects_inconsistent_values():
    with pytest.raises(ConfigError, match="n_kv_heads"):
        tiny_config(n_kv_heads=3)
    with pytest.raises(ConfigError, match="layer_kinds"):
        tiny_config(n_layers=4)
    with pytest.raises(ConfigError, match="sliding_window"):
        tiny_config(sliding_window=None)


def test_taps_are_the_residual_stream_after_the_named_blocks(tiny_model):
    """`forward(taps=...)` (EAGLE-3's fused features): block i's output, i.e. the blocks up to i run alone."""
    b, t = 2, 9
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, 64, (b, t)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    hidden, _, taps = nnx.jit(lambda m, x: m.forward(x, pos, taps=(0, 2)))(tiny_model, tokens)
    plain, _ = nnx.jit(lambda m, x: m(x, pos))(tiny_model, tokens)
    np.testing.assert_array_equal(np.asarray(hidden), np.asarray(plain))
    masks = attention_masks(pos, jnp.zeros((b,), jnp.int32), t, jnp.broadcast_to(causal_block_mask(t), (b, t, t)),
                            tiny_model.cfg.sliding_window)
    d = tiny_model.cfg.d_model
    for j, upto in enumerate((0, 2)):
        x, _, _ = tiny_model.run_blocks(tiny_model.embed_tokens(tokens), pos, masks, None, None, range(upto + 1))
        np.testing.assert_allclose(np.asarray(taps[..., j * d:(j + 1) * d]), np.asarray(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="taps"):
        tiny_model.run_blocks(tiny_model.embed_tokens(tokens), pos, masks, None, None, [0], taps=(1,))
