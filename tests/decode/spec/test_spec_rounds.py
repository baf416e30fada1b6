"""Adaptive drafting (`spec_rounds.py`): the batch bar, and costly drafters' probes.

A costly drafter (`Drafter.cheap` False) must not be proposed to in plain rounds, except in probes: a
probe is a plain round whose draft becomes a shadow (no verify forward), at gaps of plain rounds that
start at `probe_every` and double up to `max_probe_every`. Greedy output must still be plain greedy's,
and `observe` must still see every committed token.
"""

import dataclasses
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer, tiny_config
from flax import nnx
from test_speculative import PROMPTS, EchoDrafter, K

from specjax.decode import (
    GenerateConfig,
    GenerationError,
    Generator,
    LayerSkipDrafter,
    NgramDrafter,
    SamplingConfig,
    SpecConfig,
    SpeculativeGenerator,
    speculative_program,
)
from specjax.decode.spec.drafters.base import Draft, is_cheap
from specjax.decode.spec.policy import estimated_verify_cost, wants
from specjax.models import Transformer

MAX_LOG = 64  # loop steps the counting drafter records


class CountingDrafter(EchoDrafter):
    """A costly drafter whose drafts are never accepted (pad id 0, which the tiny model never
    generates). draft_state = (EchoDrafter's state, propose_n): propose_n[s] is 1 when propose ran at
    loop step s — so the test sees exactly which rounds drafted."""

    cheap = False

    def init(self, model, draft_params, prefill):
        return super().init(model, draft_params, prefill), jnp.zeros((MAX_LOG,), jnp.int32)

    def propose(self, model, draft_params, state, k):
        echo, log_n = state.draft_state
        b = state.last_b.shape[0]
        draft = Draft(tokens_bk=jnp.zeros((b, k), jnp.int32), len_b=jnp.full((b,), k, jnp.int32))
        return draft, (echo, log_n.at[state.steps].add(1))

    def observe(self, model, draft_params, draft_state, obs):
        echo, log_n = draft_state
        return super().observe(model, draft_params, echo, obs), log_n


class EmptyCountingDrafter(CountingDrafter):
    """Proposes nothing (len_b = 0), e.g. a confidence cut: must still back off to plain rounds."""

    def propose(self, model, draft_params, state, k):
        draft, draft_state = super().propose(model, draft_params, state, k)
        return draft.replace(len_b=jnp.zeros_like(draft.len_b)), draft_state


def test_cheapness_is_declared_per_drafter():
    assert is_cheap(NgramDrafter()) and not is_cheap(LayerSkipDrafter.early_exit(2))
    assert not is_cheap(object())  # undeclared: treated as costly


def test_probe_every_must_be_a_positive_integer():
    with pytest.raises(GenerationError, match="probe_every must be a positive integer, got 0"):
        SpecConfig(probe_every=0)
    assert SpecConfig(probe_every=5).policy().probe_every == 5
    with pytest.raises(GenerationError, match=r"max_probe_every must be an integer >= probe_every \(32\), got 16"):
        SpecConfig(probe_every=32, max_probe_every=16)
    with pytest.raises(GenerationError, match=r"min_best_gain must be a number >= 0 \(0: never switch .*\), got -1"):
        SpecConfig(min_best_gain=-1)
    assert SpecConfig(min_best_gain=0).policy().min_best_gain == 0.0


def probe_rounds(n: int, every: int, max_every: int) -> list[int]:
    """The documented probe schedule (oracle): a probe in round 0, then after gaps of every, 2 every,
    4 every, … (at most max_every) plain rounds, while no probe finds drafts worth speculating."""
    streak, gap, out = every, every, []
    for r in range(n):
        if streak >= gap:
            out.append(r)
            streak, gap = 0, min(2 * gap, max_every)
        else:
            streak += 1
    return out


def test_probe_schedule_oracle():
    assert probe_rounds(15, 1, 256) == [0, 3, 8]  # gaps 2, 4, 8 plain rounds
    assert probe_rounds(15, 1, 2) == [0, 3, 6, 9, 12]  # capped at 2
    assert probe_rounds(15, 3, 256) == [0, 7]


@pytest.mark.parametrize(("drafter", "probe_every", "max_every"), [(CountingDrafter(), 1, 256),
                                                                   (CountingDrafter(), 1, 2),
                                                                   (CountingDrafter(), 3, 256),
                                                                   (EmptyCountingDrafter(), 3, 256)])
def test_costly_drafter_proposes_only_in_probes_that_back_off(tiny_model, drafter, probe_every, max_every):
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, cfg)
    assert all(0 not in r.tokens for r in ref), "the tiny model generates the pad id: pick another bad draft"
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=drafter)
    # A round costing 2 plain rounds: the undeclared drafter's estimate would switch speculation off.
    spec = SpecConfig(k=K, probe_every=probe_every, max_probe_every=max_every, verify_cost=2.0)
    out, stats = gen.generate(PROMPTS, cfg, spec)
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert stats.acceptance_by_position == (0.0,) * K, stats.line()
    # Re-run the compiled program to read the final state: which steps proposed, what was observed.
    _, args, static = gen._batch_inputs([gen.encode([p], False)[0] for p in PROMPTS], cfg, None, 0, extra_slots=K)
    state = speculative_program(gen.graphdef, *args, (), **static, k=K, drafter=drafter,
                                adapt=spec.policy())
    (hist_bl, len_b, bad), log_n = state.draft
    steps = int(state.row.steps)
    assert steps == 15  # one token per round: the prefill's, then 15 rounds
    # Round 0 probes, the shadow fails at once, and the gaps double: nothing is drafted in between.
    probes = probe_rounds(steps, probe_every, max_every)
    assert np.flatnonzero(np.asarray(log_n[:steps])).tolist() == probes and len(probes) < steps
    # A probe is a plain round (no verify forward): every round was plain.
    assert stats.plain_rate == 1.0 and stats.draft_rate == 0.0, stats.line()
    # observe saw every committed token of every row, plain rounds included, at chained positions.
    assert int(bad) == 0
    np.testing.assert_array_equal(np.asarray(len_b), np.asarray(state.row.pos_b) + 1)
    for b in range(len(PROMPTS)):
        n = int(len_b[b])
        np.testing.assert_array_equal(np.asarray(hist_bl[b, :n]), np.asarray(state.row.hist_bl[b, :n]))


class CheapCountingDrafter(CountingDrafter):
    """The counting drafter as a cheap one (no forward): proposals back off to every cheap_max_gap rounds."""

    cheap = True


@pytest.mark.parametrize(("max_gap", "proposals"), [(8, [0, 2, 6, 14]), (2, [0, 2, 4, 6, 8, 10, 12, 14])])
def test_cheap_drafter_proposals_back_off_while_its_shadows_miss(tiny_model, max_gap, proposals):
    """Sampling (no blind first try): round 0 proposes, its shadow misses, and the next proposals come
    after 2, 4, 8 (at most max_gap) rounds; plain rounds in between propose nothing."""
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True,
                         sampling=SamplingConfig(temperature=1.0, seed=3))
    drafter = CheapCountingDrafter()
    adapt = dataclasses.replace(SpecConfig(k=K, verify_cost=2.0).policy(), cheap_max_gap=max_gap)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=drafter)
    _, args, static = gen._batch_inputs([gen.encode([p], False)[0] for p in PROMPTS], cfg, None, 0, extra_slots=K)
    state = speculative_program(gen.graphdef, *args, (), **static, k=K, drafter=drafter, adapt=adapt)
    _, log_n = state.draft  # (EchoDrafter's argmax check does not hold when sampling)
    steps = int(state.row.steps)
    assert steps == 15
    assert np.flatnonzero(np.asarray(log_n[:steps])).tolist() == proposals
    assert int(jnp.sum(state.counters.plain_rounds_b)) == int(jnp.sum(state.counters.rounds_b)) == 15 * 4


def _eos_model(reference) -> tuple[Transformer, int]:
    """The tiny model (same weights) with EOS = a token row 1 emits early: rows finish apart."""
    eos = reference[1][2]
    return Transformer(tiny_config(eos_ids=(eos,)), rngs=nnx.Rngs(0)), eos


@pytest.mark.parametrize("batch_size", [1, 3])
def test_layer_skip_adaptive_greedy_equals_plain_greedy(tiny_model, batch_size):
    prompts = PROMPTS[1:]  # rows whose 2-layer drafts hit: the batch speculates only when its worst row pays
    ref_cfg = GenerateConfig(max_new_tokens=16, batch_size=3, ignore_eos=True)
    reference = [r.tokens for r in Generator(tiny_model, ByteTokenizer()).generate(prompts, ref_cfg)[0]]
    model, eos = _eos_model(reference)
    cfg = GenerateConfig(max_new_tokens=16, batch_size=batch_size)
    ref, _ = Generator(model, ByteTokenizer()).generate(prompts, cfg)
    assert {r.finish_reason for r in ref} == {"eos", "length"}, "EOS did not make the batch ragged"
    gen = SpeculativeGenerator(model, ByteTokenizer(), drafter=LayerSkipDrafter.early_exit(2))
    # A low bar (a round costs 1 plain round), so that speculative, plain and probe rounds all occur.
    out, stats = gen.generate(prompts, cfg, SpecConfig(k=K, min_expected_accept=0.5, verify_cost=1.0, probe_every=2))
    assert [(o.tokens, o.finish_reason) for o in out] == [(r.tokens, r.finish_reason) for r in ref]
    assert 0 < stats.plain_rate < 1 and stats.draft_rate > 0, stats.line()
    assert eos not in [t for o in out for t in o.tokens]


class OracleDrafter(NgramDrafter):
    """A cheap drafter that knows plain greedy's output: rows < `good` draft it exactly, the others
    draft the pad id (never generated, so never accepted)."""

    def __init__(self, reference: tuple[tuple[int, ...], ...], good: int):
        super().__init__()
        object.__setattr__(self, "reference", reference)
        object.__setattr__(self, "good", good)

    def __hash__(self):
        return hash((self.reference, self.good))

    def __eq__(self, other):
        return isinstance(other, OracleDrafter) and (self.reference, self.good) == (other.reference, other.good)

    def propose(self, model, draft_params, state, k):
        ref_bn = jnp.asarray([list(r) + [0] * k for r in self.reference], jnp.int32)
        idx_bk = jnp.minimum(state.count_b[:, None] + jnp.arange(k)[None, :], ref_bn.shape[1] - 1)
        good_b1 = (jnp.arange(ref_bn.shape[0]) < self.good)[:, None]
        tokens_bk = jnp.where(good_b1, jnp.take_along_axis(ref_bn, idx_bk, axis=1), 0)
        return Draft(tokens_bk=tokens_bk, len_b=jnp.full((ref_bn.shape[0],), k, jnp.int32)), state.draft_state


def test_adaptive_bar_weighs_the_whole_batch():
    policy = SpecConfig(k=8).policy()
    assert policy.bar(1, 8, True) == pytest.approx(1.8 + 8 * 0.18 - 1)  # batch 1 on CPU: above the floor
    assert policy.bar(1, 4, True) == 2.0  # k=4: the estimate 1.8 + 4 * 0.18 - 1 = 1.52 is below the floor
    assert policy.bar(8, 8, False) == pytest.approx(estimated_verify_cost(8, 8, False) - 1)
    assert policy.bar(8, 8, False) > 2.0  # on CPU: 72 sampled block rows cost ~8 plain rounds
    assert SpecConfig(k=8, verify_cost=4.5).policy().bar(8, 8, False) == 3.5
    assert SpecConfig(k=2, verify_cost=1.0).policy().bar(4, 2, True) == 1.5  # floor capped at 0.75 k
    with pytest.raises(GenerationError, match="verify_cost must be >= 1"):
        SpecConfig(verify_cost=0.9)


@pytest.mark.parametrize(("good", "speculates"), [(1, False), (3, False), (4, True)])
def test_a_row_without_good_drafts_keeps_the_batch_plain(tiny_model, good, speculates):
    """Batch 4, k=4, greedy, verify cost 2 plain rounds (bar = the floor, 2 accepted tokens per row),
    equal budgets: the loop lasts as long as its slowest row, so one row whose drafts all fail keeps
    the batch plain however good the others are (speculating would finish it later, by the rounds'
    cost); with every row good every round speculates."""
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, cfg)
    assert all(0 not in r.tokens for r in ref)
    drafter = OracleDrafter(tuple(tuple(r.tokens) for r in ref), good)
    out, stats = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=drafter).generate(
        PROMPTS, cfg, SpecConfig(k=K, verify_cost=2.0))
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    spec_row_rounds = round(stats.rounds * (1 - stats.plain_rate))  # speculative rounds x their live rows
    if speculates:  # 1 prefill token, 4 plain rounds while the first shadow matches, then rounds of 5 tokens
        assert spec_row_rounds == 3 * 4 and stats.plain_rate == pytest.approx(4 / 7), stats.line()
    else:  # no blind first try in a batch (the averages start under the bar): every round is plain
        assert spec_row_rounds == 0, stats.line()


def _wants(ema_b, left_b, done_b=None, bar=2.0, max_new=16):
    """`policy.wants` on a hand-made carry: rows with moving averages ema_b and left_b tokens to go."""
    b = len(ema_b)
    done_b = jnp.zeros((b,), bool) if done_b is None else jnp.asarray(done_b)
    row = SimpleNamespace(done_b=done_b, count_b=max_new - jnp.asarray(left_b, jnp.int32))
    s = SimpleNamespace(row=row, policy=SimpleNamespace(accept_ema_b=jnp.asarray(ema_b, jnp.float32)))
    return bool(wants(SimpleNamespace(bar=lambda _: bar, max_new=max_new), s))


def test_the_bar_binds_on_the_row_that_finishes_last():
    assert _wants([2.0], [16]) and not _wants([1.9], [16])  # batch 1: e >= bar
    assert not _wants([8.0, 8.0, 8.0, 0.0], [16] * 4)  # equal budgets: the worst row decides
    assert _wants([2.5, 3.0, 2.0, 7.0], [16] * 4)
    # A poor row with 2 tokens to go finishes before the good rows: 16 / 5 rounds of 3 plain ones < 16.
    assert _wants([4.0, 4.0, 4.0, 0.0], [16, 16, 16, 2])
    assert not _wants([4.0, 4.0, 4.0, 0.0], [16, 16, 16, 6])  # 6 speculative rounds cost 18 > 16
    assert _wants([4.0, 4.0, 4.0, 0.0], [16] * 4, done_b=[False, False, False, True])  # done rows do not count


class CostlyOracleDrafter(OracleDrafter):
    """The oracle as a costly drafter: it drafts only in probes and speculative rounds."""

    cheap = False


def test_a_probe_that_finds_good_drafts_starts_speculation(tiny_model):
    """Round 0 probes; its shadow matches all k tokens over rounds 0-3 (plain, no verify forward),
    which replaces the average with k >= bar: from round 4 every round speculates, 5 tokens each."""
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, cfg)
    drafter = CostlyOracleDrafter(tuple(tuple(r.tokens) for r in ref), 4)
    out, stats = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=drafter).generate(
        PROMPTS, cfg, SpecConfig(k=K, verify_cost=2.0))
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    # 1 prefill token + 4 plain rounds + speculative rounds of 5, 5 and the last 1 of 16.
    assert stats.rounds == 7 * 4 and stats.plain_rate == pytest.approx(4 / 7), stats.line()
    # The last round's draft runs past the reference (pad ids): only its first token is accepted.
    assert stats.acceptance_by_position == pytest.approx((1.0,) + (2 / 3,) * (K - 1))


def test_speculation_off_when_even_perfect_drafts_cannot_pay(tiny_model):
    """A round costing 10 plain rounds for at most k + 1 = 5 tokens: the loop never drafts (no probes
    either), decodes exactly like plain, and the stats say why."""
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, cfg)
    drafter = CountingDrafter()
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=drafter)
    spec = SpecConfig(k=K, verify_cost=10.0)
    assert spec.policy().off(4, K, True, 0.0, K)
    assert not SpecConfig(k=K, verify_cost=3.3).policy().off(4, K, True, 0.0, K)  # 5 tokens >= 1.5 x 3.3
    assert SpecConfig(k=K, verify_cost=3.9).policy().off(4, K, True, 0.0, K)
    assert not SpecConfig(k=K, verify_cost=3.9, min_best_gain=1.25).policy().off(4, K, True, 0.0, K)
    out, stats = gen.generate(PROMPTS, cfg, spec)  # runs plain decoding's program
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert stats.plain_rate == 1.0 and "speculation off at batch 4: a round would cost ~10.0 plain steps for at " \
        "most 5 tokens" in stats.line(), stats.line()
    assert stats.rounds == 15 * 4 and stats.tau == 1.0
    # The speculative program itself (called directly) also runs plain rounds only.
    _, args, static = gen._batch_inputs([gen.encode([p], False)[0] for p in PROMPTS], cfg, None, 0, extra_slots=K)
    state = speculative_program(gen.graphdef, *args, (), **static, k=K, drafter=drafter, adapt=spec.policy())
    assert int(np.sum(state.draft[1])) == 0  # propose never ran
    np.testing.assert_array_equal(np.asarray(state.row.out_bn[:, :16]), np.asarray([r.tokens for r in ref]))


@pytest.mark.parametrize(("drafter", "adaptive", "forwards"), [(NgramDrafter(), True, 3), (CountingDrafter(), True, 3),
                                                              (NgramDrafter(), False, 2)])
def test_each_kind_of_round_is_compiled_once(tiny_model, monkeypatch, drafter, adaptive, forwards):
    """The program traces the target's forward once per kind: the prefill, the plain round (following a
    shadow or not, probing or not) and the speculative round. Each extra copy is compiled again: with two
    more copies of the plain round, Gemma 3 270M's n-gram program took ~1.7x as long to compile
    (docs/benchmarks.md, "Compile time")."""
    traced = []
    forward = Transformer.forward

    def counting(self, tokens_bt, *args, **kwargs):
        traced.append(tokens_bt.shape[1])
        return forward(self, tokens_bt, *args, **kwargs)

    monkeypatch.setattr(Transformer, "forward", counting)
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=drafter)
    _, args, static = gen._batch_inputs([gen.encode([p], False)[0] for p in PROMPTS], cfg, None, 0, extra_slots=K)
    adapt = SpecConfig(k=K, verify_cost=2.0).policy() if adaptive else None
    speculative_program.lower(gen.graphdef, *args, (), **static, k=K, drafter=drafter, adapt=adapt)
    assert sorted(traced) == sorted([16, K + 1] + [1] * (forwards - 2)), traced  # prompt bucket 16
