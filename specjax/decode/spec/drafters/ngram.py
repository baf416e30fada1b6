"""The n-gram (prompt lookup) drafter: continue the latest earlier occurrence of the history's tail.

It reads the token history only, so proposing costs a few compares (`cheap`: it drafts every round).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax.decode.spec.drafters.base import Draft, StatelessDrafter


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
    j_l = jnp.arange(hist_bl.shape[1])
    return jnp.max(jnp.where(match_ends(hist_bl, len_b, n), j_l[None, :], -1), axis=1)


def match_ends(hist_bl: jax.Array, len_b: jax.Array, n: int) -> jax.Array:
    """match_bl[b, j]: an earlier occurrence of row b's last n tokens ends at j (j <= len - 2)."""
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
    return match_bl


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
