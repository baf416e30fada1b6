"""Every drafter at batch 8 with ragged prompts and EOS inside accepted blocks, on tiny models.

Two models (see test_head_drafters):
  * the "bigram" model (next token = PERM[token]), on which every drafter drafts perfectly (the
    early exit and the sliced draft model because its layers add nothing, Medusa and EAGLE with
    heads built to be right). Its continuations are known, so three rows provably stop on EOS
    strictly inside an accepted block (`discarded_b` > 0), one on the prefill's token, and four
    run to the length limit;
  * the random tiny model with random heads, where most drafts are rejected, with a token that
    plain greedy emits mid-continuation made an extra EOS id: rows end at ragged places.
Greedy speculative output must equal plain greedy output (`greedy_parity.greedy_divergences`).
"""

import dataclasses

import numpy as np
import pytest
from greedy_parity import greedy_divergences, run_speculative, truncate_at
from test_head_drafters import CYCLE_IDS, EOS, PROMPTS8, TOK, _eagle, _medusa, oracle, oracle_eagle, oracle_medusa
from test_head_drafters import bigram_model as head_bigram_model

from specjax.decode import (
    EagleDrafter,
    GenerateConfig,
    Generator,
    LayerSkipDrafter,
    LookupTreeDrafter,
    MedusaDrafter,
    NgramDrafter,
    RecycleDrafter,
    SpecConfig,
    SpeculativeGenerator,
    StaticTree,
)
from specjax.decode.spec.drafters.draft_model import DraftModelDrafter, slice_model
from specjax.models import DraftVocab

DRAFTERS = ["ngram", "lookup", "recycle", "layerskip", "draft", "medusa", "eagle"]
FAST = 5  # the first FAST drafters' random-model test is in the default tier
N = 16
# Ragged (1 to 33 tokens with BOS). Rows 0, 4 and 7 reach EOS ("e") as the 2nd, 3rd and 2nd token of
# their first speculative round's block; row 3's first token (from the prefill) is EOS.
BIGRAM8 = ["abcdeabcdeab", "fghfghf", "ijklmnopijk", "deabcdeabcdeabcd", "bcdeabcdeabcdeabcdeabcdea", "fg",
           "mnopijklmnopijklmnopijklmnopijkl", "cdeab"]
INSIDE_BLOCK = [0, 4, 7]
RANDOM8 = PROMPTS8
K = 4


def _drafter(which: str, model, bigram: bool):
    """(drafter, draft_params, k): right drafts on the bigram model, random heads on the random one."""
    if which == "ngram":
        return NgramDrafter(), (), K
    if which == "lookup":  # 3 continuations of 4 tokens, merged into an 8-node trie
        return LookupTreeDrafter(branches=3, depth=4), (), 8
    if which == "recycle":  # the 8-node template (depth 5) through the shared successor table
        return RecycleDrafter.create(8, width=3), (), 8
    if which == "layerskip":
        return LayerSkipDrafter.early_exit(1 if bigram else 2), (), K
    if which == "draft":
        return *DraftModelDrafter.create(slice_model(model, (1,) if bigram else (0, 1)), model), K
    vocab = DraftVocab.from_counts(np.bincount(CYCLE_IDS, minlength=64), size=20, always=(EOS,)) if bigram else None
    if which == "medusa":
        tree = StaticTree.from_paths([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (1,), (0, 1)])
        drafter, params = (MedusaDrafter.build(oracle_medusa(model), model, tree, vocab) if bigram
                           else _medusa(model, tree.paths))
        return drafter, params, tree.size
    drafter, params = (EagleDrafter.build(oracle_eagle(model), model, vocab, depth=4, top_k=2) if bigram
                       else _eagle(model, depth=3, top_k=2))
    return drafter, params, 6


@pytest.fixture(scope="module")
def bigram():
    model = head_bigram_model()
    plain, _ = Generator(model, TOK).generate(BIGRAM8, GenerateConfig(max_new_tokens=N, batch_size=8))
    want = [oracle(p, N) for p in BIGRAM8]
    want = [w[:w.index(EOS)] if EOS in w else w for w in want]
    assert [c.tokens for c in plain] == want and [c.finish_reason for c in plain].count("eos") == 4
    return model, plain


@pytest.fixture(scope="module")
def random_plain(tiny_model):
    return Generator(tiny_model, TOK).generate(RANDOM8, GenerateConfig(max_new_tokens=12, batch_size=8,
                                                                       ignore_eos=True))[0]


@pytest.mark.parametrize("which", DRAFTERS)
def test_bigram_batch8_eos_inside_accepted_blocks(bigram, which):
    bigram, plain = bigram
    cfg = GenerateConfig(max_new_tokens=N, batch_size=8)
    drafter, params, k = _drafter(which, bigram, bigram=True)
    run = run_speculative(SpeculativeGenerator(bigram, TOK, drafter, params), BIGRAM8, cfg,
                          SpecConfig(k=k, adaptive=False))
    ids = [TOK.encode(p) for p in BIGRAM8]
    assert greedy_divergences(bigram, ids, plain, run.completions, f"bigram {which}") == []
    print(f"discarded {run.discarded_b}, rounds {run.rounds_b}")
    assert (run.discarded_b[INSIDE_BLOCK] > 0).all(), run.discarded_b
    assert run.rounds_b[3] == 0 and run.completions[3].tokens == []  # EOS from the prefill: no round
    assert run.tau > 2.5, run.tau  # whole drafts were accepted


# Random Medusa / EAGLE heads at batch 8 are also in test_head_drafters' default tests (without EOS).
@pytest.mark.parametrize("which", [*DRAFTERS[:FAST],
                                   *(pytest.param(w, marks=pytest.mark.slow) for w in DRAFTERS[FAST:])])
def test_random_model_batch8_ragged_eos(tiny_model, random_plain, which):
    plain = random_plain
    # Extra EOS ids: tokens the plain rows emit mid-continuation (each one's first occurrence ends a row).
    eos = {plain[0].tokens[5], plain[3].tokens[8]}
    want = truncate_at(plain, eos, TOK)
    assert 2 <= [c.finish_reason for c in want].count("eos") < 8, "the extra EOS ids did not make the batch ragged"
    drafter, params, k = _drafter(which, tiny_model, bigram=False)
    run = run_speculative(SpeculativeGenerator(tiny_model, TOK, drafter, params), RANDOM8,
                          GenerateConfig(max_new_tokens=12, batch_size=8), SpecConfig(k=k, min_best_gain=0),
                          eos_ids=tuple(sorted(eos)))  # min_best_gain=0: the policy may not switch drafting off
    ids = [TOK.encode(p) for p in RANDOM8]
    assert greedy_divergences(tiny_model, ids, want, run.completions, f"random {which}") == []


def test_near_tie_rule_tolerates_only_top2_swaps_below_epsilon(tiny_model, random_plain):
    # The rule itself: a fabricated divergence at row 2, token 3 of the random model's plain output.
    from greedy_parity import Divergence, top2

    ids = [TOK.encode(p) for p in RANDOM8]
    plain = random_plain
    prefix = plain[2].tokens[:3]
    (first, second), margin = top2(tiny_model, ids[2] + prefix)
    assert first == plain[2].tokens[3] and margin > 0
    other = next(t for t in range(3, 64) if t not in (first, second))

    def spec_with(token):
        row = dataclasses.replace(plain[2], tokens=[*prefix, token])
        return [*plain[:2], row, *plain[3:]]

    found = greedy_divergences(tiny_model, ids, plain, spec_with(second), "fabricated", eps=margin * 1.01)
    assert found == [Divergence(2, 3, pytest.approx(margin), first, second)]
    with pytest.raises(AssertionError, match="a real divergence"):
        greedy_divergences(tiny_model, ids, plain, spec_with(second), "fabricated", eps=margin * 0.99)
    with pytest.raises(AssertionError, match="outside the top two"):
        greedy_divergences(tiny_model, ids, plain, spec_with(other), "fabricated", eps=margin * 1.01)
    stopped = [*plain[:2], dataclasses.replace(plain[2], tokens=prefix, finish_reason="eos"), *plain[3:]]
    with pytest.raises(AssertionError, match="a real divergence"):  # an early stop is a divergence too
        greedy_divergences(tiny_model, ids, plain, stopped, "fabricated", eps=margin * 0.99)
