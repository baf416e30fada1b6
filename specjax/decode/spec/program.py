"""The speculative program: draft k tokens, check them with one target forward, all on device.

The program mirrors `loop.generate_program`: prefill the prompts and sample the first
token, then a `lax.while_loop` whose every iteration (a "round") is, for all rows at once:

  1. the drafter proposes k tokens from the row's token history (`drafters/`): a chain,
     or a token tree of k nodes (`Draft.parent_bk`, `trees.py`);
  2. ONE target forward over the block [last, d_1 … d_k] at positions pos … pos+k (a tree:
     pos + node depth, under its ancestor mask), writing its keys/values at cache slots
     pos … pos+k;
  3. chain or tree verification (`verify.py`, in `rounds.py`) → accepted_b in 0..k and accepted_b + 1 tokens
     (a tree then moves its accepted path's keys/values to slots pos+1 … pos+accepted);
  4. the tokens are emitted one by one through `loop.emit` (EOS, stop strings and the
     length limit end a row mid-block; the rest of the block is discarded) and the row's
     position advances by the number emitted.

Rollback after a rejection costs nothing: slots of rejected drafts hold stale keys/values
at positions the row has not committed, which the attention masks never show, and the
next round overwrites them. Rows accept different amounts (ragged), each with its own pos_b.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.decode import constrain, loop
from specjax.decode.backend import BackendProfile, decode_program
from specjax.decode.inputs import BatchInputs
from specjax.decode.sampling import SamplingConfig, sample
from specjax.decode.spec.drafters.base import Drafter, Prefill
from specjax.decode.spec.policy import SHADOW_PRIOR, Adaptive, run
from specjax.decode.spec.rounds import RoundContext, commit, feature_layers
from specjax.decode.spec.state import Counters, PolicyState, Shadow, SpecRow, SpecState
from specjax.models.kv_cache import KVCache

__all__ = ["initial_state", "speculative_program"]


@decode_program("graphdef", "sampling", "n_out", "eos_ids", "k", "drafter", "adapt")
def speculative_program(
    graphdef,
    params,
    cache: KVCache,
    inputs: BatchInputs,
    draft_params=(),
    *,
    sampling: SamplingConfig,
    n_out: int,
    eos_ids: tuple[int, ...],
    k: int,
    drafter: Drafter,
    adapt: Adaptive | None = None,
    profile: BackendProfile,
) -> SpecState:
    """Prefills right-padded prompts, then runs speculative rounds until every row is done.

    Arguments are those of `loop.generate_program` (the rows' grammars `inputs.grammar` included: chain
    drafts are cut at their first refused token and every block position is masked, see
    `rounds.py`), plus the drafter's weights `draft_params` (any pytree, () for none),
    the static draft length k (>= 1) and drafter, and the static adaptive policy (None: every
    round speculates; see `policy.py`). The cache needs at least T + n_out + k slots: a row's
    last round may write drafted positions up to k past its final token (written, never committed).

    Returns:
      SpecState after the loop (its cache is the donated buffer, updated in place).
    """
    model = nnx.merge(graphdef, params)
    prompt_bt, len_b, active_b, grammar = inputs.prompt_bt, inputs.len_b, inputs.active_b, inputs.grammar
    hidden_btd, last_hidden_b1d, cache, taps_btx = loop.prefill(model, cache, prompt_bt, len_b, profile.prefill_chunk,
                                                                feature_layers(drafter))
    key, sub = jax.random.split(inputs.key)
    # The first token comes from the prefill, exactly as in the plain loop.
    first_logits_bv = model.logits(last_hidden_b1d)[:, 0]
    if grammar is not None:
        first_logits_bv = constrain.mask(grammar, grammar.state_b, first_logits_bv)
    first_b = sample(first_logits_bv, sub, sampling, inputs.temperature, inputs.top_p)
    first_late_b = None
    if grammar is not None:
        first_b, first_late_b = constrain.close(grammar, grammar.state_b, first_b, inputs.max_new - 1, eos_ids)
    if loop.CLOCK.enabled():
        jax.debug.callback(loop.CLOCK.mark, jnp.max(first_b))  # a scalar: see loop.py

    ctx = RoundContext.create(model, draft_params, k, drafter, sampling, inputs.temperature, inputs.top_p,
                              inputs.max_new, eos_ids, inputs.stop_tables, adapt, grammar, profile)
    prefilled = Prefill(tokens_bt=prompt_bt, len_b=len_b, hidden_btd=hidden_btd, first_b=first_b,
                        num_slots=cache.num_slots, taps_btx=taps_btx)
    state = initial_state(ctx, cache, prompt_bt, len_b, active_b, key, first_b, n_out,
                          drafter.init(model, draft_params, prefilled), None if grammar is None else grammar.state_b,
                          first_late_b)
    return run(ctx, state)


def initial_state(ctx: RoundContext, cache, prompt_bt, len_b, active_b, key, first_b, n_out: int, draft_state,
                  gram_b=None, first_late_b=None) -> SpecState:
    """The loop's carry after the prefill: the first token `first_b` committed, counters at zero
    (`first_late_b`: rows whose first token the budget closed, `constrain.close`, or None).

    The first round is a probe (the streak starts at the gap: 1 for a cheap drafter, `probe_every` for
    a costly one). A costly drafter's average starts at 0, and so does a cheap drafter's when sampling,
    where a wrong first try costs a sampled verify forward (~3 plain steps on XLA:CPU). Greedy, a cheap
    drafter's starts at the bar at batch 1 — its first draft is verified blind, which pays at once on
    text that repeats its prompt — and just under it in a batch, where a blind round pays only if every
    row's draft does (`policy.wants`: the slowest row decides): no blind round, but the first shadow
    draft that matches about `bar` tokens lifts its row over the bar (`SHADOW_PRIOR`).
    """
    b, t = prompt_bt.shape
    n_stop = 0 if ctx.stop_tables is None else ctx.stop_tables.count
    adapt = ctx.adapt
    probe_every = 0 if adapt is None else 1 if ctx.cheap else adapt.probe_every
    optimistic = adapt is not None and ctx.cheap and ctx.sampling.greedy
    first_ema = (1.0 if b == 1 else SHADOW_PRIOR) * ctx.bar(b) if optimistic else 0.0
    row = SpecRow(
        cache=cache,
        hist_bl=jnp.zeros((b, t + n_out), jnp.int32).at[:, :t].set(prompt_bt),
        last_b=first_b,
        out_bn=jnp.zeros((b, n_out), jnp.int32),
        pos_b=len_b.astype(jnp.int32) - 1,  # commit advances it to the first token's position
        count_b=jnp.zeros((b,), jnp.int32),
        done_b=~active_b,
        reason_b=jnp.full((b,), loop.REASON_LENGTH, jnp.int32),
        stop_bn=jnp.zeros((b, n_stop), jnp.int32),
        key=key,
        steps=jnp.zeros((), jnp.int32),
        gram_b=gram_b,
    )
    policy = PolicyState(accept_ema_b=jnp.full((b,), first_ema, jnp.float32),
                         plain_streak=jnp.full((), probe_every, jnp.int32),
                         probe_gap=jnp.full((), probe_every, jnp.int32), shadow=Shadow.empty(b, ctx.k))
    if first_late_b is not None:
        row = loop.mark_closed(row, first_late_b)
    row = commit(ctx, row, first_b[:, None], jnp.ones((b,), jnp.int32))
    return SpecState(row=row, policy=policy, counters=Counters.zeros(b, ctx.k), draft=draft_state)
