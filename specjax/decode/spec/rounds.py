"""The rounds of the speculative loop (`speculative.py`): its carry, commit, and the two kinds of round.

A *speculative round* runs ONE target forward over [last, d_1 … d_k] for the whole batch and
verifies the drafts. A *plain round* runs the one-token forward of `loop.generate_program`
instead and samples one token, exactly as plain decoding would. With an `Adaptive` policy the
loop runs plain rounds while the batch's drafts are not expected to pay, then speculative rounds while
they are (`make_loop`): on XLA:CPU a speculative round costs ~1.8–8 plain rounds depending on batch, k
and sampling (`Adaptive`, docs/performance.md), so speculating only pays when the drafts are good.

Draft quality is tracked per row as an exponential moving average of the tokens a draft gets
accepted (`accept_ema_b`). Speculative rounds update it from verification. How plain rounds keep it
fresh depends on what a draft costs (`drafters.Drafter.cheap`):

* A cheap drafter (n-gram lookup) proposes every round, and the policy counts only rows with a draft.
  Plain rounds update the average for free from a *shadow draft*: the draft a row had when it last
  stopped speculating is compared, token by token, with what the plain rounds then commit — which
  is exactly what verification would have accepted (greedy), or has the same expectation
  (sampling with a deterministic draft: both accept token x with probability p(x)). So a row whose
  text turns repetitive again is noticed without paying for probe rounds.
* A costly drafter (a network) proposes in speculative rounds only, so a plain round costs what plain
  decoding does. After a gap of plain rounds one *probe* round drafts, and the draft becomes a shadow
  draft for the next plain rounds (no verify forward: a probe costs the draft alone). Its hit count
  replaces the row's average, which is stale after the gap. The gap starts at `probe_every` and doubles
  after each probe that leaves the batch below the bar (up to `max_probe_every`), so on text the
  drafter cannot predict the probes' cost fades: ~log2(n / probe_every) probes in n tokens.

Either way the drafter observes every committed token (`observe` after both kinds of round).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decode import constrain, loop
from specjax.decode.errors import GenerationError
from specjax.decode.sampling import SamplingConfig
from specjax.decode.spec import trees as tree_lib
from specjax.decode.spec.cost import draft_cost, max_accept
from specjax.decode.spec.drafters.base import Draft, Observation, is_cheap
from specjax.decode.spec.verify import greedy_verify, sampling_verify, tree_greedy_verify, tree_sampling_verify
from specjax.models.kv_cache import move_slots
from specjax.models.quant import MAX_CHUNKED_ROWS


@dataclasses.dataclass(frozen=True)
class Adaptive:
    """When to speculate (static: part of the compiled program).

    The batch speculates when the drafts' expected extra tokens, summed over its live rows, pay for the
    round: a speculative round runs every row's k+1 positions, so it costs `verify_cost` plain rounds
    for the whole batch however few rows have good drafts. With e_b a row's moving average of accepted
    draft tokens (0 for a cheap drafter's row without a draft), the rule is

        mean over live rows of e_b  >=  bar = max(threshold(k), verify_cost(b, k, greedy) - 1)

    At batch 1 the floor `threshold(k)` decides (it leaves a margin over break-even: the average
    overshoots after lucky streaks). At batch 8 one repetitive row no longer drags seven others
    through a verify forward that costs 2–8 of their plain steps.

    Attributes:
      min_expected_accept: the floor of the bar, capped at 0.75 k so that a short draft length can
        still qualify. Break-even on XLA:CPU at batch 1 is ~0.8 (k=4) to ~1.3 (k=8) for free drafts.
      ema_weight: weight of the newest observation in the moving average.
      probe_every: costly drafters only (cheap ones learn from shadow drafts): plain rounds before the
        first probe (a draft run as a shadow, see the module doc), and the initial gap between probes.
      max_probe_every: the gap doubles after every probe that does not lead to speculation, up to
        this; a speculative round that the bar chose resets it to probe_every.
      verify_cost: what a speculative round costs in plain rounds, drafting included, or None for the
        built-in estimate: `estimated_verify_cost` (measured on XLA:CPU; on accelerators it is small
        and the floor rules) plus the drafter's `draft_cost.draft_cost`.
      min_best_gain: speculation is switched off (no probes, no speculative rounds: plain decoding)
        when even a round whose draft is accepted in full would beat plain rounds by less than this
        factor (`off`), e.g. a 4-token layer-skip draft through the full 262,144-row head on XLA:CPU.
    """

    min_expected_accept: float = 2.0
    ema_weight: float = 0.3
    probe_every: int = 16
    max_probe_every: int = 256
    verify_cost: float | None = None
    min_best_gain: float = 1.5

    def threshold(self, k: int) -> float:
        """The floor of the bar: min_expected_accept capped at 3/4 of k."""
        return min(self.min_expected_accept, 0.75 * k)

    def round_cost(self, b: int, k: int, greedy: bool, draft_cost: float = 0.0) -> float:
        """A speculative round's cost in plain rounds; `draft_cost` is what the drafter's k-token draft
        costs in plain rounds (0 for cheap drafters)."""
        return estimated_verify_cost(b, k, greedy) + draft_cost if self.verify_cost is None else self.verify_cost

    def bar(self, b: int, k: int, greedy: bool, draft_cost: float = 0.0) -> float:
        """The mean expected accepted draft tokens per live row a speculative round needs."""
        return max(self.threshold(k), self.round_cost(b, k, greedy, draft_cost) - 1.0)

    def off(self, b: int, k: int, greedy: bool, draft_cost: float, max_accept: int) -> bool:
        """Whether a round that accepts all it can (max_accept + 1 tokens) gains less than min_best_gain."""
        return max_accept + 1 < self.min_best_gain * self.round_cost(b, k, greedy, draft_cost)

    def off_note(self, b: int, k: int, greedy: bool, draft_cost: float, max_accept: int) -> str:
        """Why speculation is off, for the stats line ("" when it is on)."""
        if not self.off(b, k, greedy, draft_cost, max_accept):
            return ""
        cost = self.round_cost(b, k, greedy, draft_cost)
        return (f"speculation off at batch {b}: a round would cost ~{cost:.1f} plain steps for at most "
                f"{max_accept + 1} tokens, a best case below {self.min_best_gain:g}x (override: min_best_gain / "
                f"spec_min_best_gain=0, or verify_cost / spec_verify_cost=)")


def estimated_verify_cost(b: int, k: int, greedy: bool) -> float:
    """A speculative round's cost in plain rounds: (b, k+1)-token forward and verification vs a (b, 1) step.

    Measured on Gemma 3 270M, quiet 2-core XLA:CPU (docs/performance.md, "verify cost"): batch 1
    1.84 (k=4) / 2.33 (k=8); batch 8 greedy 2.09 / 3.47, sampled 2.14 / 7.98 — past MAX_CHUNKED_ROWS
    block rows the head is one float32 product whose full logits sampling also normalises. Modelled
    as 1 + k · per-row cost. Other backends: verification is nearly free next to a step.
    """
    if jax.default_backend() != "cpu":
        return 1.0 + 0.05 * k
    if b == 1:
        per_row = 0.2
    elif greedy or b * (k + 1) <= MAX_CHUNKED_ROWS:
        per_row = 0.3
    else:
        per_row = 0.9
    return 1.0 + per_row * k


@struct.dataclass(kw_only=True)
class SpecState(loop.RowState):
    """Loop carry (`loop.RowState` plus the following). last_b is each row's latest token, at
    position pos_b (its keys/values are not in the cache yet: the next round's block starts with
    it). hist_bl[b, :pos_b + 1] is the row's whole text (prompt, then generated).

    Statistics: rounds_b counts target forwards in which the row was live, plain_rounds_b those
    that were plain one-token rounds; drafted_bk / accepted_bk count, per draft position (per
    depth for token trees), the speculative rounds that proposed / accepted a token there;
    draft_tokens_b sums the real draft tokens (tree nodes) verified.

    Adaptive drafting: accept_ema_b (moving average of accepted draft tokens per round);
    plain_streak counts the batch's plain rounds since its last speculative round or probe, and
    probe_gap is the streak at which a costly drafter probes next. The shadow draft (a cheap
    drafter's latest, or a costly drafter's probe): shadow_bk with parents shadow_parent_bk (a
    chain's are -1, 0, 1, …), of which shadow_len_b tokens are real (0: no shadow); shadow_hit_b of
    them matched the committed text so far, down to node shadow_node_b (-1: none yet).

    draft_state is the drafter's own carry (`drafters.Drafter`), () for stateless drafters.
    sampling (static), temperature and top_p are the loop's token selection, so that a sampling
    drafter can filter its q exactly like the target's p (`draft_chain.DraftSampling`).
    """

    hist_bl: jax.Array
    last_b: jax.Array
    rounds_b: jax.Array
    plain_rounds_b: jax.Array
    drafted_bk: jax.Array
    accepted_bk: jax.Array
    accept_ema_b: jax.Array
    plain_streak: jax.Array
    probe_gap: jax.Array
    draft_tokens_b: jax.Array
    shadow_bk: jax.Array
    shadow_parent_bk: jax.Array
    shadow_len_b: jax.Array
    shadow_hit_b: jax.Array
    shadow_node_b: jax.Array
    draft_state: Any = ()
    sampling: SamplingConfig = struct.field(pytree_node=False, default=SamplingConfig())
    temperature: jax.Array | float = 1.0
    top_p: jax.Array | float = 1.0

    @property
    def hist_len_b(self) -> jax.Array:
        return self.pos_b + 1


def commit(s: SpecState, tokens_bt, n_b, max_new, eos_ids, stop_tables, grammar=None) -> SpecState:
    """Emits tokens_bt[b, :n_b[b]] per live row, stopping a row at EOS / stop / length (/ a complete
    grammar sentence; the grammar state follows the emitted tokens only).

    A static loop over the block with masks: `_emit` marks a row done on the token that
    ends it, and later tokens of the block are then masked out — which is how an EOS
    inside an accepted run truncates it, and how max_new_tokens is never exceeded.
    """
    b, t = tokens_bt.shape
    live_b = ~s.done_b
    count0_b = s.count_b
    for i in range(t):
        emit_b = ~s.done_b & (i < n_b)
        # Token i of the round sits at position pos + 1 + i of the history.
        col_b = jnp.where(emit_b, s.pos_b + 1 + i, s.hist_bl.shape[1])
        s = s.replace(hist_bl=s.hist_bl.at[jnp.arange(b), col_b].set(tokens_bt[:, i], mode="drop"))
        s = loop._emit(s, tokens_bt[:, i], emit_b, max_new, eos_ids, stop_tables, grammar)
    emitted_b = s.count_b - count0_b
    last_b = jnp.take_along_axis(tokens_bt, jnp.maximum(emitted_b - 1, 0)[:, None], axis=1)[:, 0]
    return s.replace(pos_b=s.pos_b + emitted_b, last_b=jnp.where(live_b & (emitted_b > 0), last_b, s.last_b))


def observe(drafter, model, draft_params, s_old: SpecState, s: SpecState, tokens_bt, hidden_btd) -> SpecState:
    """Shows the drafter what the round committed (s_old → s) and the target's hidden states there."""
    obs = Observation(tokens_bt=tokens_bt, hidden_btd=hidden_btd, n_b=s.count_b - s_old.count_b, pos_b=s_old.pos_b)
    return s.replace(draft_state=drafter.observe(model, draft_params, s.draft_state, obs))


def advance_shadow(s: SpecState, draft, tok_b: jax.Array, live_b: jax.Array) -> tuple[SpecState, jax.Array]:
    """Follows a plain round's token tok_b down each row's shadow draft.

    A row without a shadow adopts this round's draft (chain or tree; a chain is the tree with
    parents -1, 0, 1, …). The shadow's current node moves to its first real child carrying
    tok_b; the shadow ends (returned end_b: its hit count is final) at a mismatch or a leaf.
    For greedy decoding the hit count is what tree verification would have accepted; for
    sampling with point-mass candidates it has the same law (both take child x with
    probability p(x)).
    """
    k = draft.tokens_bk.shape[1]
    parent_bk = draft.parent_bk
    if parent_bk is None:
        parent_bk = jnp.broadcast_to(jnp.arange(-1, k - 1, dtype=jnp.int32), draft.tokens_bk.shape)
    fresh_b = s.shadow_len_b == 0
    shadow_bk = jnp.where(fresh_b[:, None], draft.tokens_bk, s.shadow_bk)
    parent_bk = jnp.where(fresh_b[:, None], tree_lib.sanitize_parents(parent_bk), s.shadow_parent_bk)
    len_b = jnp.where(fresh_b, draft.len_b, s.shadow_len_b)
    hit_b = jnp.where(fresh_b, 0, s.shadow_hit_b)
    node_b = jnp.where(fresh_b, -1, s.shadow_node_b)
    real_bk = jnp.arange(k)[None, :] < len_b[:, None]
    child_bk = real_bk & (parent_bk == node_b[:, None])
    match_bk = child_bk & (shadow_bk == tok_b[:, None])
    open_b = live_b & (len_b > 0)
    match_b = open_b & jnp.any(match_bk, axis=1)
    node_b = jnp.where(match_b, jnp.argmax(match_bk, axis=1), node_b).astype(jnp.int32)
    hit_b = hit_b + match_b.astype(jnp.int32)
    leaf_b = ~jnp.any(real_bk & (parent_bk == node_b[:, None]), axis=1)
    end_b = open_b & (~match_b | leaf_b)
    s = s.replace(shadow_bk=shadow_bk, shadow_parent_bk=parent_bk, shadow_len_b=jnp.where(end_b | ~live_b, 0, len_b),
                  shadow_hit_b=hit_b, shadow_node_b=node_b)
    return s, end_b


def check_draft(draft, drafter, b: int, k: int, vocab: int) -> None:
    """Raises one clear error (at trace time: shapes are static) when a drafter's Draft is misshapen."""
    want = {"tokens_bk": (b, k), "len_b": (b,), "parent_bk": (b, k), "q_probs_bkv": (b, k, vocab)}
    for name, shape in want.items():
        value = getattr(draft, name)
        if value is not None and tuple(value.shape) != shape:
            raise GenerationError(f"drafter {type(drafter).__name__} proposed Draft.{name} of shape "
                                  f"{tuple(value.shape)}; the loop needs {shape} "
                                  f"(batch {b}, k={k}, vocabulary {vocab})")


def make_loop(model, draft_params, k, drafter, sampling, temperature, static_top_p, top_p, max_new, eos_ids,
              stop_tables, adapt: Adaptive | None, grammar: constrain.BatchGrammar | None = None):
    """The decode loop after the prefill: `run(state) -> state` once every row is done.

    Without a policy every round speculates; with one, rounds alternate between runs of plain and of
    speculative rounds as `Adaptive` decides (`phases`).

    With a grammar, a chain draft is cut before its first token the grammar refuses, and the target's
    logits are masked at every block position with the state the drafts before it reach
    (`constrain.draft_states`; per node from its parent's state for trees): verification then
    compares against (greedy) or corrects towards (sampling) the masked target distribution, exactly
    what plain constrained decoding samples from.
    """

    cheap = is_cheap(drafter)
    drafting_cost = draft_cost(drafter, model, draft_params, k)

    def verify_target(hidden_btd, state_bt):
        """Greedy: the target's argmax tokens [B, k+1]; sampling: its (masked) logits [B, k+1, V]."""
        if sampling.greedy and grammar is None:
            return model.greedy_tokens(hidden_btd)
        logits_btv = model.logits(hidden_btd)
        if grammar is not None:
            logits_btv = constrain.mask_block(grammar, state_bt, logits_btv)
        return jnp.argmax(logits_btv, axis=-1).astype(jnp.int32) if sampling.greedy else logits_btv

    def ema(old_b, new_b, where_b, w=None):
        if w is None:
            w = adapt.ema_weight if adapt is not None else Adaptive.ema_weight
        return jnp.where(where_b, (1 - w) * old_b + w * new_b.astype(jnp.float32), old_b)

    def verify_chain(s: SpecState, draft, key, state_bt):
        """Chain round: causal block at consecutive positions; nothing to compact."""
        block_bt = jnp.concatenate([s.last_b[:, None], draft.tokens_bk], axis=1)
        positions_bt = s.pos_b[:, None] + jnp.arange(k + 1, dtype=jnp.int32)[None, :]
        # Finished rows still ride along (static shapes); their writes land on slots they
        # will never read, within the cache because their pos_b stopped advancing.
        hidden_btd, cache = model(block_bt, positions_bt, s.cache, s.pos_b)
        target = verify_target(hidden_btd, state_bt)
        if sampling.greedy:
            accepted_b, tokens_bt = greedy_verify(target, draft.tokens_bk, draft.len_b)
        else:
            accepted_b, tokens_bt = sampling_verify(target, draft.tokens_bk, draft.len_b, key, temperature,
                                                    sampling.top_k, static_top_p, draft.q_probs_bkv)
        return cache, accepted_b, tokens_bt, hidden_btd, draft.len_b

    def verify_tree(s: SpecState, draft, key, state_bt):
        """Tree round: ancestor mask, positions by depth, then the accepted path compacted into place."""
        anc_bkk = tree_lib.ancestor_mask(draft.parent_bk)
        depth_bk = tree_lib.depths(anc_bkk)
        block_bt = jnp.concatenate([s.last_b[:, None], draft.tokens_bk], axis=1)
        positions_bt = tree_lib.block_positions(s.pos_b, depth_bk)
        hidden_btd, cache = model(block_bt, positions_bt, s.cache, s.pos_b, tree_lib.block_mask(anc_bkk))
        target = verify_target(hidden_btd, state_bt)
        if sampling.greedy:
            accepted_b, tokens_bt, path_bk = tree_greedy_verify(target, draft.tokens_bk, draft.parent_bk,
                                                                draft.len_b)
        else:
            accepted_b, tokens_bt, path_bk = tree_sampling_verify(
                target, draft.tokens_bk, draft.parent_bk, draft.len_b, key, temperature, sampling.top_k,
                static_top_p, draft.q_probs_bkv)
        # The path's keys/values sit at slots pos + 1 + node; committed slot s must hold position s.
        i_bk = jnp.arange(k)[None, :]
        move_bk = ~s.done_b[:, None] & (i_bk < accepted_b[:, None])
        dst_bk = jnp.where(move_bk, s.pos_b[:, None] + 1 + i_bk, cache.num_slots)
        cache = move_slots(cache, s.pos_b[:, None] + 1 + path_bk, dst_bk)
        # Observation row i must be the state that predicted the path's i-th emitted token.
        hidden_btd = jnp.take_along_axis(hidden_btd, tree_lib.path_rows(path_bk, accepted_b)[..., None], axis=1)
        return cache, accepted_b, tokens_bt, hidden_btd, tree_lib.max_valid_depth(depth_bk, draft.len_b)

    def spec_round(s: SpecState, draft, state_bt) -> SpecState:
        """Verifies `draft`. An empty draft ("no idea") leaves a cheap drafter's average alone (its shadow
        drafts keep measuring), but counts as 0 accepted for a costly one: the policy decides without
        seeing drafts, so a row that stops drafting must lower its average to let plain rounds in."""
        live_b = ~s.done_b
        key, sub = jax.random.split(s.key)
        verify = verify_chain if draft.parent_bk is None else verify_tree
        cache, accepted_b, tokens_bt, hidden_btd, reach_b = verify(s, draft, sub, state_bt)
        i_k = jnp.arange(k)[None, :]
        live_b1 = live_b[:, None]
        s = s.replace(
            cache=cache, key=key, steps=s.steps + 1,
            rounds_b=s.rounds_b + live_b.astype(jnp.int32),
            # By position along the chain, by depth in a tree (`reach_b`: deepest real node).
            drafted_bk=s.drafted_bk + (live_b1 & (i_k < reach_b[:, None])).astype(jnp.int32),
            accepted_bk=s.accepted_bk + (live_b1 & (i_k < accepted_b[:, None])).astype(jnp.int32),
            draft_tokens_b=s.draft_tokens_b + jnp.where(live_b, draft.len_b, 0),
            accept_ema_b=ema(s.accept_ema_b, accepted_b, live_b & ((draft.len_b > 0) | ~cheap)),
            plain_streak=jnp.zeros_like(s.plain_streak),
            shadow_len_b=jnp.zeros_like(s.shadow_len_b),  # the next plain round starts afresh
        )
        s_new = commit(s, tokens_bt, accepted_b + 1, max_new, eos_ids, stop_tables, grammar)
        return observe(drafter, model, draft_params, s, s_new, tokens_bt, hidden_btd)

    def plain_round(s: SpecState, draft=None, state_bt=None) -> SpecState:
        """One sampled token per row; `draft` (None: no shadows) starts and advances the shadow drafts.

        A finished shadow updates a cheap drafter's average; it replaces a costly drafter's (a probe's
        measurement after a gap of plain rounds, when the old average says little)."""
        live_b = ~s.done_b
        hidden_b1d, cache = model(s.last_b[:, None], s.pos_b[:, None], s.cache, s.pos_b)
        # The barrier keeps the final norm out of the one-row int8 head's fused product (as the
        # loop boundary does in `loop.generate_program`), and `live` keeps the head's float32
        # copy from being hoisted out of the loop (quant.py).
        hidden_b1d = jax.lax.optimization_barrier(hidden_b1d)
        key, sub = jax.random.split(s.key)
        tok_b = loop.next_tokens(model, hidden_b1d, s.steps, sub, sampling, temperature, top_p, grammar, s.gram_b)
        if draft is not None:
            s, shadow_end_b = advance_shadow(s, draft, tok_b, live_b)
            s = s.replace(accept_ema_b=ema(s.accept_ema_b, s.shadow_hit_b, shadow_end_b, None if cheap else 1.0))
        s = s.replace(
            cache=cache, key=key, steps=s.steps + 1, plain_streak=s.plain_streak + 1,
            rounds_b=s.rounds_b + live_b.astype(jnp.int32),
            plain_rounds_b=s.plain_rounds_b + live_b.astype(jnp.int32),
        )
        s_new = commit(s, tok_b[:, None], jnp.ones_like(s.count_b), max_new, eos_ids, stop_tables, grammar)
        return observe(drafter, model, draft_params, s, s_new, tok_b[:, None], hidden_b1d)

    def propose(s: SpecState):
        """This round's draft (chain drafts cut at the grammar's first refusal) and its block states."""
        draft, draft_state = drafter.propose(model, draft_params, s, k)
        check_draft(draft, drafter, s.last_b.shape[0], k, model.cfg.vocab_size)
        s = s.replace(draft_state=draft_state)
        state_bt = None
        if grammar is not None:
            state_bt, len_b = constrain.draft_states(grammar, s.gram_b, draft.tokens_bk, draft.len_b, draft.parent_bk)
            draft = draft.replace(len_b=len_b)
        return s, draft, state_bt

    def wants(s: SpecState, has_draft_b=None):
        """Whether the batch's mean expected accepted tokens per live row reaches the bar (`Adaptive`)."""
        live_b = ~s.done_b
        gain_b = jnp.where(live_b if has_draft_b is None else live_b & has_draft_b, s.accept_ema_b, 0.0)
        bar = adapt.bar(s.done_b.shape[0], k, sampling.greedy, drafting_cost)
        return jnp.sum(gain_b) >= bar * jnp.sum(live_b.astype(jnp.float32))

    def running(s: SpecState):
        return ~jnp.all(s.done_b)

    def phases(chosen, plain_fn, spec_fn, carry):
        """Plain rounds while the batch does not speculate, then speculative rounds while it does.

        Two inner while loops instead of `lax.cond(chosen, spec, plain)` per round: a conditional's
        operands include the KV cache, and XLA:CPU copied all of it into and out of the conditional
        every round (36 buffers, ~20 ms a round at batch 8). A while loop updates its carry in place.
        """
        carry = jax.lax.while_loop(lambda c: running(c[0]) & ~chosen(c), plain_fn, carry)
        return jax.lax.while_loop(lambda c: running(c[0]) & chosen(c), spec_fn, carry)

    def run(s: SpecState) -> SpecState:
        if adapt is None:
            return jax.lax.while_loop(running, lambda s: spec_round(*propose(s)), s)
        if adapt.off(s.done_b.shape[0], k, sampling.greedy, drafting_cost, max_accept(drafter, k)):
            return jax.lax.while_loop(running, plain_round, s)  # even perfect drafts would not pay
        if cheap:
            # The carry holds the next round's draft (a cheap drafter proposes every round): the loop
            # conditions decide from it, and a plain round's shadow follows it.
            def chosen(c):
                return wants(c[0], c[1].len_b > 0)

            def plain_fn(c):
                return propose(plain_round(*c))

            def spec_fn(c):
                return propose(spec_round(*c))

            carry = jax.lax.while_loop(lambda c: running(c[0]), lambda c: phases(chosen, plain_fn, spec_fn, c),
                                       propose(s))
            return carry[0]

        return run_costly(s)

    def run_costly(s: SpecState) -> SpecState:
        """A costly drafter drafts in speculative rounds and probes only (`Adaptive.probe_every`)."""
        b = s.done_b.shape[0]
        no_draft = Draft(tokens_bk=jnp.zeros((b, k), jnp.int32), len_b=jnp.zeros((b,), jnp.int32))

        def plain_costly(c):
            return (plain_round(c[0], no_draft),)  # follows the open shadows, starts none

        def probe_costly(c):
            s, draft, _ = propose(c[0])
            s = plain_round(s, draft)
            return (s.replace(plain_streak=jnp.zeros_like(s.plain_streak),
                              probe_gap=jnp.minimum(2 * s.probe_gap, adapt.max_probe_every)),)

        def spec_costly(c):
            s = spec_round(*propose(c[0]))
            return (s.replace(probe_gap=jnp.full_like(s.probe_gap, adapt.probe_every)),)

        def phases_costly(c):
            c = jax.lax.while_loop(lambda c: running(c[0]) & ~wants(c[0]) & (c[0].plain_streak < c[0].probe_gap),
                                   plain_costly, c)
            # At most one trip (the probe resets the streak): a while loop, not a cond (see `phases`).
            c = jax.lax.while_loop(lambda c: running(c[0]) & ~wants(c[0]) & (c[0].plain_streak >= c[0].probe_gap),
                                   probe_costly, c)
            return jax.lax.while_loop(lambda c: running(c[0]) & wants(c[0]), spec_costly, c)

        return jax.lax.while_loop(lambda c: running(c[0]), phases_costly, (s,))[0]

    return run
