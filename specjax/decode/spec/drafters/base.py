"""Drafters: proposals of the next tokens, checked later by one target forward.

A drafter is a static (hashable) object called inside the jitted speculative loop
(`spec/rounds.py`). Its learned weights, if any, travel separately as `draft_params`, a jit
argument (weights baked into the program as constants make compiles slow and programs huge).
Per row it may carry a `draft_state` pytree in the loop (a draft model's KV cache, EAGLE's
features). Three hooks:

  init(model, draft_params, prefill)  -> draft_state      after the target's prefill
  propose(model, draft_params, state, k) -> (Draft, draft_state)   once per round
  observe(model, draft_params, draft_state, obs) -> draft_state   after each round commits

`model` is the (merged) target, so self-speculative drafters can run its layers and head.
`observe` sees what the round committed together with the target's hidden states at those
positions (`Observation`): what EAGLE and Medusa heads draft from.

One class attribute, `cheap`, tells the adaptive policy (`spec/policy.py`, `Adaptive`) what a draft
costs. A cheap drafter (n-gram lookup: a few compares over the history) may propose in any round
without a forward, and plain rounds use such a draft as a "shadow" to keep its acceptance estimate
fresh (every round while its drafts look good, backing off to every `Adaptive.cheap_max_gap` rounds
while they do not: proposing is not free on XLA:CPU either). A
costly one (anything that runs a network: layer skip, a draft model, Medusa, EAGLE) proposes only
in speculative rounds, so a plain round costs what plain decoding does; its estimate is refreshed
by a probe round every `Adaptive.probe_every` plain rounds instead. `observe` runs after every
round either way, so a costly drafter's state never misses a committed token.

A `Draft` holds k token ids per row, how many are real proposals (0 means "no idea": the
row emits the target's own token this round), and optionally the draft distribution q each
token was sampled from. Deterministic drafters (n-gram lookup, top-k trees) return
q = None, which verification treats as a point mass on the token.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import jax
from flax import struct

from specjax.decode.backend import BackendProfile, profile_for
from specjax.decode.sampling import SamplingConfig


@struct.dataclass
class Draft:
    """k proposed tokens per row.

    Attributes:
      tokens_bk: proposed ids [B, k]; entries at or beyond len_b are placeholders (they are
        still run through the target, whose block shape is static, but never accepted).
      len_b: number of real proposals per row, 0..k.
      q_probs_bkv: draft distribution [B, k, V] the tokens were sampled from, or None for a
        deterministic draft (a point mass on each token).
      parent_bk: None for a chain; for a token tree (`tree.py`), node j's parent [B, k]: a node
        index < j, or -1 for the row's last committed token. Nodes j >= len_b are invalid. Siblings
        with sampled q must be independent draws (each from its own q row).
    """

    tokens_bk: jax.Array
    len_b: jax.Array
    q_probs_bkv: jax.Array | None = None
    parent_bk: jax.Array | None = None


@struct.dataclass
class Prefill:
    """What the target's prefill produced, for `Drafter.init`.

    Attributes:
      tokens_bt: right-padded prompts [B, T]; row b's prompt is tokens_bt[b, :len_b[b]].
      len_b: prompt lengths.
      hidden_btd: the target's final-normed hidden states over the prompts [B, T, D].
      first_b: the first generated token (sampled from hidden_btd[b, len_b[b] - 1]), at
        position len_b[b]; the first `Observation` continues from there.
      num_slots: cache slots of the target's KV cache (a drafter's own cache can match it).
      taps_btx: the outputs of the target blocks the drafter declares in `feature_layers` (EAGLE-3),
        concatenated [B, T, n·D]; None when it declares none.
    """

    tokens_bt: jax.Array
    len_b: jax.Array
    hidden_btd: jax.Array
    first_b: jax.Array
    num_slots: int = struct.field(pytree_node=False)
    taps_btx: jax.Array | None = None


@struct.dataclass
class Observation:
    """What one round committed, row by row, for `Drafter.observe`.

    Row b committed n_b[b] tokens, tokens_bt[b, :n_b[b]] at positions pos_b[b] + 1 + i.
    hidden_btd[b, i] is the target's final-normed hidden state at position pos_b[b] + i —
    the state whose next-token prediction produced tokens_bt[b, i] (entries past n_b are
    unspecified). Finished rows have n_b = 0. A plain round has T = 1.

    For a drafter that declares `observe_top_k = r > 0` (Token Recycling), a speculative round also
    shows the whole verified block: block_bt [B, k+1] (the row's last token, then the draft's nodes),
    the target's r most likely next tokens at each block row, block_top_btr [B, k+1, r] (best first,
    from the logits verification computed anyway), and block_len_b, the block rows that were real
    (1 + draft length; 0 for finished rows). Plain rounds and other drafters get None.

    taps_btx [B, T, n·D]: the outputs of the target blocks the drafter declares in `feature_layers`
    (EAGLE-3), at the same positions as hidden_btd; None when it declares none.
    """

    tokens_bt: jax.Array
    hidden_btd: jax.Array
    n_b: jax.Array
    pos_b: jax.Array
    block_bt: jax.Array | None = None
    block_top_btr: jax.Array | None = None
    block_len_b: jax.Array | None = None
    taps_btx: jax.Array | None = None


class Drafter(Protocol):
    """What the speculative loop needs from a drafter (hashable: it is a static jit argument).

    `propose` receives a `DraftView` of the loop state; a drafter may read
    `state.hist_bl` (token history: prompt then generated tokens, [B, L], entries past the
    row's length are stale), `state.hist_len_b` (tokens of history per row; the last one,
    `state.last_b` at position `state.pos_b`, is the token the next target forward starts
    from), `state.cache` (the target's KV cache, valid below pos_b) and its own
    `state.draft_state`, plus `state.key`, `state.steps` (the loop's PRNG key and round count) and
    `state.sampling` (the loop's token selection, `DraftSampling`).

    Attributes:
      cheap: whether `propose` costs next to nothing (class attribute; see the module doc). A
        drafter that does not declare it is treated as costly (`is_cheap`).
      feature_layers: optional; target blocks whose outputs `init` and `observe` need
        (`Prefill.taps_btx`, `Observation.taps_btx`), e.g. EAGLE-3's fused layers.
    """

    cheap: ClassVar[bool]

    def init(self, model, draft_params, prefill: Prefill) -> Any: ...

    def propose(self, model, draft_params, state, k: int) -> tuple[Draft, Any]: ...

    def observe(self, model, draft_params, draft_state, obs: Observation) -> Any: ...


def is_cheap(drafter) -> bool:
    """Whether the loop may run `drafter.propose` in every round (undeclared: False, the safe side —
    a costly drafter run every round would cost more than plain decoding)."""
    return bool(getattr(drafter, "cheap", False))


class StatelessDrafter:
    """Mixin for drafters that read only the loop state: no draft state, nothing to observe."""

    def init(self, model, draft_params, prefill: Prefill) -> Any:
        return ()

    def observe(self, model, draft_params, draft_state, obs: Observation) -> Any:
        return draft_state


@struct.dataclass
class DraftSampling:
    """The loop's token selection, as a drafter needs it: static kind, traced temperature / top-p.

    top_p is 1.0 (static: no nucleus sort) unless the loop's sampling filters by it, as in `sample`.
    """

    sampling: SamplingConfig = struct.field(pytree_node=False)
    temperature: jax.Array | float
    top_p: jax.Array | float

    @classmethod
    def of(cls, sampling: SamplingConfig, temperature, top_p) -> DraftSampling:
        """From the loop's settings; nucleus filtering only when the loop does it."""
        return cls(sampling, temperature, 1.0 if sampling.top_p >= 1.0 else top_p)


@struct.dataclass
class DraftView:
    """What `Drafter.propose` reads of the loop (built each round by `spec.rounds.propose`).

    Attributes:
      row: the loop's row state (`spec.state.SpecRow`: cache, token history, positions, key, steps).
      draft_state: the drafter's own carry.
      sampling: the loop's token selection (a sampling drafter filters its q like the target's p).
      profile: the backend's profile (a drafter reading the target's head uses its CPU tricks only there).
    """

    row: Any
    draft_state: Any
    sampling: DraftSampling
    profile: BackendProfile = struct.field(pytree_node=False, default_factory=profile_for)

    def __getattr__(self, name: str):
        # The row's fields a drafter reads (see `Drafter`), without copying them into the view.
        if name in _ROW_FIELDS:
            return getattr(self.row, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_ROW_FIELDS = frozenset({"cache", "hist_bl", "hist_len_b", "last_b", "pos_b", "count_b", "key", "steps"})
