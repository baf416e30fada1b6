"""Training-time test of the EAGLE head: the unrolled steps see what drafting sees, and 1 step is the old loss."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from specjax.models.eagle import EagleConfig, EagleHead
from specjax.train import eagle_ttt
from specjax.train.config import TrainConfigError, validate
from specjax.train.step import make_eval_step
from specjax.train.trainer import prepare


def test_slot_mask_is_causal_on_step_zero_and_diagonal_on_the_chain():
    m = np.asarray(eagle_ttt.slot_mask(3, 2, 3))  # L = 3 chains, query step 2 of 3
    expected = np.array([
        # step 0 (causal) | step 1 (own chain) | step 2 (own chain)
        [1, 0, 0, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 1],
    ], bool)
    np.testing.assert_array_equal(m, expected)
    # Step 1 does not see step 2's block (not written yet).
    assert not np.asarray(eagle_ttt.slot_mask(3, 1, 3))[:, 6:].any()


def _head_and_data(t=10, seed=0):
    cfg = EagleConfig.from_target(tiny_config())
    head = EagleHead(cfg, rngs=nnx.Rngs(seed))
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    feat = jax.random.normal(k1, (2, t, cfg.d_model))
    tokens = jax.random.randint(k2, (2, t), 0, cfg.vocab_size)
    embed = jax.random.normal(k3, (cfg.vocab_size, cfg.d_model))
    return head, feat, tokens, embed


def test_each_unrolled_step_equals_drafting_from_the_heads_own_features():
    head, feat, tokens, embed = _head_and_data()
    n_steps = 3
    preds = eagle_ttt.unrolled(head, feat, tokens, embed, n_steps)
    assert len(preds) == n_steps and preds[0].shape == (2, 9, 32)
    n = feat.shape[1] + n_steps  # sequences padded to one length: causal, so the padding changes nothing before it

    @jax.jit
    def causal(f_bnd, tok_bn):
        return head(f_bnd, tok_bn, embed, jnp.broadcast_to(jnp.arange(n), (2, n)))[0]

    for r in (0, 3, 5):
        # Drafting from root r: the true pairs 0..r, then the head's own outputs fed back in (tokens are the
        # data's: the first drafts were right), one uncached causal forward over the sequence per depth.
        f_seq = jnp.zeros((2, n, feat.shape[2])).at[:, :r + 1].set(feat[:, :r + 1])
        tok_seq = jnp.zeros((2, n), tokens.dtype).at[:, :r + n_steps].set(tokens[:, 1:r + n_steps + 1])
        for j in range(n_steps):
            g = causal(f_seq, tok_seq)[:, r + j]
            np.testing.assert_allclose(np.asarray(preds[j][:, r]), np.asarray(g), rtol=1e-5, atol=1e-5)
            f_seq = f_seq.at[:, r + j + 1].set(g)


def test_one_step_is_the_plain_causal_forward():
    head, feat, tokens, embed = _head_and_data()
    (one,) = eagle_ttt.unrolled(head, feat, tokens, embed, 1)
    first = eagle_ttt.unrolled(head, feat, tokens, embed, 2)[0]  # step 0 through the shared cache
    np.testing.assert_allclose(np.asarray(first), np.asarray(one), rtol=1e-5, atol=1e-5)


def test_step_targets_shift_with_the_step_and_stay_inside_the_row():
    tokens = jnp.arange(10, 16)[None]  # x_0..x_5
    mask = jnp.array([[0, 0, 1, 1, 1, 1]], jnp.float32)  # tokens 3.. are targets (mask[t]: token t+1)
    feat = jnp.arange(6, dtype=jnp.float32)[None, :, None]
    t0, t1 = (eagle_ttt.step_targets(tokens, mask, feat, j) for j in (0, 1))
    np.testing.assert_array_equal(t0["labels"][0], [12, 13, 14, 15, 0])  # x_{r+2}
    np.testing.assert_array_equal(t0["label"][0], [0, 1, 1, 1, 0])  # x_{r+2} a target inside the row
    np.testing.assert_array_equal(t0["feat"][0, :, 0], [1, 2, 3, 4, 5])  # f_{r+1}
    np.testing.assert_array_equal(t0["reg_mask"][0], [0, 1, 1, 1, 1])
    np.testing.assert_array_equal(t1["labels"][0], [13, 14, 15, 0, 0])  # x_{r+3}
    np.testing.assert_array_equal(t1["label"][0], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(t1["feat"][0, :, 0], [2, 3, 4, 5, 0])  # f_{r+2}
    np.testing.assert_array_equal(t1["reg_mask"][0], [1, 1, 1, 1, 0])


def _loss_grads_metrics(cfg):
    _, rows, _, task = prepare(cfg)
    batch = {k: jnp.asarray(v[:8]) for k, v in rows.arrays().items()}
    eval_fn = make_eval_step(task.loss_fn, None)
    metrics = jax.jit(eval_fn)(task.params, task.frozen, batch)
    grads = jax.jit(jax.grad(lambda p, f, b: eval_fn(p, f, b)["loss"]))(task.params, task.frozen, batch)
    return metrics, grads


def test_ttt_adds_weighted_steps_to_the_one_step_loss(tiny_train_config):
    cfg = tiny_train_config("eagle")
    with_loss = lambda **kw: dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, **kw))  # noqa: E731
    m1, g1 = _loss_grads_metrics(cfg)
    m0, g0 = _loss_grads_metrics(with_loss(eagle_ttt_steps=3, eagle_ttt_decay=0.0))  # later steps weigh 0
    assert float(m0["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-5)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    m3, _ = _loss_grads_metrics(with_loss(eagle_ttt_steps=3, eagle_ttt_decay=0.8))
    for name in ("d2_acc", "d3_acc", "d2_ce", "d3_reg"):
        assert name in m3 and name in m0 and "d2_acc" not in m1
    w = 0.8 ** np.arange(3)
    ce = np.array([float(m3["ce"]), float(m3["d2_ce"]), float(m3["d3_ce"])])
    reg = np.array([float(m3["reg"]), float(m3["d2_reg"]), float(m3["d3_reg"])])
    fw, cw = cfg.loss.eagle_feature_weight, cfg.loss.eagle_ce_weight
    assert float(m3["loss"]) == pytest.approx(float(np.sum(w * (fw * reg + cw * ce))), rel=1e-5)


@pytest.mark.parametrize("change", [{"eagle_ttt_steps": 0}, {"eagle_ttt_steps": 17}, {"eagle_ttt_decay": 1.5}])
def test_bad_ttt_options_are_refused_by_name(tiny_train_config, change):
    cfg = tiny_train_config("eagle")
    with pytest.raises(TrainConfigError, match=next(iter(change))):
        validate(dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, **change)))
