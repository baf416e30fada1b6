"""Exact resume: an interrupted run (stopped, or killed with SIGKILL) ends where an uninterrupted one does."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from tiny_runs import tiny_run

from specjax.train.config import from_dict, to_dict
from specjax.train.trainer import train

_KILLED_RUN = """
import json, os, signal, sys
from specjax.train.config import from_dict
from specjax.train.trainer import train
cfg, kill_at = from_dict(json.loads(sys.argv[1])), int(sys.argv[2])
def hook(step, state):
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
train(cfg, on_step=hook)
"""


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves((state.params, state.opt_state, state.rng, state.step))]


def _assert_bitwise(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _train_steps(path: Path) -> list[int]:
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r["split"] == "train"]


def test_config_round_trips_through_json(tmp_path):
    cfg = tiny_run(tmp_path)
    assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg


@pytest.mark.parametrize("kind", ["draft", "eagle"])  # eagle: trained from the cached target features
def test_stop_then_resume_is_bitwise_identical(tmp_path, kind):
    full = train(tiny_run(tmp_path / "full", kind, steps=6, save_every=2))
    first = train(tiny_run(tmp_path / "split", kind, steps=3, save_every=2))  # checkpoints at 2 and at its end, 3
    assert int(first.state.step) == 3
    resumed = train(tiny_run(tmp_path / "split", kind, steps=6, save_every=2))
    _assert_bitwise(full.state, resumed.state)
    assert _train_steps(tmp_path / "split") == list(range(1, 7))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["draft", "medusa"])  # medusa: trained from the cached target features
def test_kill_9_mid_run_then_resume_is_bitwise_identical(tmp_path, kind):
    cfg = tiny_run(tmp_path / "killed", kind, steps=8, save_every=2)
    full = train(dataclasses.replace(cfg, out_dir=str(tmp_path / "full")))
    proc = subprocess.run([sys.executable, "-c", _KILLED_RUN, json.dumps(to_dict(cfg)), "5"], cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = sorted(int(p.name) for p in (tmp_path / "killed" / "ckpt").iterdir() if p.name.isdigit())
    assert ckpts and max(ckpts) in (2, 4)  # step 4's async save may or may not have committed
    resumed = train(cfg)
    _assert_bitwise(full.state, resumed.state)
    assert _train_steps(tmp_path / "killed") == list(range(1, 9))
