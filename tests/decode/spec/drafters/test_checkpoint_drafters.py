"""Drafters loaded from `python -m specjax.train` checkpoints (spec=medusa|eagle|draft via SpecConfig).

Tiny runs train for two steps on a random target; the decoder then loads the run directory through
the same factory the CLI uses. Whatever the heads learned, greedy speculative output must equal plain
greedy output (verification is lossless for any draft).
"""

from __future__ import annotations

import pytest
from conftest import ByteTokenizer

from specjax.decode import GenerateConfig, GenerationError, Generator, SpecConfig, SpeculativeGenerator
from specjax.train.config import ArchConfig, DataConfig, OptimConfig, TaskConfig, TrainConfig
from specjax.train.models import build_target
from specjax.train.trainer import train

PROMPTS = ["abcabcabc", "hello there", "xyz"]


def _run(tmp_path, kind: str):
    task = TaskConfig(kind=kind, target=None, target_arch=ArchConfig(preset="tiny"),
                      draft_arch=ArchConfig(preset="tiny", n_layers=1), init_layers=(1,))
    cfg = TrainConfig(task=task, data=DataConfig(source="synthetic", num_prompts=16, dev_prompts=4, max_new_tokens=16),
                      optim=OptimConfig(lr=3e-3, warmup_steps=1), steps=2, batch_size=4, seq_len=32,
                      out_dir=str(tmp_path / kind), log_every=1, eval_every=0, save_every=0, progress=False,
                      tensorboard=False)
    train(cfg)
    return cfg


@pytest.mark.parametrize("kind,k", [("medusa", 6), ("eagle", 6), ("draft", 3)])
def test_trained_checkpoint_drafts_losslessly(tmp_path, kind, k):
    cfg = _run(tmp_path, kind)
    target = build_target(cfg.task).model
    where = {"draft_model": cfg.out_dir} if kind == "draft" else {"draft_checkpoint": cfg.out_dir}
    gen_cfg = GenerateConfig(max_new_tokens=12, batch_size=3, ignore_eos=True)
    ref, _ = Generator(target, ByteTokenizer()).generate(PROMPTS, gen_cfg)
    spec = SpecConfig(k=k, method=kind, adaptive=False, eagle_depth=3, eagle_top_k=2, **where)
    out, stats = SpeculativeGenerator(target, ByteTokenizer()).generate(PROMPTS, gen_cfg, spec)
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert stats.rounds > 0 and stats.mean_draft_len > 0, stats.line()


def test_checkpoint_of_the_wrong_kind_is_refused(tmp_path):
    cfg = _run(tmp_path, "medusa")
    target = build_target(cfg.task).model
    spec = SpecConfig(k=4, method="eagle", draft_checkpoint=cfg.out_dir)
    with pytest.raises(GenerationError, match="holds a medusa draft, not eagle"):
        SpeculativeGenerator(target, ByteTokenizer()).generate(PROMPTS, GenerateConfig(max_new_tokens=4), spec)


@pytest.mark.parametrize("changes,message", [
    ({"method": "medusa"}, "the medusa method needs trained heads: set draft_checkpoint="),
    ({"method": "eagle", "draft_checkpoint": "/nonexistent/run"}, "draft_checkpoint='/nonexistent/run': no such"),
])
def test_bad_checkpoint_options_are_named(changes, message):
    with pytest.raises(GenerationError, match=message.replace("(", r"\(")):
        SpecConfig(**changes)
