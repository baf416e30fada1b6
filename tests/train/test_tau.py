"""Periodic τ on dev prompts inside the training loop (tiny random target, synthetic data)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from specjax.decode import GenerateConfig, SpecConfig
from specjax.models import load_draft_checkpoint
from specjax.train.config import TrainConfigError
from specjax.train.data import Document
from specjax.train.tau import _TokenPromptGenerator, prompt_ids
from specjax.train.trainer import prepare_run, train


@pytest.mark.parametrize(("kind", "draft_vocab", "eagle_layers"), [
    pytest.param("draft", 0, (), marks=pytest.mark.slow), ("medusa", 32, ()), ("eagle", 0, ()),
    ("eagle", 32, (0, 1))])  # EAGLE-3: fused target layers, trained with training-time test
def test_tau_is_logged_every_tau_every_steps_and_matches_the_saved_drafter(tiny_train_config, kind, draft_vocab,
                                                                           eagle_layers):
    cfg = tiny_train_config(kind, steps=4, tau_every=2, tau_prompts=4, tau_new_tokens=16)
    task = dataclasses.replace(cfg.task, draft_vocab=draft_vocab, eagle_layers=eagle_layers)
    loss = dataclasses.replace(cfg.loss, eagle_ttt_steps=2 if eagle_layers else 1)
    cfg = dataclasses.replace(cfg, task=task, loss=loss)
    result = train(cfg)
    if draft_vocab:
        assert len(load_draft_checkpoint(result.out_dir).vocab_ids) == draft_vocab
    if eagle_layers:
        assert load_draft_checkpoint(result.out_dir).config.fuse_layers == eagle_layers
    rows = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    tau_rows = [r for r in rows if r["split"] == "tau"]
    assert [r["step"] for r in tau_rows] == [2, 4]
    depth = 3 if kind == "medusa" else 4  # Medusa's 10-node tree is 3 deep; EAGLE-2 depth 4; draft: 4-token chains
    assert {"tau", "draft_rate", "tau_s", *(f"accept_d{i}" for i in range(1, depth + 1))} == set(tau_rows[-1]) - {
        "step", "split"}
    last = tau_rows[-1]
    assert 1.0 <= last["tau"] <= 1 + depth and all(0.0 <= last[f"accept_d{i}"] <= 1.0 for i in range(1, depth + 1))
    # The same drafter loaded from the saved run through spec_methods (the decoders' path) gives the same τ.
    prep = prepare_run(cfg)
    gen = _TokenPromptGenerator(prep.target.model, None)
    where = {"draft_model": str(result.out_dir)} if kind == "draft" else {"draft_checkpoint": str(result.out_dir)}
    spec = SpecConfig(k=4 if kind == "draft" else 10, adaptive=False, method=kind, **where)
    _, stats = gen.generate(prep.dev_prompts, GenerateConfig(max_new_tokens=16, batch_size=4), spec)
    assert stats.tau == pytest.approx(last["tau"], abs=1e-9)
    assert list(stats.acceptance_by_position[:depth]) == pytest.approx([last[f"accept_d{i}"] for i in
                                                                        range(1, depth + 1)], abs=1e-9)


def test_tau_prompts_are_the_prompt_tokens_of_dev_documents():
    chat = Document(np.array([2, 5, 6, 7, 8, 9]), np.array([0, 0, 0, 1, 1, 1], np.float32))
    corpus = Document(np.arange(2, 12), np.array([0] + [1] * 9, np.float32))
    assert prompt_ids([chat, corpus, chat], 2) == [[2, 5, 6], [2, 3, 4, 5, 6]]


def test_bad_tau_options_name_the_option(tiny_train_config):
    with pytest.raises(TrainConfigError, match="tau_every must be >= 0"):
        tiny_train_config("eagle", tau_every=-1)
    with pytest.raises(TrainConfigError, match="tau_new_tokens must be >= 2"):
        tiny_train_config("eagle", tau_new_tokens=1)
