"""Greedy speculative decoding equals plain greedy on the real Gemma 3 270M."""

import pytest

from specjax.decode.generate import GenerateConfig, Generator
from specjax.decode.speculative import SpecConfig, SpeculativeGenerator

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\n"
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\nRepeat this list exactly:",
    "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
]


def test_ngram_speculative_greedy_equals_plain_greedy_batch2(real_model, real_tokenizer):
    cfg = GenerateConfig(max_new_tokens=48, batch_size=2)
    plain, _ = Generator(real_model, real_tokenizer).generate(PROMPTS, cfg)
    spec, stats = SpeculativeGenerator(real_model, real_tokenizer).generate(PROMPTS, cfg, SpecConfig(k=4))
    for a, b in zip(plain, spec, strict=True):
        assert b.tokens == a.tokens and b.finish_reason == a.finish_reason
    assert stats.tau > 1.2  # the repeated list is drafted and accepted
