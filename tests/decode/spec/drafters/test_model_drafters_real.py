"""Greedy speculative decoding with model drafters equals plain greedy on the real Gemma 3 270M.

Batch 4 with ragged prompts. A (k+1)-row verification forward is not bit-identical to one-row plain
steps, so a divergence is tolerated only at a near tie of plain greedy (`greedy_parity`, which counts
them); any other divergence fails.
"""

import numpy as np
import pytest
from greedy_parity import greedy_divergences

from specjax.decode import GenerateConfig, Generator, LayerSkipDrafter, SpecConfig, SpeculativeGenerator
from specjax.decode.spec.drafters.draft_model import DraftModelDrafter, slice_model
from specjax.models import DraftVocab

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPTS = [
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\nRepeat this list exactly:",
    "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
    "<start_of_turn>user\nCalculate the atomic mass for lithium.<end_of_turn>\n<start_of_turn>model\n",
    "def fibonacci(n):",
]
CFG = GenerateConfig(max_new_tokens=32, batch_size=4)


def check_parity(model, tok, ref, out, label):
    return len(greedy_divergences(model, [tok.encode(p) for p in PROMPTS], ref, out, label))


@pytest.fixture(scope="module")
def reference(real_model, real_tokenizer):
    return Generator(real_model, real_tokenizer).generate(PROMPTS, CFG)[0]


def test_layer_skip_greedy_equals_plain(real_model, real_tokenizer, reference):
    # Early exit after 15 of 18 layers (Gemma 3 270M's earlier exits agree with the full model on almost
    # no token), over 16,384 draft ids.
    vocab = DraftVocab(np.arange(16_384), real_model.cfg.vocab_size)
    gen = SpeculativeGenerator(real_model, real_tokenizer, LayerSkipDrafter.early_exit(15), vocab.head(
        real_model.embed[...], real_model.cfg.final_logit_softcap))
    out, stats = gen.generate(PROMPTS, CFG, SpecConfig(k=4, adaptive=False))
    ties = check_parity(real_model, real_tokenizer, reference, out, "layer skip")
    print(f"layer skip: {ties} near-tie divergences; {stats.line()}")
    assert stats.tau > 1.3, stats.line()


def test_sliced_draft_model_greedy_equals_plain(real_model, real_tokenizer, reference):
    drafter, params = DraftModelDrafter.create(slice_model(real_model, (0, 1)), real_model)
    # adaptive=False: 2 layers through the full head would never pay here, so the policy runs plain decoding.
    out, stats = SpeculativeGenerator(real_model, real_tokenizer, drafter, params).generate(
        PROMPTS, CFG, SpecConfig(k=3, adaptive=False))
    ties = check_parity(real_model, real_tokenizer, reference, out, "draft model")
    print(f"draft model: {ties} near-tie divergences; {stats.line()}")
