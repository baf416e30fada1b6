"""The training loop on tiny runs: learning, accumulation, NaN stop, metrics files, checkpoints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import load_draft_checkpoint
from specjax.train.config import OptimConfig
from specjax.train.step import init_state, make_optimizer, make_train_step
from specjax.train.trainer import TrainingDiverged, prepare, train


@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_short_run_lowers_dev_loss_and_leaves_loadable_checkpoint(tiny_train_config, kind):
    cfg = tiny_train_config(kind, steps=12, eval_every=1, save_every=6, tensorboard=True)
    result = train(cfg)
    assert any(p.name.startswith("events.out.tfevents") for p in (result.out_dir / "tb").iterdir())
    dev = [h["dev_loss"] for h in result.history if "dev_loss" in h]
    assert len(dev) == 12 and dev[-1] < dev[0]
    rows = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 13))
    assert {"loss", "acc", "top5", "tok_s", "step_s", "wall_s", "lr", "grad_norm"} <= set(train_rows[0])
    ckpt = load_draft_checkpoint(result.out_dir)
    assert ckpt.kind == kind and ckpt.target.startswith("random:tiny")
    exported = result.task.export(result.state.params, result.task.frozen)
    for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(ckpt.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_medusa_run_in_bfloat16_trains_heads_with_float32_master_weights(tiny_train_config):
    result = train(tiny_train_config("medusa", steps=3, eval_every=3, compute_dtype="bfloat16"))
    assert {"acc_head1", "acc_head4", "ce_head4"} <= set(result.dev) and np.isfinite(result.dev["loss"])
    assert float(jnp.abs(result.state.params["w"][...]).max()) > 0  # zero-initialised heads moved
    assert {x.dtype for x in jax.tree.leaves((result.state.params, result.state.opt_state))} <= {
        jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}


def test_gradient_accumulation_matches_one_big_batch(tiny_train_config):
    cfg = tiny_train_config()
    _, rows, _, task = prepare(cfg)
    batch = {"tokens": jnp.asarray(rows.tokens[:8]), "mask": jnp.asarray(rows.mask[:8])}
    outs = []
    for accum in (1, 4):
        tx, schedule = make_optimizer(dataclasses.replace(cfg.optim, warmup_steps=0), 10)
        step = jax.jit(make_train_step(task.loss_fn, tx, schedule))
        mb = {k: v.reshape(accum, 8 // accum, -1) for k, v in batch.items()}
        state, m = step(init_state(task.params, tx, 0), task.frozen, mb)
        outs.append((state.params, float(m["loss"]), float(m["grad_norm"])))
    assert outs[0][1] == pytest.approx(outs[1][1], rel=1e-5)
    assert outs[0][2] == pytest.approx(outs[1][2], rel=1e-5)
    # Adam's first update is ~lr * sign(g): a gradient within float noise of 0 may flip sign, so
    # parameters are compared to 3% of lr (3e-3), far below the 2*lr a wrong gradient would give.
    for a, b in zip(jax.tree.leaves(outs[0][0]), jax.tree.leaves(outs[1][0]), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)


def test_nan_stops_with_clear_message_and_keeps_last_good_checkpoint(tiny_train_config):
    # lr 1e30 without warmup: step 1's update makes the weights ~1e30 (finite), step 2 overflows.
    cfg = tiny_train_config(optim=OptimConfig(lr=1e30, warmup_steps=0, clip_norm=1.0), save_every=1)
    expected = r"step 2: loss .* is not finite; stopped\. Last good checkpoint: step 1"
    with pytest.raises(TrainingDiverged, match=expected):
        train(cfg)
    ckpt_dir = Path(cfg.out_dir) / "ckpt"
    assert sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()) == [1]

