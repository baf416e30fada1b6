"""Token Recycling and lookup trees on the real Gemma 3 270M at batch 1: greedy output equals plain greedy
(up to near ties: `greedy_parity`), every round speculating and with the adaptive policy (~8 min per
method at load 7: two 13-row tree programs compile for ~1-3 min each).

Batch 8 with ragged prompts and EOS inside accepted blocks: test_batch8_equality_real.
"""

import pytest
from greedy_parity import greedy_divergences

from specjax.decode import GenerateConfig, Generator, SpecConfig, SpeculativeGenerator

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPTS = [
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\n"
    "Repeat this list exactly: apples, pears, plums, cherries, figs, dates.\nRepeat this list exactly:",
    "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
]


@pytest.mark.parametrize("method", ["recycle", "lookup"])
def test_batch1_greedy_equals_plain_greedy(real_model, real_tokenizer, method):
    cfg = GenerateConfig(max_new_tokens=48, batch_size=1)
    plain, _ = Generator(real_model, real_tokenizer).generate(PROMPTS, cfg)
    ids = [real_tokenizer.encode(p) for p in PROMPTS]
    gen = SpeculativeGenerator(real_model, real_tokenizer)
    for adaptive in (False, True):
        spec, stats = gen.generate(PROMPTS, cfg, SpecConfig(k=12, method=method, adaptive=adaptive))
        greedy_divergences(real_model, ids, plain, spec, f"{method} batch 1 adaptive={adaptive}")
        print(stats.line())
        if not adaptive:  # (the policy may decide the trees do not pay for a 13-row verify forward: plain rounds)
            assert stats.tau > 1.2, stats.line()  # trees are drafted and accepted
