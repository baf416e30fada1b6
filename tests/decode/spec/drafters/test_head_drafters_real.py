"""Medusa and EAGLE drafters with untrained (random) heads on the real Gemma 3 270M: greedy output
must equal plain greedy output token for token up to near ties (`greedy_parity`). τ stays near 1 —
this is a correctness check; the training issue produces heads that are worth running."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from greedy_parity import greedy_divergences

from specjax.decode import EagleDrafter, GenerateConfig, Generator, MedusaDrafter, SpecConfig, SpeculativeGenerator
from specjax.decode.spec.trees import MEDUSA_63, StaticTree
from specjax.models import DraftVocab, EagleConfig, EagleHead
from specjax.models.medusa import MedusaConfig, MedusaHeads, randomize

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPTS = [
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\n"
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\nRepeat this list exactly:",
    "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
]
CORPUS = Path(__file__).resolve().parents[5] / "shared" / "data" / "prompts" / "alpaca_eval.jsonl"
CFG = GenerateConfig(max_new_tokens=32, batch_size=2)


@pytest.fixture(scope="module")
def plain_out(real_model, real_tokenizer):
    return Generator(real_model, real_tokenizer).generate(PROMPTS, CFG)[0]


def _check(model, tok, drafter, params, k, plain_out):
    out, stats = SpeculativeGenerator(model, tok, drafter=drafter, draft_params=params).generate(
        PROMPTS, CFG, SpecConfig(k=k, adaptive=False))
    greedy_divergences(model, [tok.encode(p) for p in PROMPTS], plain_out, out, type(drafter).__name__)
    print(type(drafter).__name__, stats.line())
    return stats


def test_random_medusa_heads_greedy_equals_plain(real_model, real_tokenizer, plain_out):
    heads = randomize(MedusaHeads(MedusaConfig.from_target(real_model.cfg, n_heads=3)), jax.random.key(0))
    tree = StaticTree.from_paths(MEDUSA_63[:15])  # the paper's most valuable 15 nodes (prefix-closed)
    drafter, params = MedusaDrafter.build(heads, real_model, tree)
    stats = _check(real_model, real_tokenizer, drafter, params, tree.size, plain_out)
    assert stats.plain_rate == 0


def test_random_eagle_head_with_draft_vocab_greedy_equals_plain(real_model, real_tokenizer, plain_out):
    texts = [json.loads(line)["prompt"] for line in CORPUS.read_text().splitlines()]
    vocab = DraftVocab.from_texts(texts, real_tokenizer, real_model.cfg.vocab_size, size=4096,
                                  always=real_model.cfg.eos_ids)
    head = EagleHead(EagleConfig.from_target(real_model.cfg), rngs=nnx.Rngs(0))
    drafter, params = EagleDrafter.build(head, real_model, vocab, depth=4, top_k=4)
    stats = _check(real_model, real_tokenizer, drafter, params, 10, plain_out)
    assert stats.plain_rate == 0 and np.isfinite(stats.tau)
