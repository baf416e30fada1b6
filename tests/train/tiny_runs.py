"""Tiny training runs for the tests of this folder: a random 2-layer target (vocab 64), synthetic data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specjax.train.config import ArchConfig, DataConfig, OptimConfig, TaskConfig, TrainConfig


def tiny_run(out_dir, kind: str = "draft", **changes) -> TrainConfig:
    """A config that trains in seconds on one CPU core; `changes` override top-level fields."""
    task = TaskConfig(kind=kind, target=None, target_arch=ArchConfig(preset="tiny"),
                      draft_arch=ArchConfig(preset="tiny", n_layers=1), init_layers=(1,))
    # Feature caches (head tasks) next to the run, shared by the runs of one test.
    data = DataConfig(source="synthetic", num_prompts=64, dev_prompts=8, max_new_tokens=32,
                      feature_dir=str(Path(out_dir).parent / "features"))
    base = TrainConfig(task=task, data=data,
                       optim=OptimConfig(lr=3e-3, warmup_steps=2), steps=6, batch_size=8, seq_len=32,
                       out_dir=str(out_dir), log_every=1, eval_every=0, save_every=0, progress=False,
                       tensorboard=False)
    return dataclasses.replace(base, **changes)
