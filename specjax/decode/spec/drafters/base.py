"""Drafters: proposals of the next tokens, checked later by one target forward.

A drafter is a static (hashable) object called inside the jitted speculative loop
(`speculative.py`). Its learned weights, if any, travel separately as `draft_params`, a jit
argument (weights baked into the program as constants make compiles slow and programs huge).
Per row it may carry a `draft_state` pytree in the loop (a draft model's KV cache, EAGLE's
features). Three hooks:

  init(model, draft_params, prefill)  -> draft_state      after the target's prefill
  propose(model, draft_params, state, k) -> (Draft, draft_state)   once per round
  observe(model, draft_params, draft_state, obs) -> draft_state   after each round commits

`model` is the (merged) target, so self-speculative drafters can run its layers and head.
`observe` sees what the round committed together with the target's hidden states at those
positions (`Observation`): what EAGLE and Medusa heads draft from.

One class attribute, `cheap`, tells the adaptive policy (`spec_rounds.Adaptive`) what a draft
costs. A cheap drafter (n-gram lookup: a few compares over the history) proposes every round,
and plain rounds use that free draft as a "shadow" to keep its acceptance estimate fresh. A
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

import dataclasses
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
from flax import struct


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
    """

    tokens_bt: jax.Array
    len_b: jax.Array
    hidden_btd: jax.Array
    first_b: jax.Array
    num_slots: int = struct.field(pytree_node=False)


@struct.dataclass
class Observation:
    """What one round committed, row by row, for `Drafter.observe`.

    Row b committed n_b[b] tokens, tokens_bt[b, :n_b[b]] at positions pos_b[b] + 1 + i.
    hidden_btd[b, i] is the target's final-normed hidden state at position pos_b[b] + i —
    the state whose next-token prediction produced tokens_bt[b, i] (entries past n_b are
    unspecified). Finished rows have n_b = 0. A plain round has T = 1.
    """

    tokens_bt: jax.Array
    hidden_btd: jax.Array
    n_b: jax.Array
    pos_b: jax.Array


class Drafter(Protocol):
    """What the speculative loop needs from a drafter (hashable: it is a static jit argument).

    `propose` receives the loop state (`spec_rounds.SpecState`); a drafter may read
    `state.hist_bl` (token history: prompt then generated tokens, [B, L], entries past the
    row's length are stale), `state.hist_len_b` (tokens of history per row; the last one,
    `state.last_b` at position `state.pos_b`, is the token the next target forward starts
    from), `state.cache` (the target's KV cache, valid below pos_b) and its own
    `state.draft_state`.

    Attributes:
      cheap: whether `propose` costs next to nothing (class attribute; see the module doc). A
        drafter that does not declare it is treated as costly (`is_cheap`).
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


@dataclasses.dataclass(frozen=True)
class NgramDrafter(StatelessDrafter):
    """Prompt lookup: continue the most recent earlier occurrence of the history's tail.

    Attributes:
      max_ngram: longest tail tried first; shorter tails down to min_ngram are fallbacks
        (a longer match is a more specific context, so it is preferred over a more recent
        shorter one).
      min_ngram: shortest tail that counts as a match.
    """

    cheap: ClassVar[bool] = True  # compares over the history: proposing in every round is free

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")

    def propose(self, model, draft_params, state, k: int) -> tuple[Draft, Any]:
        return ngram_propose(state.hist_bl, state.hist_len_b, k, self.max_ngram, self.min_ngram), state.draft_state


def _last_match_end(hist_bl: jax.Array, len_b: jax.Array, n: int) -> jax.Array:
    """Index j of the last token of the latest earlier occurrence of each row's last n tokens.

    "Earlier" means j <= len - 2, so at least one known token follows the occurrence. -1
    where there is none.
    """
    width = hist_bl.shape[1]
    j_l = jnp.arange(width)
    tail_idx_bn = jnp.clip(len_b[:, None] - n + jnp.arange(n), 0, width - 1)
    tail_bn = jnp.take_along_axis(hist_bl, tail_idx_bn, axis=1)
    # Candidate ends j in [n-1, len-2]; the range is empty unless len >= n + 1, which also
    # keeps the (clipped) tail read above from mattering for too-short histories.
    match_bl = (j_l[None, :] >= n - 1) & (j_l[None, :] <= len_b[:, None] - 2)
    for m in range(n):
        # hist[j - m] must equal the tail's m-th token from the end: compare the history
        # shifted right by m against one tail token (a static loop of n full-width compares).
        shifted_bl = jnp.pad(hist_bl, ((0, 0), (m, 0)))[:, :width]
        match_bl = match_bl & (shifted_bl == tail_bn[:, n - 1 - m : n - m])
    return jnp.max(jnp.where(match_bl, j_l[None, :], -1), axis=1)


def ngram_propose(hist_bl: jax.Array, len_b: jax.Array, k: int, max_ngram: int = 3, min_ngram: int = 1) -> Draft:
    """Prompt-lookup draft of k tokens per row, vectorised over the batch and the history.

    For n = max_ngram … min_ngram, the first n whose tail hist[len-n:len] occurred earlier
    wins, at its most recent occurrence ending at j; the draft is the tokens that followed,
    hist[j+1], hist[j+2], …. When the continuation runs into the present (j + k >= len) the
    match says the text is periodic with period len-1-j, so the draft keeps cycling through
    hist[j+1 : len] — e.g. "abcab" drafts "cabca", which is what repetitive text does next.

    Args:
      hist_bl: token history [B, L]; only hist[b, :len_b[b]] is read.
      len_b: history length per row (>= 1).
      k: tokens to propose (static).

    Returns:
      Draft with len_b = k where a tail matched, else 0 (tokens then repeat the last token).
    """
    width = hist_bl.shape[1]
    found_b = jnp.zeros(len_b.shape, bool)
    end_b = jnp.zeros(len_b.shape, jnp.int32)
    for n in range(max_ngram, min_ngram - 1, -1):
        j_b = _last_match_end(hist_bl, len_b, n)
        take_b = (j_b >= 0) & ~found_b
        end_b = jnp.where(take_b, j_b, end_b)
        found_b = found_b | take_b
    period_b = jnp.maximum(len_b - 1 - end_b, 1)
    idx_bk = end_b[:, None] + 1 + jnp.arange(k)[None, :] % period_b[:, None]
    tokens_bk = jnp.take_along_axis(hist_bl, jnp.clip(idx_bk, 0, width - 1), axis=1)
    last_b1 = jnp.take_along_axis(hist_bl, jnp.clip(len_b - 1, 0, width - 1)[:, None], axis=1)
    tokens_bk = jnp.where(found_b[:, None], tokens_bk, last_b1)
    return Draft(tokens_bk=tokens_bk.astype(jnp.int32), len_b=jnp.where(found_b, k, 0).astype(jnp.int32))
