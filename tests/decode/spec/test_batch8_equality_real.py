"""Every drafter at batch 8 on the real Gemma 3 270M: greedy speculative output equals plain greedy.

Eight chat prompts from ../shared/data/prompts, 16 to 132 tokens (ragged): input-grounded ones
(paraphrase, correct, rewrite, sort, select from a list, find a syntax error) whose continuations copy
the prompt, so drafts get accepted, and open ones (atomic mass, a GSM8K problem). Three tokens that
plain greedy emits mid-continuation (first occurrences, in no other row) are made extra EOS ids, so
three rows must stop exactly where plain greedy would have — for the drafters that get drafts
accepted, inside an accepted block (`greedy_parity.run_speculative`'s `discarded_b`). The near-tie
rule and its epsilon are `greedy_parity.NEAR_TIE`; every run prints its count of tolerated
divergences.

All slow: the n-gram case alone takes ~55 s on 2 shared cores (plain reference ~35 s with the model
load, speculative run ~20 s), over the default suite's budget; test_speculative_real (batch 2) and
test_batch8_equality (tiny models, every drafter at batch 8) stay in the default suite.
"""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from greedy_parity import greedy_divergences, run_speculative, truncate_at

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
)
from specjax.decode.spec.drafters.draft_model import DraftModelDrafter, slice_model
from specjax.decode.spec.trees import MEDUSA_63, StaticTree
from specjax.models import DraftVocab, EagleConfig, EagleHead
from specjax.models.medusa import MedusaConfig, MedusaHeads, randomize

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "prompts"
PROMPT_IDS = [  # (file, id): tokens with the chat template
    ("alpaca_seed_tasks.jsonl", "alpaca-seed-seed_task_98-0"),  # paraphrase a paragraph (117)
    ("alpaca_seed_tasks.jsonl", "alpaca-seed-seed_task_42-0"),  # correct a sentence's grammar (54)
    ("alpaca_80.jsonl", "alpaca80-1"),  # atomic mass of lithium (16)
    ("alpaca_seed_tasks.jsonl", "alpaca-seed-seed_task_158-0"),  # a syntax error in code (132)
    ("alpaca_seed_tasks.jsonl", "alpaca-seed-seed_task_132-0"),  # sort a list of numbers (41)
    ("gsm8k_train.jsonl", None),  # the first GSM8K problem (46)
    ("alpaca_seed_tasks.jsonl", "alpaca-seed-seed_task_97-0"),  # rewrite a sentence (28)
    ("alpaca_seed_tasks.jsonl", "alpaca-seed-seed_task_163-0"),  # the oldest person of a list (28)
]
EOS_ROWS = (1, 4, 6)  # rows whose continuation an extra EOS id cuts
CFG = GenerateConfig(max_new_tokens=48, batch_size=8, chat=True)


def load_prompts() -> list[str]:
    out = []
    for name, wanted in PROMPT_IDS:
        with open(DATA / name, encoding="utf-8") as f:  # by "\n": prompts may hold U+2028 (splitlines splits)
            rows = (json.loads(line) for line in f)
            out.append(next(r["prompt"] for r in rows if wanted is None or r["id"] == wanted))
    return out


PROMPTS = load_prompts()


def extra_eos(plain) -> dict[int, int]:
    """row -> token: in each EOS row, the first token from position 8 on that occurs neither earlier in
    the row nor anywhere in another row's text (so exactly that row stops, at that position)."""
    chosen = {}
    for r in EOS_ROWS:
        others = {t for j, c in enumerate(plain) if j != r for t in c.tokens}
        toks = plain[r].tokens
        chosen[r] = next(t for i, t in enumerate(toks) if i >= 8 and t not in toks[:i] and t not in others
                         and t not in chosen.values())
    return chosen


@pytest.fixture(scope="module")
def reference(real_model, real_tokenizer):
    """(prompt ids, plain greedy completions, the extra EOS ids, the completions they would give)."""
    gen = Generator(real_model, real_tokenizer)
    plain, _ = gen.generate(PROMPTS, CFG)
    assert all(c.finish_reason == "length" for c in plain)
    eos = extra_eos(plain)
    cut = truncate_at(plain, set(eos.values()), real_tokenizer)
    assert [i for i, c in enumerate(cut) if c.finish_reason == "eos"] == list(EOS_ROWS)
    return gen.encode(PROMPTS, CFG.chat), cut, tuple(real_model.cfg.eos_ids) + tuple(eos.values())


def _build(which: str, model, tokenizer):
    """(drafter, draft_params, k) — heads are random (this checks correctness, not speed)."""
    if which == "ngram":
        return NgramDrafter(), (), 4
    if which == "lookup":
        return LookupTreeDrafter(), (), 12
    if which == "recycle":  # the top-8 table: greedy verification goes through the head's chunked top-k
        return RecycleDrafter.create(12), (), 12
    if which == "layerskip":  # early exit after 15 of 18 layers over 16,384 draft ids
        vocab = DraftVocab(np.arange(16_384), model.cfg.vocab_size)
        return LayerSkipDrafter.early_exit(15), vocab.head(model.embed[...], model.cfg.final_logit_softcap), 4
    if which == "draft":  # the target's first two layers as a separate draft model with its own cache
        return *DraftModelDrafter.create(slice_model(model, (0, 1)), model), 3
    if which == "medusa":
        heads = randomize(MedusaHeads(MedusaConfig.from_target(model.cfg, n_heads=3)), jax.random.key(0))
        tree = StaticTree.from_paths(MEDUSA_63[:15])
        return *MedusaDrafter.build(heads, model, tree), tree.size
    vocab = None
    if which == "eagle_vocab":
        texts = [json.loads(line)["prompt"] for line in (DATA / "alpaca_eval.jsonl").read_text().splitlines()]
        vocab = DraftVocab.from_texts(texts, tokenizer, model.cfg.vocab_size, size=4096, always=model.cfg.eos_ids)
    head = EagleHead(EagleConfig.from_target(model.cfg), rngs=nnx.Rngs(0))
    return *EagleDrafter.build(head, model, vocab, depth=4, top_k=4), 10


# Drafters whose drafts the target accepts on these prompts (tau 3.1 and 2.3; the 2-layer draft model
# and random heads stay at ~1): their EOS rows must stop inside an accepted block.
ACCEPTING = {"ngram", "layerskip", "lookup", "recycle"}


@pytest.mark.parametrize("which", ["ngram", "lookup", "recycle", "layerskip", "draft", "medusa", "eagle",
                                   "eagle_vocab"])
def test_batch8_greedy_equals_plain_with_eos_inside_blocks(real_model, real_tokenizer, reference, which):
    ids, want, eos_ids = reference
    drafter, params, k = _build(which, real_model, real_tokenizer)
    gen = SpeculativeGenerator(real_model, real_tokenizer, drafter, params)
    run = run_speculative(gen, PROMPTS, CFG, SpecConfig(k=k, adaptive=False), eos_ids=eos_ids)
    ties = greedy_divergences(real_model, ids, want, run.completions, f"real {which} batch 8")
    print(f"real {which}: tau {run.tau:.2f}, rounds {run.rounds_b.tolist()}, tokens dropped after the stop "
          f"{run.discarded_b.tolist()}")
    rows = [r for r in EOS_ROWS if r not in {d.row for d in ties}]
    for r in rows:
        assert run.completions[r].finish_reason == "eos", (which, r)
    if which in ACCEPTING:
        assert run.tau > 1.5, run.tau
        assert any(run.discarded_b[r] > 0 for r in rows), f"no EOS row stopped inside an accepted block: " \
                                                          f"{run.discarded_b.tolist()}"
