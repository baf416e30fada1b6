"""Greedy speculative decoding equals plain greedy on the real Gemma 3 270M (up to near ties: `greedy_parity`).

Batch 8 with ragged prompts, EOS inside accepted blocks and every drafter: test_batch8_equality_real.
"""

import pytest
from greedy_parity import greedy_divergences

from specjax.decode import GenerateConfig, Generator, SpecConfig, SpeculativeGenerator

pytestmark = [pytest.mark.real_model, pytest.mark.slow]  # the tiny-model equalities run in the default tier

PROMPTS = [
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\n"
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\nRepeat this list exactly:",
    "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
]


def test_ngram_speculative_greedy_equals_plain_greedy_batch2(real_model, real_tokenizer):
    cfg = GenerateConfig(max_new_tokens=48, batch_size=2)
    plain, _ = Generator(real_model, real_tokenizer).generate(PROMPTS, cfg)
    # Every round speculates: the adaptive policy would keep this batch plain while the second row's
    # drafts miss (the slowest row decides, `spec.policy.wants`).
    spec, stats = SpeculativeGenerator(real_model, real_tokenizer).generate(PROMPTS, cfg,
                                                                            SpecConfig(k=4, adaptive=False))
    greedy_divergences(real_model, [real_tokenizer.encode(p) for p in PROMPTS], plain, spec, "n-gram batch 2")
    assert stats.tau > 1.2  # the repeated list is drafted and accepted
