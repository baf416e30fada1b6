"""Attention and RMS norm with every sum in one fixed order (csrc/fixed_order.cc, `native_kernels`).

With `activations=int8` a last-place difference in x can move its int8 rounding by a whole step, so the
model's reductions must give a row the same bits whatever call it is in: a query's attention must depend only
on the keys and values it sees (not on the block length, the cache length, the batch, or the slots a tree's
ancestors sit in), a norm's row only on itself. The kernels must also compute attention and RMS norm (within
float32 rounding of XLA's versions), and the model must use them once tiled for int8 activations.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from specjax.models import native_kernels, transformer, weight_formats
from specjax.models.int8_activations import tile_model
from specjax.models.kv_cache import attention_masks
from specjax.models.layers import RMSNorm

needs_kernels = pytest.mark.skipif(
    not (native_kernels.available("attention") and native_kernels.available("rms_norm")),
    reason=f"fixed-order kernels unavailable: {native_kernels.unavailable_reason('attention')}")

KV, G, H = 2, 3, 32


def _arrays(rng, b, t, s):
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return f(b, t, KV * G, H), f(b, s, KV, H), f(b, KV, H, s), f(b, t, KV, H), f(b, t, KV, H)


def _call(q, kc, vc, kb, vb, start, block_mask=None, window=None):
    b, t = q.shape[:2]
    start = np.asarray(start, np.int32)
    if block_mask is None:
        block_mask = np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t))
    positions = start[:, None] + np.arange(t)[None]
    glob, local = attention_masks(jnp.asarray(positions), jnp.asarray(start), kc.shape[1], jnp.asarray(block_mask),
                                  window)
    mask = glob if window is None else local
    out = native_kernels.fixed_order_attention(jnp.asarray(q), kc, vc, kb, vb, jnp.asarray(start), mask)
    return np.asarray(out), mask


def _reference(q, kc, vc, kb, vb, start, mask):
    """XLA's attention over the cache after the block's write."""
    b, t = q.shape[:2]
    kc, vc = kc.copy(), vc.copy()
    for r in range(b):
        kc[r, start[r]:start[r] + t] = kb[r]
        vc[r, :, :, start[r]:start[r] + t] = np.moveaxis(vb[r], 0, -1)
    out = transformer._attend(jnp.asarray(q).reshape(b, t, KV, G, H), jnp.asarray(kc), jnp.asarray(vc), mask)
    return np.asarray(out).reshape(b, t, KV * G, H)


@needs_kernels
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("t, start", [(6, [9, 31]), (40, [3, 21])])  # a decoding block; a prefill (runs of 16)
def test_attention_computes_softmax_attention(window, t, start):
    rng = np.random.default_rng(0)
    q, kc, vc, kb, vb = _arrays(rng, 2, t, 64)
    out, mask = _call(q, kc, vc, kb, vb, start, window=window)
    np.testing.assert_allclose(out, _reference(q, kc, vc, kb, vb, np.asarray(start), mask), rtol=1e-5, atol=1e-5)


@needs_kernels
def test_a_querys_attention_depends_only_on_the_keys_it_sees():
    """A verification block of 7 against one-token steps (a longer cache, other rows in the batch): bit for bit."""
    rng = np.random.default_rng(1)
    t, s0 = 7, 21
    q, kc, vc, kb, vb = _arrays(rng, 1, t, 48)
    block, _ = _call(q, kc, vc, kb, vb, [s0])
    for j in range(t):
        # The step's cache: the block's first j entries written, 80 slots, between two other rows.
        _, kc2, vc2, _, _ = _arrays(rng, 3, 1, 80)
        kc2[1, :48], vc2[1, :, :, :48] = kc[0], vc[0]
        kc2[1, s0:s0 + j] = kb[0, :j]
        vc2[1, :, :, s0:s0 + j] = np.moveaxis(vb[0, :j], 0, -1)
        q2, _, _, kb2, vb2 = _arrays(rng, 3, 1, 80)
        q2[1, 0], kb2[1, 0], vb2[1, 0] = q[0, j], kb[0, j], vb[0, j]
        step, _ = _call(q2, kc2, vc2, kb2, vb2, [5, s0 + j, 60])
        np.testing.assert_array_equal(step[1, 0], block[0, j])


@needs_kernels
def test_a_tree_nodes_attention_equals_its_path_decoded_one_token_at_a_time():
    """Node 3 of a tree sees nodes 0 and 2 (slots s0, s0 + 2); decoded as a chain they sit at s0, s0 + 1."""
    rng = np.random.default_rng(2)
    t, s0 = 4, 37
    q, kc, vc, kb, vb = _arrays(rng, 1, t, 64)
    tree = np.eye(t, dtype=bool)
    tree[1, 0] = tree[2, 0] = tree[3, 0] = tree[3, 2] = True  # 0 → 1, 0 → 2 → 3
    block, _ = _call(q, kc, vc, kb, vb, [s0], block_mask=tree[None])
    kc2, vc2 = kc.copy(), vc.copy()
    for slot, node in ((s0, 0), (s0 + 1, 2)):
        kc2[0, slot], vc2[0, :, :, slot] = kb[0, node], vb[0, node]
    step, _ = _call(q[:, 3:], kc2, vc2, kb[:, 3:], vb[:, 3:], [s0 + 2])
    np.testing.assert_array_equal(step[0, 0], block[0, 3])


@needs_kernels
def test_rms_norm_rows_are_the_norm_and_do_not_depend_on_the_call():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 96)).astype(np.float32) * 3
    scale = rng.standard_normal(96).astype(np.float32)
    norm = RMSNorm(96, 1e-6, jnp.float32)
    norm.scale[...] = jnp.asarray(scale)
    many = np.asarray(native_kernels.fixed_order_rms_norm(jnp.asarray(x), jnp.asarray(scale), 1e-6))
    np.testing.assert_allclose(many, np.asarray(norm(jnp.asarray(x))), rtol=2e-6, atol=1e-6)
    for r in range(9):
        one = native_kernels.fixed_order_rms_norm(jnp.asarray(x[r:r + 1]), jnp.asarray(scale), 1e-6)
        np.testing.assert_array_equal(np.asarray(one)[0], many[r])


@needs_kernels
def test_a_model_tiled_for_int8_activations_gives_a_block_what_steps_give_it():
    """Hidden states of a 6-token cached block equal six one-token steps' bit for bit, and an uncached forward
    (the prompt attends to itself) equals the same prompt written into an empty cache."""
    model = transformer.Transformer(tiny_config(d_model=64, n_heads=4, head_dim=16, ffn_dim=128), rngs=nnx.Rngs(7))
    weight_formats.pack_model(model, "q4")
    tile_model(model)
    modules = [m for _, m in nnx.iter_modules(model) if isinstance(m, (RMSNorm, transformer.Attention))]
    assert modules and all(m.fixed_order for m in modules)
    prompt, block = jnp.arange(3, 40)[None] % 50, jnp.asarray([[7, 19, 3, 3, 40, 11]])
    p, t = prompt.shape[1], block.shape[1]
    _, cache = model(prompt, jnp.arange(p)[None], model.init_cache(1, 64), jnp.zeros((1,), jnp.int32))
    whole, _ = model(block, p + jnp.arange(t)[None], cache, jnp.asarray([p]))
    step_cache = cache
    for j in range(t):
        h, step_cache = model(block[:, j:j + 1], jnp.asarray([[p + j]]), step_cache, jnp.asarray([p + j]))
        np.testing.assert_array_equal(np.asarray(h)[0, 0], np.asarray(whole)[0, j])
    uncached, _ = model(prompt, jnp.arange(p)[None])  # 37 tokens: runs of 16 block entries
    cached, _ = model(prompt, jnp.arange(p)[None], model.init_cache(1, 64), jnp.zeros((1,), jnp.int32))
    np.testing.assert_array_equal(np.asarray(uncached), np.asarray(cached))
