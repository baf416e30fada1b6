"""The two kinds of round of the speculative loop, as top-level functions of a frozen `RoundContext`.

A *speculative round* (`spec_round`) runs ONE target forward over [last, d_1 … d_k] for the whole
batch and verifies the drafts. A *plain round* (`plain_round`) runs the one-token forward of
`loop.generate_program` instead and samples one token, exactly as plain decoding would. Which runs
when is the policy's business (`policy.py`); each round here maps a `SpecState` to the next one, so
it can be traced and tested alone.

With a grammar, a chain draft is cut before its first token the grammar refuses, and the target's
logits are masked at every block position with the state the drafts before it reach
(`constrain.draft_states`; per node from its parent's state for trees): verification then compares
against (greedy) or corrects towards (sampling) the masked target distribution, exactly what plain
constrained decoding samples from. Either kind of round shows the drafter what it committed (`observe`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specjax.decode import constrain, loop
from specjax.decode.backend import BackendProfile, profile_for
from specjax.decode.errors import GenerationError
from specjax.decode.sampling import SamplingConfig
from specjax.decode.spec import trees as tree_lib
from specjax.decode.spec.cost import draft_cost, max_accept, packed_share, product_kernel
from specjax.decode.spec.drafters.base import Draft, DraftSampling, DraftView, Observation, is_cheap
from specjax.decode.spec.state import SpecRow, SpecState
from specjax.decode.spec.verify import greedy_verify, sampling_verify, tree_greedy_verify, tree_sampling_verify
from specjax.decode.stops import StopTables
from specjax.models.kv_cache import move_slots
from specjax.models.layers import top_k
from specjax.models.reductions import argmax

DEFAULT_EMA_WEIGHT = 0.3  # without a policy the average is still kept (for the stats), with this weight


@dataclasses.dataclass(frozen=True)
class RoundContext:
    """Everything a round reads besides its carry: the models, the static options and the traced settings.

    Built once per trace (`create`) inside the program; the arrays it holds are tracers of that trace.

    Attributes:
      model: the merged target; draft_params: the drafter's weights (a pytree, () for none).
      k: draft length (tree node count); drafter: the static `Drafter`.
      sampling: static token selection; temperature, top_p: its traced values.
      max_new, eos_ids, stop_tables, grammar: when rows stop, and the rows' grammars (or None).
      adapt: the static adaptive policy (`policy.Adaptive`), or None to speculate every round.
      profile: the backend's profile (`models/backend_profile.py`).
      cheap, drafting_cost: what a draft costs (`Drafter.cheap`, `cost.draft_cost`), derived once.
      packed: the target's `cost.packed_share` on this backend (what packed weights add to a verify).
      kernel: the target's `cost.product_kernel` (which products its verify forward runs).
      observe_top_k: r > 0 when the drafter wants the target's top-r tokens at every verified block row
        (`Drafter.observe_top_k`, `Observation.block_top_btr`), else 0.
      taps: target blocks whose outputs the drafter reads (`Drafter.feature_layers`, EAGLE-3), else ().
    """

    model: Any
    draft_params: Any
    k: int
    drafter: Any
    sampling: SamplingConfig
    temperature: Any
    top_p: Any
    max_new: Any
    eos_ids: tuple[int, ...]
    stop_tables: StopTables | None
    adapt: Any = None
    grammar: constrain.BatchGrammar | None = None
    profile: BackendProfile = dataclasses.field(default_factory=profile_for)
    cheap: bool = False
    drafting_cost: float = 0.0
    observe_top_k: int = 0
    packed: float = 0.0
    taps: tuple[int, ...] = ()
    kernel: str = "xla"

    @classmethod
    def create(cls, model, draft_params, k: int, drafter, sampling: SamplingConfig, temperature, top_p, max_new,
               eos_ids, stop_tables, adapt=None, grammar=None, profile: BackendProfile | None = None) -> RoundContext:
        cost = draft_cost(drafter, model, draft_params, k)
        profile = profile or profile_for()
        return cls(model, draft_params, k, drafter, sampling, temperature, top_p, max_new, eos_ids, stop_tables,
                   adapt, grammar, profile, is_cheap(drafter), cost, int(getattr(drafter, "observe_top_k", 0)),
                   packed_share(model, profile), feature_layers(drafter), product_kernel(model, profile))

    def bar(self, b: int) -> float:
        """The policy's bar (`policy.Adaptive.bar`) for a batch of b rows of this round's setup."""
        return self.adapt.bar(b, self.k, self.sampling.greedy, self.drafting_cost, self.packed, self.kernel)

    def policy_off(self, b: int) -> bool:
        """Whether the policy switches speculation off at batch b (`policy.Adaptive.off`)."""
        return self.adapt.off(b, self.k, self.sampling.greedy, self.drafting_cost, max_accept(self.drafter, self.k),
                              self.packed, self.kernel)

    @property
    def static_top_p(self):
        """top_p for verification: 1.0 (no nucleus sort, static) unless sampling filters by it (as `sample`)."""
        return 1.0 if self.sampling.top_p >= 1.0 else self.top_p

    @property
    def ema_weight(self) -> float:
        return self.adapt.ema_weight if self.adapt is not None else DEFAULT_EMA_WEIGHT

    def draft_sampling(self) -> DraftSampling:
        return DraftSampling.of(self.sampling, self.temperature, self.top_p)


def feature_layers(drafter) -> tuple[int, ...]:
    """The target blocks whose outputs `drafter` reads (`Drafter.feature_layers`; undeclared: none)."""
    return tuple(getattr(drafter, "feature_layers", ()))


def target_forward(ctx: RoundContext, tokens_bt, positions_bt, cache, start_b, block_mask_btt=None):
    """The target's forward over a block: (final-normed hidden, cache, the drafter's tapped layers or None)."""
    return ctx.model.forward(tokens_bt, positions_bt, cache, start_b, block_mask_btt, taps=ctx.taps)


def commit(ctx: RoundContext, row: SpecRow, tokens_bt, n_b) -> SpecRow:
    """Emits tokens_bt[b, :n_b[b]] per live row, stopping a row at EOS / stop / length (/ a complete
    grammar sentence; the grammar state follows the emitted tokens only).

    A static loop over the block with masks: `loop.emit` marks a row done on the token that ends it,
    and later tokens of the block are then masked out — which is how an EOS inside an accepted run
    truncates it, and how max_new_tokens is never exceeded.
    """
    b, t = tokens_bt.shape
    live_b = ~row.done_b
    count0_b = row.count_b
    for i in range(t):
        emit_b = ~row.done_b & (i < n_b)
        # Token i of the round sits at position pos + 1 + i of the history.
        col_b = jnp.where(emit_b, row.pos_b + 1 + i, row.hist_bl.shape[1])
        row = row.replace(hist_bl=row.hist_bl.at[jnp.arange(b), col_b].set(tokens_bt[:, i], mode="drop"))
        row = loop.emit(row, tokens_bt[:, i], emit_b, ctx.max_new, ctx.eos_ids, ctx.stop_tables, ctx.grammar)
    emitted_b = row.count_b - count0_b
    last_b = jnp.take_along_axis(tokens_bt, jnp.maximum(emitted_b - 1, 0)[:, None], axis=1)[:, 0]
    return row.replace(pos_b=row.pos_b + emitted_b, last_b=jnp.where(live_b & (emitted_b > 0), last_b, row.last_b))


def observe(ctx: RoundContext, old: SpecRow, s: SpecState, tokens_bt, seen, block=(None, None, None)) -> SpecState:
    """Shows the drafter what the round committed (row `old` → s.row) and what the target computed there:
    `seen` = (final-normed hidden states, tapped layers or None); `block`: (block_bt, block_top_btr,
    block_len_b) of a speculative round (`Observation`)."""
    obs = Observation(tokens_bt=tokens_bt, hidden_btd=seen[0], n_b=s.row.count_b - old.count_b, pos_b=old.pos_b,
                      block_bt=block[0], block_top_btr=block[1], block_len_b=block[2], taps_btx=seen[1])
    return s.replace(draft=ctx.drafter.observe(ctx.model, ctx.draft_params, s.draft, obs))


def ema(old_b, new_b, where_b, w: float):
    """The moving average `old_b` updated with `new_b` where `where_b`."""
    return jnp.where(where_b, (1 - w) * old_b + w * new_b.astype(jnp.float32), old_b)


def check_draft(draft, drafter, b: int, k: int, vocab: int) -> None:
    """Raises one clear error (at trace time: shapes are static) when a drafter's Draft is misshapen."""
    want = {"tokens_bk": (b, k), "len_b": (b,), "parent_bk": (b, k), "q_probs_bkv": (b, k, vocab)}
    for name, shape in want.items():
        value = getattr(draft, name)
        if value is not None and tuple(value.shape) != shape:
            raise GenerationError(f"drafter {type(drafter).__name__} proposed Draft.{name} of shape "
                                  f"{tuple(value.shape)}; the loop needs {shape} "
                                  f"(batch {b}, k={k}, vocabulary {vocab})")


def propose(ctx: RoundContext, s: SpecState) -> tuple[SpecState, Draft, jax.Array | None]:
    """This round's draft (chain drafts cut at the grammar's first refusal) and its block states."""
    view = DraftView(row=s.row, draft_state=s.draft, sampling=ctx.draft_sampling(), profile=ctx.profile)
    draft, draft_state = ctx.drafter.propose(ctx.model, ctx.draft_params, view, ctx.k)
    check_draft(draft, ctx.drafter, s.row.last_b.shape[0], ctx.k, ctx.model.cfg.vocab_size)
    s = s.replace(draft=draft_state)
    state_bt = None
    if ctx.grammar is not None:
        state_bt, len_b = constrain.draft_states(ctx.grammar, s.row.gram_b, draft.tokens_bk, draft.len_b,
                                                 draft.parent_bk)
        draft = draft.replace(len_b=len_b)
    return s, draft, state_bt


def verify_target(ctx: RoundContext, hidden_btd, state_bt):
    """Greedy: the target's argmax tokens [B, k+1]; sampling: its (masked) logits [B, k+1, V]. Second: the
    top `ctx.observe_top_k` tokens at each block row [B, k+1, r] from the same logits, or None."""
    r = ctx.observe_top_k
    if ctx.sampling.greedy and ctx.grammar is None:
        if r:
            top_btr = ctx.model.top_tokens(hidden_btd, r)
            return top_btr[..., 0], top_btr
        return ctx.model.greedy_tokens(hidden_btd), None
    logits_btv = ctx.model.logits(hidden_btd)
    if ctx.grammar is not None:
        logits_btv = constrain.mask_block(ctx.grammar, state_bt, logits_btv)
    top_btr = top_k(logits_btv, r)[1] if r else None
    return (argmax(logits_btv) if ctx.sampling.greedy else logits_btv), top_btr


def verify_chain(ctx: RoundContext, row: SpecRow, draft: Draft, key, state_bt):
    """Chain round: causal block at consecutive positions; nothing to compact.

    Returns:
      (cache, accepted_b, tokens_bt, (hidden_btd, taps or None) of the emitted tokens' predictors, reach_b,
      the block's top-r tokens or None: `verify_target`).
    """
    block_bt = jnp.concatenate([row.last_b[:, None], draft.tokens_bk], axis=1)
    positions_bt = row.pos_b[:, None] + jnp.arange(ctx.k + 1, dtype=jnp.int32)[None, :]
    # Finished rows still ride along (static shapes); their writes land on slots they
    # will never read, within the cache because their pos_b stopped advancing.
    hidden_btd, cache, taps = target_forward(ctx, block_bt, positions_bt, row.cache, row.pos_b)
    target, top_btr = verify_target(ctx, hidden_btd, state_bt)
    if ctx.sampling.greedy:
        accepted_b, tokens_bt = greedy_verify(target, draft.tokens_bk, draft.len_b)
    else:
        accepted_b, tokens_bt = sampling_verify(target, draft.tokens_bk, draft.len_b, key, ctx.temperature,
                                                ctx.sampling.top_k, ctx.static_top_p, draft.q_probs_bkv)
    return cache, accepted_b, tokens_bt, (hidden_btd, taps), draft.len_b, top_btr


def verify_tree(ctx: RoundContext, row: SpecRow, draft: Draft, key, state_bt):
    """Tree round: ancestor mask, positions by depth, then the accepted path compacted into place."""
    anc_bkk = tree_lib.ancestor_mask(draft.parent_bk)
    depth_bk = tree_lib.depths(anc_bkk)
    block_bt = jnp.concatenate([row.last_b[:, None], draft.tokens_bk], axis=1)
    positions_bt = tree_lib.block_positions(row.pos_b, depth_bk)
    hidden_btd, cache, taps = target_forward(ctx, block_bt, positions_bt, row.cache, row.pos_b,
                                             tree_lib.block_mask(anc_bkk))
    target, top_btr = verify_target(ctx, hidden_btd, state_bt)
    if ctx.sampling.greedy:
        accepted_b, tokens_bt, path_bk = tree_greedy_verify(target, draft.tokens_bk, draft.parent_bk, draft.len_b)
    else:
        accepted_b, tokens_bt, path_bk = tree_sampling_verify(
            target, draft.tokens_bk, draft.parent_bk, draft.len_b, key, ctx.temperature, ctx.sampling.top_k,
            ctx.static_top_p, draft.q_probs_bkv)
    # The path's keys/values sit at slots pos + 1 + node; committed slot s must hold position s.
    i_bk = jnp.arange(ctx.k)[None, :]
    move_bk = ~row.done_b[:, None] & (i_bk < accepted_b[:, None])
    dst_bk = jnp.where(move_bk, row.pos_b[:, None] + 1 + i_bk, cache.num_slots)
    cache = move_slots(cache, row.pos_b[:, None] + 1 + path_bk, dst_bk)
    # Observation row i must be the state that predicted the path's i-th emitted token.
    rows_bk1 = tree_lib.path_rows(path_bk, accepted_b)[..., None]
    seen = tuple(None if x is None else jnp.take_along_axis(x, rows_bk1, axis=1) for x in (hidden_btd, taps))
    return cache, accepted_b, tokens_bt, seen, tree_lib.max_valid_depth(depth_bk, draft.len_b), top_btr


def spec_round(ctx: RoundContext, s: SpecState, draft: Draft, state_bt=None) -> SpecState:
    """Verifies `draft` and commits what was accepted plus the correction / bonus token.

    An empty draft ("no idea") leaves a cheap drafter's average alone (its shadow drafts keep
    measuring), but counts as 0 accepted for a costly one: the policy decides without seeing drafts,
    so a row that stops drafting must lower its average to let plain rounds in.
    """
    row, pol, cnt = s.row, s.policy, s.counters
    live_b = ~row.done_b
    key, sub = jax.random.split(row.key)
    verify = verify_chain if draft.parent_bk is None else verify_tree
    cache, accepted_b, tokens_bt, seen, reach_b, top_btr = verify(ctx, row, draft, sub, state_bt)
    if ctx.grammar is not None:  # a token that would not let the row end in time ends the round (close_block)
        tokens_bt, accepted_b, late_b = constrain.close_block(ctx.grammar, row.gram_b, tokens_bt, accepted_b,
                                                              ctx.max_new - row.count_b - 1, ctx.eos_ids)
        row = loop.mark_closed(row, late_b)
    i_k = jnp.arange(ctx.k)[None, :]
    live_b1 = live_b[:, None]
    live_i = live_b.astype(jnp.int32)
    cnt = cnt.replace(
        rounds_b=cnt.rounds_b + live_i,
        # By position along the chain, by depth in a tree (`reach_b`: deepest real node).
        drafted_bk=cnt.drafted_bk + (live_b1 & (i_k < reach_b[:, None])).astype(jnp.int32),
        accepted_bk=cnt.accepted_bk + (live_b1 & (i_k < accepted_b[:, None])).astype(jnp.int32),
        draft_tokens_b=cnt.draft_tokens_b + jnp.where(live_b, draft.len_b, 0))
    pol = pol.replace(
        accept_ema_b=ema(pol.accept_ema_b, accepted_b, live_b & ((draft.len_b > 0) | ~ctx.cheap), ctx.ema_weight),
        plain_streak=jnp.zeros_like(pol.plain_streak),
        shadow=pol.shadow.replace(len_b=jnp.zeros_like(pol.shadow.len_b)))  # the next plain round starts afresh
    row = row.replace(cache=cache, key=key, steps=row.steps + 1)
    new_row = commit(ctx, row, tokens_bt, accepted_b + 1)
    block = (None, None, None)
    if top_btr is not None:
        block_bt = jnp.concatenate([row.last_b[:, None], draft.tokens_bk], axis=1)
        block = (block_bt, top_btr, jnp.where(live_b, 1 + draft.len_b, 0).astype(jnp.int32))
    return observe(ctx, row, SpecState(new_row, pol, cnt, s.draft), tokens_bt, seen, block)


def advance_shadow(shadow, draft: Draft, tok_b: jax.Array, live_b: jax.Array):
    """Follows a plain round's token tok_b down each row's shadow draft (`state.Shadow`).

    A row without a shadow adopts this round's draft (chain or tree; a chain is the tree with
    parents -1, 0, 1, …). The shadow's current node moves to its first real child carrying
    tok_b; the shadow ends (returned end_b: its hit count is final) at a mismatch or a leaf.
    For greedy decoding the hit count is what tree verification would have accepted; for
    sampling with point-mass candidates it has the same law (both take child x with
    probability p(x)).

    Returns:
      (the new Shadow, end_b).
    """
    k = draft.tokens_bk.shape[1]
    parent_bk = draft.parent_bk
    if parent_bk is None:
        parent_bk = jnp.broadcast_to(jnp.arange(-1, k - 1, dtype=jnp.int32), draft.tokens_bk.shape)
    fresh_b = shadow.len_b == 0
    tokens_bk = jnp.where(fresh_b[:, None], draft.tokens_bk, shadow.tokens_bk)
    parent_bk = jnp.where(fresh_b[:, None], tree_lib.sanitize_parents(parent_bk), shadow.parent_bk)
    len_b = jnp.where(fresh_b, draft.len_b, shadow.len_b)
    hit_b = jnp.where(fresh_b, 0, shadow.hit_b)
    node_b = jnp.where(fresh_b, -1, shadow.node_b)
    real_bk = jnp.arange(k)[None, :] < len_b[:, None]
    child_bk = real_bk & (parent_bk == node_b[:, None])
    match_bk = child_bk & (tokens_bk == tok_b[:, None])
    open_b = live_b & (len_b > 0)
    match_b = open_b & jnp.any(match_bk, axis=1)
    node_b = jnp.where(match_b, jnp.argmax(match_bk, axis=1), node_b).astype(jnp.int32)
    hit_b = hit_b + match_b.astype(jnp.int32)
    leaf_b = ~jnp.any(real_bk & (parent_bk == node_b[:, None]), axis=1)
    end_b = open_b & (~match_b | leaf_b)
    shadow = shadow.replace(tokens_bk=tokens_bk, parent_bk=parent_bk, len_b=jnp.where(end_b | ~live_b, 0, len_b),
                            hit_b=hit_b, node_b=node_b)
    return shadow, end_b


def plain_round(ctx: RoundContext, s: SpecState, draft: Draft | None = None, state_bt=None, *,
                follow_if: jax.Array | None = None) -> SpecState:
    """One sampled token per row; `draft` (None: no shadows) starts and advances the shadow drafts.

    A finished shadow updates a cheap drafter's average; it replaces a costly drafter's (a probe's
    measurement after a gap of plain rounds, when the old average says little). `state_bt` is unused
    (the signature matches `spec_round`, so either can follow `propose`). `follow_if` (a traced bool)
    runs the shadow's ops only when true: with no shadow open and no draft to start one they change
    nothing, and on XLA:CPU their dozens of small ops cost ~3% of a step.
    """
    row, pol, cnt = s.row, s.policy, s.counters
    live_b = ~row.done_b
    hidden_b1d, cache, taps = target_forward(ctx, row.last_b[:, None], row.pos_b[:, None], row.cache, row.pos_b)
    hidden_b1d = ctx.profile.head_input(hidden_b1d, row.steps)
    key, sub = jax.random.split(row.key)
    tok_b = loop.next_tokens(ctx.model, hidden_b1d, ctx.profile.live(row.steps), sub, ctx.sampling, ctx.temperature,
                             ctx.top_p, ctx.grammar, row.gram_b)
    row, tok_b = loop.closed(row, tok_b, ctx.max_new, ctx.eos_ids, ctx.grammar)
    if draft is not None:
        def follow(pol):
            shadow, shadow_end_b = advance_shadow(pol.shadow, draft, tok_b, live_b)
            weight = ctx.ema_weight if ctx.cheap else 1.0
            return pol.replace(shadow=shadow, accept_ema_b=ema(pol.accept_ema_b, shadow.hit_b, shadow_end_b, weight))

        # A conditional over the policy state alone (small: no cache among its operands).
        pol = follow(pol) if follow_if is None else jax.lax.cond(follow_if, follow, lambda pol: pol, pol)
    pol = pol.replace(plain_streak=pol.plain_streak + 1)
    live_i = live_b.astype(jnp.int32)
    cnt = cnt.replace(rounds_b=cnt.rounds_b + live_i, plain_rounds_b=cnt.plain_rounds_b + live_i)
    row = row.replace(cache=cache, key=key, steps=row.steps + 1)
    new_row = commit(ctx, row, tok_b[:, None], jnp.ones_like(row.count_b))
    return observe(ctx, row, SpecState(new_row, pol, cnt, s.draft), tok_b[:, None], (hidden_b1d, taps))
