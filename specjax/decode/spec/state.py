"""The speculative loop's carry: `SpecState(row, policy, counters, draft)`, four small pytrees.

* `SpecRow` — what decoding itself needs per row (`loop.RowState` plus the token history and the
  latest token): what `commit` updates, and what a drafter reads through `DraftView`.
* `PolicyState` — the adaptive policy's memory (`policy.py`): the drafts' moving average, the plain
  streak and probe gap, and the shadow draft (`Shadow`) plain rounds follow.
* `Counters` — statistics only (the driver's `SpecStats`); nothing in the loop reads them.
* `draft` — the drafter's own carry (`Drafter.init` / `propose` / `observe`), () for stateless drafters.

The loop's settings (sampling, temperature, top-p, limits, grammar) are not carried: they are
arguments of the program, held by the round context (`rounds.RoundContext`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.decode import loop


@struct.dataclass(kw_only=True)
class SpecRow(loop.RowState):
    """`loop.RowState` plus: last_b, each row's latest token, at position pos_b (its keys/values are not
    in the cache yet: the next round's block starts with it); hist_bl[b, :pos_b + 1] is the row's whole
    text (prompt, then generated)."""

    hist_bl: jax.Array
    last_b: jax.Array

    @property
    def hist_len_b(self) -> jax.Array:
        return self.pos_b + 1


@struct.dataclass
class Shadow:
    """The draft plain rounds follow (a cheap drafter's latest, or a costly drafter's probe).

    tokens_bk with parents parent_bk (a chain's are -1, 0, 1, …), of which len_b tokens are real
    (0: no shadow); hit_b of them matched the committed text so far, down to node node_b (-1: none yet).
    """

    tokens_bk: jax.Array
    parent_bk: jax.Array
    len_b: jax.Array
    hit_b: jax.Array
    node_b: jax.Array

    @classmethod
    def empty(cls, b: int, k: int) -> Shadow:
        z_b = jnp.zeros((b,), jnp.int32)
        return cls(tokens_bk=jnp.zeros((b, k), jnp.int32), parent_bk=jnp.zeros((b, k), jnp.int32), len_b=z_b,
                   hit_b=z_b, node_b=jnp.full((b,), -1, jnp.int32))


@struct.dataclass
class PolicyState:
    """The adaptive policy's carry: accept_ema_b (moving average of accepted draft tokens per round);
    plain_streak, the batch's plain rounds since its last speculative round or probe; probe_gap, the
    streak at which the drafter probes next (`policy.py`); the shadow draft."""

    accept_ema_b: jax.Array
    plain_streak: jax.Array
    probe_gap: jax.Array
    shadow: Shadow


@struct.dataclass
class Counters:
    """Statistics: rounds_b counts target forwards in which the row was live, plain_rounds_b those that
    were plain one-token rounds; drafted_bk / accepted_bk count, per draft position (per depth for token
    trees), the speculative rounds that proposed / accepted a token there; draft_tokens_b sums the real
    draft tokens (tree nodes) verified."""

    rounds_b: jax.Array
    plain_rounds_b: jax.Array
    drafted_bk: jax.Array
    accepted_bk: jax.Array
    draft_tokens_b: jax.Array

    @classmethod
    def zeros(cls, b: int, k: int) -> Counters:
        z_b, z_bk = jnp.zeros((b,), jnp.int32), jnp.zeros((b, k), jnp.int32)
        return cls(rounds_b=z_b, plain_rounds_b=z_b, drafted_bk=z_bk, accepted_bk=z_bk, draft_tokens_b=z_b)


@struct.dataclass
class SpecState:
    """The speculative loop's carry (see the module doc)."""

    row: SpecRow
    policy: PolicyState
    counters: Counters
    draft: Any = ()

    @property
    def done_b(self) -> jax.Array:
        return self.row.done_b

    @property
    def running(self) -> jax.Array:
        """Whether any row is still generating (the loops' condition)."""
        return ~jnp.all(self.row.done_b)
