"""Self-speculative layer skipping on tiny models: exact greedy parity, the draft's q, lossless sampling.

The reference for a draft distribution is an independent computation: `slice_model` builds the
N-layer model as its own `Transformer`, whose uncached forward over the whole text must give the
distribution the early-exit drafter (reading the target's cache) sampled from.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer, forward, full_logits
from flax import struct
from test_speculative import BIGRAM_PROMPTS, EOS, PROMPTS, TOK, K, bigram_model, oracle

from specjax.decode import GenerateConfig, GenerationError, Generator, SpecConfig, SpeculativeGenerator, build_drafter
from specjax.decode.backend import CPU, BackendProfile
from specjax.decode.sampling import SamplingConfig, filter_logits
from specjax.decode.spec.drafters.base import DraftSampling
from specjax.decode.spec.drafters.draft_model import slice_model
from specjax.decode.spec.drafters.layer_skip import LayerSkipDrafter, reduced_head
from specjax.models import KVCache

CHI2_999 = {26: 54.052}  # scipy.stats.chi2.ppf(0.999, 26)
KEPT = np.arange(3, 64, 2)  # a reduced draft vocabulary: every other byte id


@pytest.fixture(scope="module")
def reference(tiny_model):
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)
    return [r.tokens for r in Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, cfg)[0]]


def test_early_exit_greedy_equals_plain_batch4_ragged(tiny_model, reference):
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=LayerSkipDrafter.early_exit(2))
    out, stats = gen.generate(PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True),
                              SpecConfig(k=K, adaptive=False))
    assert [o.tokens for o in out] == reference
    assert stats.tau > 1.5 and stats.plain_rate == 0, stats.line()


def test_layer_subset_reduced_vocab_and_confidence_greedy_equals_plain_batch1(tiny_model, reference):
    # Layers (0, 2) skip the middle one (reading the target's cache is then an approximation), 31 kept
    # ids, drafts cut at top probability 0.2, adaptive rounds (a round costing 1 plain round: the
    # tiny model's draft-cost estimate would keep it plain).
    drafter = LayerSkipDrafter((0, 2), threshold=0.2)
    head = reduced_head(tiny_model, KEPT)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=drafter, draft_params=head)
    out, stats = gen.generate(PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=1, ignore_eos=True),
                              SpecConfig(k=K, verify_cost=1.0))
    assert [o.tokens for o in out] == reference
    assert 0 < stats.mean_draft_len < K, stats.line()  # the confidence cut shortened some drafts


@pytest.mark.slow  # test_draft_model's bigram test covers the default suite
def test_eos_inside_an_accepted_block():
    # The bigram model's layers add nothing, so its first layer alone drafts perfectly (see test_speculative).
    gen = SpeculativeGenerator(bigram_model(EOS), TOK, drafter=LayerSkipDrafter.early_exit(1))
    # adaptive=False: every round speculates (under the policy, a costly drafter's round 0 is a probe).
    out, stats = gen.generate(BIGRAM_PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=3),
                              SpecConfig(k=K, adaptive=False))
    assert out[0].finish_reason == "eos" and out[0].tokens == oracle(BIGRAM_PROMPTS[0], 2)
    for p, o in zip(BIGRAM_PROMPTS[1:], out[1:], strict=True):
        assert o.finish_reason == "length" and o.tokens == oracle(p, 16)
    assert stats.acceptance_by_position == (1.0,) * K and stats.rounds == 7


def test_bad_layers_are_refused(tiny_model):
    for layers in [(), (2, 1), (-1, 0), (1, 1)]:
        with pytest.raises(GenerationError, match="strictly increasing"):
            LayerSkipDrafter(layers)
    with pytest.raises(GenerationError, match="exceed the target's 3 layers"):
        LayerSkipDrafter((0, 5)).check(tiny_model)
    with pytest.raises(GenerationError, match="confidence threshold"):
        LayerSkipDrafter((0,), threshold=1.0)
    with pytest.raises(GenerationError, match=r"reduced draft vocabulary: draft vocabulary ids must lie in \[0, 64\)"):
        reduced_head(tiny_model, [3, 64])
    with pytest.raises(GenerationError, match="sorted ascending without duplicates"):
        reduced_head(tiny_model, [5, 3])


# ------------------------------------------------------------------------------------ sampled drafts
@struct.dataclass
class LoopView:
    """The fields of `DraftView` (the loop as `Drafter.propose` sees it) that a model drafter reads."""

    cache: KVCache
    hist_bl: jax.Array
    last_b: jax.Array
    pos_b: jax.Array
    key: jax.Array
    steps: jax.Array
    sampling: DraftSampling
    draft_state: Any = ()
    profile: BackendProfile = struct.field(pytree_node=False, default=CPU)


def prefilled_state(model, prompt, last, rows, temperature, top_p, seed=0):
    """The loop state a drafter sees after the prompt was prefilled and `last` committed after it."""
    ids = TOK.encode(prompt)
    t = len(ids)
    cache = model.init_cache(rows, t + 8)
    tokens_bt = jnp.broadcast_to(jnp.asarray(ids), (rows, t))
    positions_bt = jnp.broadcast_to(jnp.arange(t), (rows, t))
    _, cache = forward(model, tokens_bt, positions_bt, cache, jnp.zeros((rows,), jnp.int32))
    hist_bl = jnp.zeros((rows, t + 8), jnp.int32).at[:, :t].set(tokens_bt).at[:, t].set(last)
    return LoopView(
        cache=cache, hist_bl=hist_bl, last_b=jnp.full((rows,), last, jnp.int32), pos_b=jnp.full((rows,), t, jnp.int32),
        key=jax.random.key(seed), steps=jnp.int32(0), draft_state=(),
        sampling=DraftSampling.of(SamplingConfig(temperature=1.0, top_p=1.0 if top_p >= 1 else 0.5),
                                  jnp.float32(temperature), jnp.float32(top_p))), ids + [last]


def reference_q(ref_model, context_bt, kept, temperature, top_p):
    """The draft distribution from an uncached forward of the reference model, over the kept ids [B, N]."""
    logits_bn = full_logits(ref_model, jnp.asarray(context_bt))[:, -1][:, kept]
    return np.asarray(jax.nn.softmax(filter_logits(logits_bn, temperature, 0, top_p), axis=-1))


def chi2_999(dof: int) -> float:
    """0.999 quantile of the chi-square law (Wilson-Hilferty; within 2% of scipy's for dof >= 3)."""
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + 3.0902 * np.sqrt(h)) ** 3


def chi_square_1d(samples, probs, min_expected=5.0):
    """Pearson statistic of sample counts against probs, cells of small expectation lumped together; (stat, dof)."""
    counts = np.bincount(samples, minlength=len(probs)).astype(float)
    exp = probs * len(samples)
    assert counts[exp == 0].sum() == 0, "a token of zero draft probability was drafted"
    big = exp >= min_expected
    obs_cells = np.append(counts[big], counts[~big].sum())
    exp_cells = np.append(exp[big], exp[~big].sum())
    live = exp_cells > 0
    return float(((obs_cells[live] - exp_cells[live]) ** 2 / exp_cells[live]).sum()), int(live.sum()) - 1


def check_sampled_draft(drafter, draft_params, target, ref_model, kept, init=None):
    """Draft q is a distribution over the full vocabulary, zero outside `kept`, equal to the reference
    model's filtered distribution at both draft positions, and the drafted tokens follow it."""
    rows, temperature, top_p = 2000, 0.8, 0.9
    state, context = prefilled_state(target, "abcab", last=TOK.encode("c", add_bos=False)[0], rows=rows,
                                     temperature=temperature, top_p=top_p)
    if init is not None:
        state = state.replace(draft_state=init(state))
    draft, _ = jax.jit(lambda p, s: drafter.propose(target, p, s, 2))(draft_params, state)
    q_bkv, tok_bk = np.asarray(draft.q_probs_bkv), np.asarray(draft.tokens_bk)
    assert q_bkv.shape == (rows, 2, 64) and np.asarray(draft.len_b).tolist() == [2] * rows
    np.testing.assert_allclose(q_bkv.sum(-1), 1.0, atol=1e-5)
    outside = np.setdiff1d(np.arange(64), kept)
    assert (q_bkv[:, :, outside] == 0).all() and np.isin(tok_bk, kept).all()
    # Position 1: one context for all rows; the drafted tokens must follow its q.
    q1_ref = reference_q(ref_model, np.asarray([context]), kept, temperature, top_p)[0]
    np.testing.assert_allclose(q_bkv[0, 0, kept], q1_ref, atol=2e-5)
    stat, dof = chi_square_1d(np.searchsorted(kept, tok_bk[:, 0]), q1_ref)
    assert dof >= 3 and stat < chi2_999(dof), (stat, dof)
    # Position 2: each row's q given its own first draft.
    ctx_bt = np.concatenate([np.broadcast_to(context, (rows, len(context))), tok_bk[:, :1]], axis=1)
    pick = np.unique(tok_bk[:, 0], return_index=True)[1]
    np.testing.assert_allclose(q_bkv[pick, 1][:, kept], reference_q(ref_model, ctx_bt[pick], kept, temperature, top_p),
                               atol=2e-5)


@pytest.mark.slow  # the same `choose` path runs by default in test_draft_model
def test_sampled_draft_q_is_what_the_tokens_were_drawn_from(tiny_model):
    check_sampled_draft(LayerSkipDrafter.early_exit(2), reduced_head(tiny_model, KEPT), tiny_model,
                        slice_model(tiny_model, (0, 1)), KEPT)


def first_tokens_joint_test(gen, model, spec, n=2048):
    """Chi-square of the first 3 emitted tokens of n sampled runs (top-k 3, T=1) against the target's exact law.

    The first token comes from the prefill, the next two from speculative rounds (k = 2: drafted,
    verified, corrected or bonus). The exact law multiplies the target's filtered next-token
    distributions along each of the 27 paths.
    """
    prompt = "hello"
    cfg = GenerateConfig(max_new_tokens=3, batch_size=n, ignore_eos=True,
                         sampling=SamplingConfig(temperature=1.0, top_k=3, seed=7))
    out, stats = gen.generate([prompt] * n, cfg, spec)
    seqs = np.array([o.tokens for o in out])
    ids = TOK.encode(prompt)

    def law(ctx_bt):
        logits_v = full_logits(model, jnp.asarray(ctx_bt))[:, -1]
        return np.asarray(jax.nn.softmax(filter_logits(logits_v, 1.0, 3, 1.0), axis=-1))

    p1 = law(np.array([ids]))[0]
    joint, cells = {}, []
    for a in np.flatnonzero(p1):
        p2 = law(np.array([ids + [a]]))[0]
        for b in np.flatnonzero(p2):
            p3 = law(np.array([ids + [a, b]]))[0]
            for c in np.flatnonzero(p3):
                joint[(a, b, c)] = p1[a] * p2[b] * p3[c]
                cells.append((a, b, c))
    observed = {}
    for s in map(tuple, seqs):
        assert s in joint, f"{s} lies outside the top-3 support"
        observed[s] = observed.get(s, 0) + 1
    stat = sum((observed.get(c, 0) - n * joint[c]) ** 2 / (n * joint[c]) for c in cells)
    assert len(cells) == 27 and stat < CHI2_999[26], stat
    return stats


def test_sampling_is_lossless_end_to_end(tiny_model):
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=LayerSkipDrafter.early_exit(1))
    stats = first_tokens_joint_test(gen, tiny_model, SpecConfig(k=2, adaptive=False))
    assert 0.05 < stats.acceptance_by_position[0] < 0.95, stats.line()  # both outcomes were exercised


def test_factory_builds_layer_skip_with_a_reduced_vocabulary(tiny_model, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"prompt": "aaaa bbb", "reference": "cc"}\n{"id": 7, "text": "a"}\n')
    spec = SpecConfig(method="layerskip", layers=2, draft_vocab=4, draft_vocab_corpus=str(corpus), confidence=0.3)
    drafter, head = build_drafter(spec, tiny_model, ByteTokenizer())
    assert drafter == LayerSkipDrafter((0, 1), threshold=0.3)
    a, b, c, space = (TOK.encode(ch, add_bos=False)[0] for ch in "abc ")
    # a (5), b (3) and c (2) are the most frequent; EOS (id 1) is always kept and takes the last slot.
    assert head.ids_n.tolist() == sorted([1, a, b, c])
    np.testing.assert_array_equal(head.table_nd, np.asarray(tiny_model.embed[...])[sorted([1, a, b, c])])
    with pytest.raises(GenerationError, match="exceed the target's 3 layers"):
        build_drafter(SpecConfig(method="layerskip", layers=(0, 3)), tiny_model, ByteTokenizer())
    with pytest.raises(GenerationError, match="method 'bogus' is unknown"):
        SpecConfig(method="bogus")
