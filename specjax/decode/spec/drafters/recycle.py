"""Token Recycling (Luo et al. 2024): draft a token tree from the target's own past top-k predictions.

Every verify forward computes the target's distribution at each block row, and all but the accepted
path's argmax used to be thrown away. Token Recycling keeps them: an adjacency table [V, r] holds, for
each token x, the r tokens the target ranked highest the last time it predicted what follows x. A
round's draft is a static tree template expanded breadth-first from the row's last token through
the table: a node with path (r_1 … r_d) carries table[table[…table[last, r_1]…], r_d]. The table is
updated after every speculative round from the top-r the verification produced at all its block rows
(the root and every node, accepted or not: each is a real context the target just ranked), so drafting
costs a few gathers and learning costs one top-r over logits already computed — no extra forward.

Plain rounds (the adaptive policy's) compute no block top-r; there the committed pair (previous token
→ new token) moves to the front of the previous token's entry, and the prompt's own pairs seed the
table at the prefill. Entries nobody has filled are -1; tree nodes under an empty entry are dropped
(`trees.compact`), so a row with nothing to recycle drafts nothing.

The table is shared by the batch's rows (the paper keeps one table across queries too): every row
drafts its own tree from its own last token, and every row's verification teaches all rows. It is
part of the drafter's carry (`RecycleState`), updated in place inside the jitted loop.

Drafts are deterministic (q = None): lossless under sampling by the point-mass rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decode.spec import trees as tree_lib
from specjax.decode.spec.drafters.base import Draft, Observation, Prefill
from specjax.decode.spec.trees import StaticTree

EMPTY = -1
# Assumed chance that a token's rank-r recycled successor is right (rank 0 first), the same at every depth:
# the template is the best-first tree under it (`template`), so only the order of paths it implies matters —
# deep along rank 0, a few alternatives near the root (the paper's template has the same shape, at 80 nodes).
RANK_PRIOR = (0.6, 0.15, 0.06, 0.04, 0.03, 0.02, 0.015, 0.01)
MAX_TEMPLATE_DEPTH = 8


def template(k: int, width: int, max_depth: int = MAX_TEMPLATE_DEPTH) -> StaticTree:
    """The k-node tree template: best-first under `RANK_PRIOR` restricted to ranks < width (Medusa's rule).

    Raises:
      TreeError: when k nodes do not fit (width ranks, max_depth levels).
    """
    prior = RANK_PRIOR[:width] + (RANK_PRIOR[-1],) * max(0, width - len(RANK_PRIOR))
    return StaticTree.from_accuracies([prior] * max_depth, k)


@struct.dataclass
class RecycleState:
    """Draft state: the shared successor table [V, r] and each row's latest committed token [B]."""

    table_vr: jax.Array
    last_b: jax.Array


def empty_table(vocab: int, width: int) -> jax.Array:
    """A table with no successors yet."""
    return jnp.full((vocab, width), EMPTY, jnp.int32)


def update_table(table_vr: jax.Array, tokens_bt: jax.Array, top_btr: jax.Array, len_b: jax.Array) -> jax.Array:
    """Table rows of the first len_b[b] tokens of each row replaced by the target's top-r after them.

    Args:
      table_vr: the table [V, r].
      tokens_bt: tokens whose successors were ranked (a verified block: last token, then the nodes).
      top_btr: the target's r best next tokens after each of them, best first.
      len_b: how many of each row's tokens count (the rest are padding).

    A token seen twice in one call keeps one of its rankings (each is the target's, in some context; which
    one is up to XLA's scatter).
    """
    v = table_vr.shape[0]
    t = tokens_bt.shape[1]
    idx_bt = jnp.where(jnp.arange(t)[None, :] < len_b[:, None], tokens_bt, v)  # v: dropped
    return table_vr.at[idx_bt.reshape(-1)].set(top_btr.reshape(-1, top_btr.shape[-1]).astype(jnp.int32),
                                                mode="drop")


def insert_successor(table_vr: jax.Array, prev_b: jax.Array, next_b: jax.Array, valid_b: jax.Array) -> jax.Array:
    """Moves next_b to the front of table[prev_b] (an already listed token is moved, not repeated; the
    entry's last token falls off when it is new). Rows with valid_b False change nothing."""
    v, r = table_vr.shape
    row_br = table_vr[jnp.clip(prev_b, 0, v - 1)]
    keep_br = row_br != next_b[:, None]
    # The kept entries in order, then the removed one's slot (stable: keeps the ranking of the rest).
    order_br = jnp.argsort(~keep_br, axis=1, stable=True)
    rest_br = jnp.where(jnp.take_along_axis(keep_br, order_br, axis=1), jnp.take_along_axis(row_br, order_br, axis=1),
                        EMPTY)
    new_br = jnp.concatenate([next_b[:, None].astype(jnp.int32), rest_br[:, :r - 1]], axis=1)
    return table_vr.at[jnp.where(valid_b, prev_b, v)].set(new_br, mode="drop")


def insert_committed(table_vr: jax.Array, prev_b: jax.Array, tokens_bt: jax.Array, n_b: jax.Array) -> jax.Array:
    """`insert_successor` for each committed pair: prev → tokens[0], tokens[0] → tokens[1], … (n_b tokens)."""
    for i in range(tokens_bt.shape[1]):
        before_b = prev_b if i == 0 else tokens_bt[:, i - 1]
        table_vr = insert_successor(table_vr, before_b, tokens_bt[:, i], i < n_b)
    return table_vr


def seed_from_prompts(table_vr: jax.Array, tokens_bt: jax.Array, len_b: jax.Array) -> jax.Array:
    """Each prompt pair x_t → x_{t+1} as rank 0 of table[x_t]: what follows a token in the prompt is a
    likely first guess of what follows it in the answer (prompt lookup's bet). Of a token's pairs the
    latest wins (a later row's over an earlier row's)."""
    t = tokens_bt.shape[1]
    if t < 2:
        return table_vr
    v = table_vr.shape[0]
    pair_bt = jnp.arange(t - 1)[None, :] < (len_b[:, None] - 1)
    from_n = jnp.where(pair_bt, tokens_bt[:, :-1], v).reshape(-1)
    # A scatter with repeated indices keeps an unspecified one: write only each token's last pair
    # (found by a scatter-max of the flat pair index, which is order-free).
    flat_n = jnp.arange(from_n.shape[0], dtype=jnp.int32)
    last_v = jnp.full((v,), -1, jnp.int32).at[from_n].max(flat_n, mode="drop")
    keep_n = (from_n < v) & (last_v[jnp.clip(from_n, 0, v - 1)] == flat_n)
    return table_vr.at[jnp.where(keep_n, from_n, v), 0].set(tokens_bt[:, 1:].reshape(-1).astype(jnp.int32),
                                                          mode="drop")


def expand(table_vr: jax.Array, root_b: jax.Array, tree: StaticTree) -> tuple[jax.Array, jax.Array]:
    """The template filled breadth-first through the table from each row's root token.

    Returns:
      (tokens_bk, valid_bk): node j's token and whether its table entry was filled (an empty entry, or
      one under an invalid parent, makes an invalid node).
    """
    b, k = root_b.shape[0], tree.size
    parents, ranks, depths = tree.parents, tree.ranks, tree.depths
    tokens_bk = jnp.zeros((b, k), jnp.int32)
    valid_bk = jnp.zeros((b, k), bool)
    v = table_vr.shape[0]
    for d in range(1, tree.max_depth + 1):
        nodes = [j for j in range(k) if depths[j] == d]
        par = parents[nodes]
        if d == 1:
            from_bn, ok_bn = jnp.repeat(root_b[:, None], len(nodes), axis=1), jnp.ones((b, len(nodes)), bool)
        else:
            from_bn, ok_bn = tokens_bk[:, par], valid_bk[:, par]
        tok_bn = table_vr[jnp.clip(from_bn, 0, v - 1), ranks[nodes][None, :]]
        tokens_bk = tokens_bk.at[:, nodes].set(jnp.maximum(tok_bn, 0))
        valid_bk = valid_bk.at[:, nodes].set(ok_bn & (tok_bn >= 0))
    return tokens_bk, valid_bk


@dataclasses.dataclass(frozen=True)
class RecycleDrafter:
    """Token Recycling (hashable: a static jit argument; no weights).

    Attributes:
      tree: the static template (`template(k, width)`); SpecConfig.k must equal its node count.
      width: successors kept per token (r); the verification computes the target's top-r per block row.
    """

    cheap: ClassVar[bool] = True  # a few gathers from the table: drafts every round, shadows plain rounds

    tree: StaticTree
    width: int = 8

    @classmethod
    def create(cls, k: int, width: int = 8) -> RecycleDrafter:
        """The drafter with the k-node best-first template over ranks < width."""
        return cls(template(k, width), width)

    @property
    def observe_top_k(self) -> int:
        """The target's top-r per verified block row, for `update_table` (`rounds.verify_target`)."""
        return self.width

    def max_accept(self, k: int) -> int:
        return self.tree.max_depth

    def init(self, model, draft_params, prefill: Prefill) -> RecycleState:
        table = seed_from_prompts(empty_table(model.cfg.vocab_size, self.width), prefill.tokens_bt, prefill.len_b)
        return RecycleState(table_vr=table, last_b=prefill.first_b.astype(jnp.int32))

    def propose(self, model, draft_params, state, k: int) -> tuple[Draft, Any]:
        if k != self.tree.size:
            raise ValueError(f"SpecConfig.k={k} must equal the recycling template's node count {self.tree.size}")
        ds: RecycleState = state.draft_state
        tokens_bk, valid_bk = expand(ds.table_vr, state.last_b, self.tree)
        b = tokens_bk.shape[0]
        tokens_bk, parent_bk, len_b = tree_lib.compact(tokens_bk, self.tree.parent_bk(b), valid_bk, k)
        return Draft(tokens_bk=tokens_bk, len_b=len_b, parent_bk=parent_bk), ds

    def observe(self, model, draft_params, draft_state: RecycleState, obs: Observation) -> RecycleState:
        table = draft_state.table_vr
        if obs.block_top_btr is not None:
            table = update_table(table, obs.block_bt, obs.block_top_btr, obs.block_len_b)
        else:
            table = insert_committed(table, draft_state.last_b, obs.tokens_bt, obs.n_b)
        b = obs.n_b.shape[0]
        last_b = jnp.where(obs.n_b > 0, obs.tokens_bt[jnp.arange(b), jnp.maximum(obs.n_b - 1, 0)], draft_state.last_b)
        return RecycleState(table_vr=table, last_b=last_b.astype(jnp.int32))
