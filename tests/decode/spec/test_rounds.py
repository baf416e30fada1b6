"""The round functions alone (`spec/rounds.py`): one plain or speculative round from a prefilled state,
checked against the tiny model's greedy continuation; `commit` and `advance_shadow` on hand-made arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import full_logits

from specjax.decode import loop
from specjax.decode.backend import ACCELERATOR, CPU
from specjax.decode.sampling import SamplingConfig
from specjax.decode.spec.drafters.base import Draft
from specjax.decode.spec.drafters.ngram import NgramDrafter
from specjax.decode.spec.policy import SHADOW_PRIOR, Adaptive
from specjax.decode.spec.program import initial_state
from specjax.decode.spec.rounds import RoundContext, advance_shadow, commit, plain_round, spec_round
from specjax.decode.spec.state import Shadow

K = 3
PROMPT = [5, 9, 14, 9, 5, 22, 31]
N_OUT = 16


def greedy_continuation(model, prompt, n):
    """n greedy tokens after `prompt`, from uncached forwards."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(jnp.argmax(full_logits(model, jnp.asarray([ids]))[0, -1])))
    return ids[len(prompt):]


def context(model, profile=CPU, eos_ids=(), max_new=N_OUT, adapt=None, sampling=None):
    return RoundContext.create(model, (), K, NgramDrafter(), sampling or SamplingConfig(), jnp.float32(1.0),
                               jnp.float32(1.0), jnp.int32(max_new), eos_ids, None, adapt, None, profile)


def prefilled(ctx, prompt, first, rows=2):
    """The loop state after the prefill of `prompt` (`rows` identical rows) with `first` as the first token."""
    b, t = rows, len(prompt)
    prompt_bt = jnp.asarray([prompt] * b, jnp.int32)
    cache = ctx.model.init_cache(b, t + N_OUT + K)
    _, _, cache, _ = loop.prefill(ctx.model, cache, prompt_bt, jnp.full((b,), t, jnp.int32))
    return initial_state(ctx, cache, prompt_bt, jnp.full((b,), t, jnp.int32), jnp.ones((b,), bool),
                         jax.random.key(0), jnp.full((b,), first, jnp.int32), N_OUT, ())


def emitted(s):
    return [np.asarray(s.row.out_bn[b, :int(s.row.count_b[b])]).tolist() for b in range(s.row.out_bn.shape[0])]


@pytest.mark.parametrize("profile", [CPU, ACCELERATOR], ids=["cpu", "accelerator"])
def test_a_plain_round_emits_the_next_greedy_token(tiny_model, profile):
    want = greedy_continuation(tiny_model, PROMPT, 2)
    ctx = context(tiny_model, profile)
    s = prefilled(ctx, PROMPT, want[0])
    s = jax.jit(lambda s: plain_round(ctx, s))(s)
    assert emitted(s) == [want, want]
    assert np.asarray(s.counters.rounds_b).tolist() == [1, 1]
    assert np.asarray(s.counters.plain_rounds_b).tolist() == [1, 1]
    assert int(s.policy.plain_streak) == 1 and int(s.row.steps) == 1
    assert np.asarray(s.row.pos_b).tolist() == [len(PROMPT) + 1] * 2


def test_a_speculative_round_accepts_the_greedy_continuation_and_stops_at_a_wrong_token(tiny_model):
    want = greedy_continuation(tiny_model, PROMPT, K + 2)
    ctx = context(tiny_model)
    s = prefilled(ctx, PROMPT, want[0])
    wrong = (want[2] + 1) % 64
    draft = Draft(tokens_bk=jnp.asarray([want[1:K + 1], [want[1], wrong, want[3]]], jnp.int32),
                  len_b=jnp.full((2,), K, jnp.int32))
    s = jax.jit(lambda s, d: spec_round(ctx, s, d))(s, draft)
    # Row 0: all K drafts accepted, plus the bonus token; row 1: d_1 accepted, then the target's own token.
    assert emitted(s) == [want[:K + 2], want[:3]]
    assert np.asarray(s.counters.accepted_bk).tolist() == [[1, 1, 1], [1, 0, 0]]
    assert np.asarray(s.counters.drafted_bk).tolist() == [[1, 1, 1], [1, 1, 1]]
    assert np.asarray(s.counters.plain_rounds_b).tolist() == [0, 0]
    assert np.asarray(s.row.last_b).tolist() == [want[K + 1], want[2]]


def test_commit_stops_a_row_at_eos_inside_the_block(tiny_model):
    ctx = context(tiny_model, eos_ids=(7,))
    s = prefilled(ctx, PROMPT, 3)
    tokens_bt = jnp.asarray([[4, 7, 8], [4, 5, 6]], jnp.int32)
    row = commit(ctx, s.row, tokens_bt, jnp.asarray([3, 2], jnp.int32))
    assert emitted(s.replace(row=row)) == [[3, 4, 7], [3, 4, 5]]
    assert np.asarray(row.done_b).tolist() == [True, False]
    assert np.asarray(row.reason_b).tolist() == [loop.REASON_EOS, loop.REASON_LENGTH]
    # History and position follow what was emitted: row 1's last token 5 sits at pos_b.
    assert np.asarray(row.last_b).tolist() == [7, 5]
    assert int(row.hist_bl[1, int(row.pos_b[1])]) == 5


def test_advance_shadow_counts_hits_down_a_chain_and_ends_at_a_mismatch():
    b, k = 2, 3
    draft = Draft(tokens_bk=jnp.asarray([[10, 11, 12], [20, 21, 22]], jnp.int32), len_b=jnp.asarray([3, 3], jnp.int32))
    shadow, live_b = Shadow.empty(b, k), jnp.ones((b,), bool)
    shadow, end_b = advance_shadow(shadow, draft, jnp.asarray([10, 20], jnp.int32), live_b)
    assert np.asarray(shadow.hit_b).tolist() == [1, 1] and not bool(jnp.any(end_b))
    # Row 0 keeps matching; row 1 misses: its shadow ends with 1 hit.
    shadow, end_b = advance_shadow(shadow, draft, jnp.asarray([11, 99], jnp.int32), live_b)
    assert np.asarray(shadow.hit_b).tolist() == [2, 1] and np.asarray(end_b).tolist() == [False, True]
    assert np.asarray(shadow.len_b).tolist() == [3, 0]
    # Row 0 reaches the leaf (3 hits, ended); row 1 adopts the round's draft afresh.
    shadow, end_b = advance_shadow(shadow, draft, jnp.asarray([12, 20], jnp.int32), live_b)
    assert np.asarray(shadow.hit_b).tolist() == [3, 1] and np.asarray(end_b).tolist() == [True, False]


def test_the_policy_state_starts_a_cheap_drafter_at_the_bar_only_when_greedy_at_batch_1(tiny_model):
    adapt = Adaptive()
    ctx = context(tiny_model, adapt=adapt)
    s = prefilled(ctx, PROMPT, 3, rows=1)
    assert np.allclose(np.asarray(s.policy.accept_ema_b), adapt.bar(1, K, True))
    assert int(s.policy.probe_gap) == int(s.policy.plain_streak) == 1  # the first round proposes
    assert emitted(s) == [[3]]
    # In a batch a blind try pays only if every row's draft does: the averages start just under the bar.
    batch = prefilled(ctx, PROMPT, 3)
    assert np.allclose(np.asarray(batch.policy.accept_ema_b), SHADOW_PRIOR * adapt.bar(2, K, True))
    assert int(batch.policy.probe_gap) == 1
    sampled = context(tiny_model, adapt=adapt, sampling=SamplingConfig(temperature=1.0))
    assert np.allclose(np.asarray(prefilled(sampled, PROMPT, 3).policy.accept_ema_b), 0.0)
