"""A separate draft model with its own KV cache, on tiny models.

The sharpest check of the draft cache's bookkeeping (prefill in `init`, committed tokens written by
`observe` after every round, the last token re-fed by `propose`, rejected slots overwritten): a draft
model that IS the target's first two layers must draft exactly what the early-exit layer-skip drafter
drafts from the target's own cache — same tokens, hence the same rounds and acceptance, not just the
same output — also when adaptive drafting skips `propose` for runs of plain rounds.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer, tiny_config
from flax import nnx
from test_layer_skip import KEPT, check_sampled_draft, first_tokens_joint_test
from test_speculative import BIGRAM_PROMPTS, EOS, PROMPTS, TOK, K, bigram_model, oracle

from specjax.decode import (
    GenerateConfig,
    GenerationError,
    Generator,
    LayerSkipDrafter,
    Prefill,
    SpecConfig,
    SpeculativeGenerator,
    speculative_program,
)
from specjax.decode.spec.drafters.draft_model import DraftModelDrafter, slice_model
from specjax.models import Transformer

CFG = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_model):
    return [r.tokens for r in Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, CFG)[0]]


@pytest.mark.parametrize("spec", [SpecConfig(k=K, adaptive=False),
                                  SpecConfig(k=K, min_expected_accept=3.0, verify_cost=1.0, probe_every=2)])
def test_sliced_draft_model_drafts_exactly_like_early_exit(tiny_model, reference, spec):
    # Rows whose 2-layer drafts hit ("abcabc…" rarely does, and the batch speculates only when its worst row pays).
    prompts = PROMPTS[1:]
    drafter, params = DraftModelDrafter.create(slice_model(tiny_model, (0, 1)), tiny_model)
    out, stats = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter, params).generate(prompts, CFG, spec)
    assert [o.tokens for o in out] == reference[1:]
    _, skip = SpeculativeGenerator(tiny_model, ByteTokenizer(), LayerSkipDrafter.early_exit(2)).generate(
        prompts, CFG, spec)
    assert (stats.rounds, stats.acceptance_by_position) == (skip.rounds, skip.acceptance_by_position)
    assert stats.plain_rate == skip.plain_rate and (stats.plain_rate > 0) == spec.adaptive, stats.line()
    # Adaptive: a row's first tokens are plain while the round-0 probe's shadow is checked.
    assert stats.tau > (1.3 if spec.adaptive else 1.5), stats.line()


def test_random_draft_model_reduced_vocab_adaptive_batch1(tiny_model, reference):
    # An unrelated one-layer model: few drafts are accepted, adaptive drafting mixes plain rounds in
    # (in which the draft model only observes), and greedy output stays exact.
    draft = Transformer(tiny_config(n_layers=1, layer_kinds=("global",), d_model=16, ffn_dim=32), rngs=nnx.Rngs(5))
    drafter, params = DraftModelDrafter.create(draft, tiny_model, vocab_ids=KEPT, threshold=0.05)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter, params)
    out, stats = gen.generate(PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=1, ignore_eos=True),
                              SpecConfig(k=3, min_expected_accept=1.0))
    assert [o.tokens for o in out] == reference
    assert stats.plain_rate > 0, stats.line()


@pytest.mark.parametrize("k", [K, pytest.param(1, marks=pytest.mark.slow)])
def test_every_draft_accepted_and_eos_inside_a_block(k):
    # The bigram model drafts perfectly with any of its layers: every round accepts all k drafts, so the
    # bonus token and the last draft are both new to the draft cache (`observe` writes them).
    model = bigram_model(EOS)
    drafter, params = DraftModelDrafter.create(slice_model(model, (1,)), model)
    # min_best_gain=0: the slice reads most of the tiny target's bytes (its head), so the policy would
    # switch speculation off; this test is about acceptance and the draft cache.
    out, stats = SpeculativeGenerator(model, TOK, drafter, params).generate(
        BIGRAM_PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=3), SpecConfig(k=k, min_best_gain=0))
    assert out[0].finish_reason == "eos" and out[0].tokens == oracle(BIGRAM_PROMPTS[0], 2)
    for p, o in zip(BIGRAM_PROMPTS[1:], out[1:], strict=True):
        assert o.finish_reason == "length" and o.tokens == oracle(p, 16)
    assert stats.acceptance_by_position == (1.0,) * k


def test_vocabulary_mismatch_is_refused(tiny_model):
    other = Transformer(tiny_config(vocab_size=80), rngs=nnx.Rngs(0))
    with pytest.raises(GenerationError, match=r"draft model's vocabulary \(80 tokens\) differs from the target's \(64"):
        DraftModelDrafter.create(other, tiny_model)
    with pytest.raises(GenerationError, match="draft vocabulary ids"):
        DraftModelDrafter.create(tiny_model, tiny_model, vocab_ids=[70])
    with pytest.raises(GenerationError, match="needs a draft model"):
        SpecConfig(method="draft")


def test_sampled_draft_q_is_what_the_tokens_were_drawn_from(tiny_model):
    draft = slice_model(tiny_model, (0, 2))
    drafter, params = DraftModelDrafter.create(draft, tiny_model, vocab_ids=KEPT)

    def init(state):
        t = int(state.pos_b[0])

        @jax.jit  # eagerly, each op of the 2000-row draft prefill would compile on its own
        def prefill(p, hist_bl, pos_b, last_b):
            return drafter.init(tiny_model, p, Prefill(tokens_bt=hist_bl[:, :t], len_b=pos_b, hidden_btd=None,
                                                       first_b=last_b, num_slots=state.cache.num_slots))

        return prefill(params, state.hist_bl, state.pos_b, state.last_b)

    check_sampled_draft(drafter, params, tiny_model, draft, KEPT, init=init)


@pytest.mark.slow
def test_sampling_is_lossless_end_to_end(tiny_model):
    drafter, params = DraftModelDrafter.create(slice_model(tiny_model, (0,)), tiny_model)
    stats = first_tokens_joint_test(SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter, params), tiny_model,
                                    SpecConfig(k=2, adaptive=False))
    assert 0.05 < stats.acceptance_by_position[0] < 0.95, stats.line()


@pytest.mark.slow
@pytest.mark.parametrize("adaptive", [False, True])
def test_draft_cache_matches_a_fresh_prefill_of_the_committed_text(tiny_model, adaptive):
    draft = slice_model(tiny_model, (0, 1))
    drafter, params = DraftModelDrafter.create(draft, tiny_model)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter, params)
    key, args, static = gen._batch_inputs([gen.encode([p], False)[0] for p in PROMPTS], CFG, None, 0, extra_slots=K)
    policy = SpecConfig(k=K, adaptive=adaptive, min_expected_accept=3.0, verify_cost=1.0, probe_every=2).policy()
    state = speculative_program(gen.graphdef, *args, params, **static, k=K, drafter=drafter, adapt=policy)
    assert int(jnp.sum(state.counters.plain_rounds_b) > 0) == adaptive
    hist_bl, pos_b = np.asarray(state.row.hist_bl), np.asarray(state.row.pos_b)
    _, fresh = draft(jnp.asarray(hist_bl), jnp.broadcast_to(jnp.arange(hist_bl.shape[1]), hist_bl.shape),
                     draft.init_cache(hist_bl.shape[0], state.draft.num_slots), jnp.zeros((4,), jnp.int32))
    for b in range(4):
        # Every committed token, the last one (at pos_b) included: `observe` wrote them all.
        n = int(pos_b[b]) + 1
        for got, want in zip(state.draft.slot_major(), fresh.slot_major(), strict=True):
            np.testing.assert_allclose(np.asarray(got[b, :n]), np.asarray(want[b, :n]), atol=1e-4)
