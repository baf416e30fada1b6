"""Prompt/output lookup trees: several continuations of the history's tail per round, merged as a trie.

The chain n-gram drafter (`ngram.py`) bets on one earlier occurrence of the row's last n tokens: the
latest one of the longest matching tail. When the text has repeated a phrase with different
continuations ("the function returns …" three times, each time followed by something else), the one
it picks is often the wrong one. This drafter takes up to `branches` occurrences at once — ranked by
tail length, then recency — reads `depth` tokens after each (cycling through the present when an
occurrence reaches it, as the chain drafter does), and merges the continuations into a trie: shared
prefixes become one path, and every point where they part becomes a branch. The target verifies the
whole trie in one forward (`rounds.verify_tree`); the longest continuation it agrees with wins.

Static shapes: branches × depth candidate nodes, chain-major (continuation 0's nodes first, then what
continuation 1 adds, …), compacted to k nodes with the duplicates and missing occurrences dropped
(`trees.compact`). Continuation 0 is exactly the chain drafter's draft (with max_ngram / min_ngram), so
the trie never holds less than the chain when k >= depth.

Drafts are deterministic (q = None): lossless under sampling by the point-mass rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax.decode.spec import trees as tree_lib
from specjax.decode.spec.drafters.base import Draft, StatelessDrafter
from specjax.decode.spec.drafters.ngram import match_ends


def ranked_match_ends(hist_bl: jax.Array, len_b: jax.Array, branches: int, max_ngram: int,
                      min_ngram: int) -> tuple[jax.Array, jax.Array]:
    """The `branches` best earlier occurrences of each row's tail: longest tail first, then most recent.

    Returns:
      (end_bc, found_bc): the index of each occurrence's last token, and whether there is one (an
      occurrence of a shorter tail that also matches a longer one counts once, with the longer).
    """
    width = hist_bl.shape[1]
    j_l = jnp.arange(width)
    score_bl = jnp.full(hist_bl.shape, -1, jnp.int32)
    for n in range(min_ngram, max_ngram + 1):  # longer tails overwrite: they score higher
        score_bl = jnp.where(match_ends(hist_bl, len_b, n), n * (width + 1) + j_l[None, :], score_bl)
    score_bc, _ = jax.lax.top_k(score_bl, branches)
    found_bc = score_bc >= 0
    end_bc = jnp.where(found_bc, score_bc % (width + 1), 0)
    return end_bc.astype(jnp.int32), found_bc


def continuations(hist_bl: jax.Array, len_b: jax.Array, end_bc: jax.Array, depth: int) -> jax.Array:
    """[B, C, depth] tokens after each occurrence; an occurrence that runs into the present keeps cycling
    through its period (len - 1 - end), as in `ngram.ngram_propose`."""
    width = hist_bl.shape[1]
    period_bc = jnp.maximum(len_b[:, None] - 1 - end_bc, 1)
    idx_bcd = end_bc[..., None] + 1 + jnp.arange(depth)[None, None, :] % period_bc[..., None]
    b, c = end_bc.shape
    flat = jnp.take_along_axis(hist_bl, jnp.clip(idx_bcd, 0, width - 1).reshape(b, c * depth), axis=1)
    return flat.reshape(b, c, depth)


def trie(cont_bcd: jax.Array, found_bc: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Continuations merged into a trie of C·D candidate nodes (node c·D + d: continuation c at depth d + 1).

    A node is kept when no earlier continuation shares its prefix up to and including it (it would be a
    duplicate of that continuation's node); its parent is the node of the first continuation sharing the
    prefix above it. Parents therefore precede children (chain-major order is topological).

    Returns:
      (tokens_bn, parent_bn, valid_bn) with n = C·D.
    """
    b, c, d = cont_bcd.shape
    same_bccd = (cont_bcd[:, :, None, :] == cont_bcd[:, None, :, :]) & found_bc[:, None, :, None]
    prefix_bccd = jnp.cumprod(same_bccd.astype(jnp.int32), axis=3) > 0  # [b, c, c', d]: c' shares c's prefix
    # The first continuation sharing the prefix (c itself when none before it does, if c was found).
    first_bcd = jnp.argmax(prefix_bccd, axis=2).astype(jnp.int32)
    own_bcd = first_bcd == jnp.arange(c)[None, :, None]
    valid_bcd = own_bcd & found_bc[:, :, None]
    parent_bcd = jnp.concatenate([jnp.full((b, c, 1), -1, jnp.int32),
                                  first_bcd[:, :, :-1] * d + jnp.arange(d - 1)[None, None, :]], axis=2)
    return cont_bcd.reshape(b, c * d), parent_bcd.reshape(b, c * d), valid_bcd.reshape(b, c * d)


@dataclasses.dataclass(frozen=True)
class LookupTreeDrafter(StatelessDrafter):
    """Multi-candidate prompt/output lookup (hashable: a static jit argument; no weights, no state).

    Attributes:
      branches: occurrences (continuations) merged per round.
      depth: tokens read after each occurrence (a round accepts at most min(depth, k)).
      max_ngram, min_ngram: tail lengths that count as a match (as `NgramDrafter`).
    """

    cheap: ClassVar[bool] = True  # compares over the history: drafts every round

    branches: int = 4
    depth: int = 8
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if self.branches < 1 or self.depth < 1:
            raise ValueError(f"need branches >= 1 and depth >= 1, got {self.branches}, {self.depth}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")

    def max_accept(self, k: int) -> int:
        return min(self.depth, k)

    def propose(self, model, draft_params, state, k: int) -> tuple[Draft, Any]:
        return lookup_tree_propose(state.hist_bl, state.hist_len_b, k, self.branches, self.depth, self.max_ngram,
                                   self.min_ngram), state.draft_state


def lookup_tree_propose(hist_bl: jax.Array, len_b: jax.Array, k: int, branches: int = 4, depth: int = 8,
                        max_ngram: int = 3, min_ngram: int = 1) -> Draft:
    """A k-node lookup trie per row (`LookupTreeDrafter`); len_b = 0 where the tail occurred nowhere before."""
    branches = min(branches, hist_bl.shape[1])
    end_bc, found_bc = ranked_match_ends(hist_bl, len_b, branches, max_ngram, min_ngram)
    tokens_bn, parent_bn, valid_bn = trie(continuations(hist_bl, len_b, end_bc, depth), found_bc)
    tokens_bk, parent_bk, n_b = tree_lib.compact(tokens_bn, parent_bn, valid_bn, k)
    return Draft(tokens_bk=tokens_bk, len_b=n_b, parent_bk=parent_bk)
