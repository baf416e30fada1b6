"""Loss functions against values computed by hand on tiny inputs."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.train import losses

LN2, LN3 = math.log(2.0), math.log(3.0)


def test_cross_entropy_uniform_two_way():
    ce = losses.cross_entropy_n(jnp.array([[0.0, 0.0], [0.0, LN3]]), jnp.array([1, 1]))
    # [0,0] -> p = 1/2; [0, ln3] -> p = 3/4.
    np.testing.assert_allclose(ce, [LN2, -math.log(0.75)], rtol=1e-6)


def test_kl_teacher_student_at_temperature_one():
    # teacher [0, ln3] -> (1/4, 3/4); student uniform: KL = 1/4 ln(1/2) + 3/4 ln(3/2).
    kl = losses.kl_n(jnp.array([[0.0, LN3]]), jnp.array([[0.0, 0.0]]), 1.0)
    np.testing.assert_allclose(kl, [0.25 * math.log(0.5) + 0.75 * math.log(1.5)], rtol=1e-6)
    assert float(kl[0]) == pytest.approx(0.1308120, abs=1e-6)


def test_kl_is_teacher_to_student_not_reverse():
    t, s = jnp.array([[0.0, LN3]]), jnp.array([[0.0, 0.0]])
    reverse = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # KL(student || teacher) = 0.1438
    assert float(losses.kl_n(t, s, 1.0)[0]) != pytest.approx(reverse, abs=1e-3)


def test_kd_mix_at_temperature_half():
    # T = 0.5: teacher [0, 2 ln3] -> (1/10, 9/10), student uniform. KL = .1 ln .2 + .9 ln 1.8 = 0.3680622.
    # loss = 0.3 * T^2 * KL + 0.7 * CE(label 1) = 0.3 * 0.25 * 0.3680622 + 0.7 * ln 2 = 0.5128077.
    loss, kl, ce = losses.kd_n(jnp.array([[0.0, 0.0]]), jnp.array([[0.0, LN3]]), jnp.array([1]), 0.5, 0.3)
    assert float(kl[0]) == pytest.approx(0.1 * math.log(0.2) + 0.9 * math.log(1.8), abs=1e-6)
    assert float(ce[0]) == pytest.approx(LN2, abs=1e-6)
    assert float(loss[0]) == pytest.approx(0.5128077, abs=1e-6)


def test_kd_seed_recipe_temperature_07():
    t_logits, s_logits = np.array([[1.0, 2.0, 0.5]]), np.array([[0.3, 0.1, 0.9]])
    pt = np.exp(t_logits / 0.7) / np.exp(t_logits / 0.7).sum()
    ps = np.exp(s_logits / 0.7) / np.exp(s_logits / 0.7).sum()
    kl = float((pt * np.log(pt / ps)).sum())
    ce = -math.log(math.exp(0.1) / np.exp(s_logits).sum())
    loss, _, _ = losses.kd_n(jnp.asarray(s_logits), jnp.asarray(t_logits), jnp.array([1]), 0.7, 0.3)
    assert float(loss[0]) == pytest.approx(0.3 * 0.49 * kl + 0.7 * ce, rel=1e-5)


def test_rank_below_top_k():
    logits = jnp.array([[3.0, 1.0, 2.0]])
    assert float(losses.rank_below_n(logits, jnp.array([2]), 1)[0]) == 0.0
    assert float(losses.rank_below_n(logits, jnp.array([2]), 2)[0]) == 1.0
    assert float(losses.rank_below_n(logits, jnp.array([0]), 1)[0]) == 1.0


def test_medusa_targets_shift_and_mask():
    tokens = jnp.array([[10, 11, 12, 13, 14]])
    mask = jnp.array([[1.0, 1.0, 1.0, 1.0, 0.0]])  # tokens 1..4 are targets
    labels, valid = losses.medusa_targets(tokens, mask, 2)
    # head 1 at t predicts token t+2; head 2 token t+3.
    np.testing.assert_array_equal(labels[0, 0], [12, 13, 14, 0, 0])
    np.testing.assert_array_equal(valid[0, 0], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(labels[1, 0], [13, 14, 0, 0, 0])
    np.testing.assert_array_equal(valid[1, 0], [1, 1, 0, 0, 0])


def test_medusa_targets_skip_prompt_tokens():
    tokens = jnp.array([[5, 6, 7, 8]])
    mask = jnp.array([[0.0, 0.0, 1.0, 0.0]])  # only token 3 is a target (tokens 1, 2 are prompt)
    _, valid = losses.medusa_targets(tokens, mask, 2)
    np.testing.assert_array_equal(valid[0, 0], [0, 1, 0, 0])  # head 1 at t=1 predicts token 3
    np.testing.assert_array_equal(valid[1, 0], [1, 0, 0, 0])  # head 2 at t=0 predicts token 3


def test_medusa_weights_decay():
    np.testing.assert_allclose(losses.medusa_weights(3, 0.8), [1.0, 0.8, 0.64], rtol=1e-6)


def test_smooth_l1_quadratic_then_linear():
    got = losses.smooth_l1_n(jnp.array([[0.0, 0.5, 3.0]]), jnp.zeros((1, 3)))
    assert float(got[0]) == pytest.approx((0.0 + 0.125 + 2.5) / 3, abs=1e-6)


def test_eagle_combines_regression_and_ce_and_masks_invalid_labels():
    pred, feat = jnp.array([[0.0, 2.0], [1.0, 1.0]]), jnp.array([[0.0, 0.0], [1.0, 1.0]])
    logits = jnp.zeros((2, 2))
    loss, reg, ce = losses.eagle_n(pred, feat, logits, jnp.array([1, 1]), jnp.array([1.0, 0.0]), 1.0, 0.1)
    np.testing.assert_allclose(reg, [0.75, 0.0], atol=1e-6)  # (0 + 1.5) / 2
    np.testing.assert_allclose(ce, [LN2, 0.0], atol=1e-6)
    np.testing.assert_allclose(loss, [0.75 + 0.1 * LN2, 0.0], atol=1e-6)
