"""Medusa drafter: the heads' top-k tokens at the last accepted position, expanded into a static tree.

Per row the draft state is one feature: f_{P-1}, the target's final-normed hidden state that
predicted the last committed token x_P (`Observation.hidden_btd[n_b - 1]`; after the prefill, the
prompt's last hidden state). Head i on it predicts x_{P+1+i} (`models/medusa.py`), so a node at
depth d of the tree takes rank r = path[-1] of head d-1's distribution (`tree.StaticTree.gather`).
The tree is static (from a config: e.g. `tree.MEDUSA_63`, or `tree_from_accuracies` for measured
heads); SpecConfig.k must equal its node count. Drafts are deterministic (q = None).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from specjax.decode.spec import cost
from specjax.decode.spec.drafters.base import Draft, Observation, Prefill
from specjax.decode.spec.drafters.heads import HeadParams, output_head, vocab_head
from specjax.decode.spec.trees import StaticTree, TreeError
from specjax.models.layers import top_k
from specjax.models.medusa import MedusaHeads


class MedusaDrafterError(ValueError):
    """Medusa drafter settings that do not fit the heads or the loop."""


@struct.dataclass
class MedusaState:
    """Draft state: the target feature f_{P-1} of each row [B, D]."""

    feat_bd: jax.Array


@dataclasses.dataclass(frozen=True)
class MedusaDrafter:
    """Static-tree Medusa drafter (hashable: a jit argument); weights go in `HeadParams`.

    Attributes:
      graphdef: `nnx.split(medusa_heads)[0]`.
      tree: the static tree; its depth must not exceed the number of heads.
      n_heads: heads in the module (checked against the tree's depth).
    """

    cheap: ClassVar[bool] = False  # one vocabulary-wide head product per Medusa head

    graphdef: Any
    tree: StaticTree
    n_heads: int

    def __post_init__(self) -> None:
        if self.tree.max_depth > self.n_heads:
            raise MedusaDrafterError(f"the tree is {self.tree.max_depth} deep but there are only "
                                     f"{self.n_heads} Medusa heads (depth d uses head d-1)")

    @classmethod
    def build(cls, heads: MedusaHeads, model, tree: StaticTree, vocab=None):
        """(drafter, draft_params) for Medusa heads on `model`, optionally over a `DraftVocab`."""
        graphdef, weights = nnx.split(heads)
        table = None if vocab is None else vocab_head(model, vocab)
        return cls(graphdef, tree, heads.cfg.n_heads), HeadParams(weights=weights, vocab=table)

    def init(self, model, draft_params: HeadParams, prefill: Prefill) -> MedusaState:
        """The prompt's last hidden state (it predicted the first generated token)."""
        b = prefill.len_b.shape[0]
        return MedusaState(feat_bd=prefill.hidden_btd[jnp.arange(b), prefill.len_b - 1])

    def observe(self, model, draft_params: HeadParams, draft_state: MedusaState, obs: Observation) -> MedusaState:
        """Keeps the hidden state that predicted each row's last committed token."""
        b = obs.n_b.shape[0]
        last_bd = obs.hidden_btd[jnp.arange(b), jnp.maximum(obs.n_b - 1, 0)]
        return MedusaState(feat_bd=jnp.where((obs.n_b > 0)[:, None], last_bd, draft_state.feat_bd))

    def max_accept(self, k: int) -> int:
        """A round accepts at most one path: the tree's depth."""
        return self.tree.max_depth

    def draft_cost(self, model, draft_params: HeadParams, k: int) -> float:
        """One pass of every head's residual blocks and one head product (the heads share the table's
        read), in target steps (`draft_cost`); the tree's k nodes are picked from those logits."""
        read = cost.nbytes(draft_params.weights) + cost.head_bytes(model, draft_params.vocab)
        return cost.step_fraction(model, read)

    def propose(self, model, draft_params: HeadParams, state, k: int) -> tuple[Draft, MedusaState]:
        """The static tree filled with each head's top-k tokens."""
        if k != self.tree.size:
            raise MedusaDrafterError(f"SpecConfig.k={k} must equal the Medusa tree's node count {self.tree.size}")
        heads: MedusaHeads = nnx.merge(self.graphdef, draft_params.weights)
        table = output_head(model, draft_params)
        ds: MedusaState = state.draft_state
        depth = self.tree.max_depth
        feat_bhd = heads(ds.feat_bd)[:, :depth]
        if self.tree.max_rank > table.size:
            raise MedusaDrafterError(f"the tree uses rank {self.tree.max_rank - 1} but the draft vocabulary has "
                                     f"only {table.size} tokens")
        _, top_bhr = top_k(table.logits(feat_bhd), self.tree.max_rank)
        tokens_bk = table.to_target(self.tree.gather(top_bhr))
        b = tokens_bk.shape[0]
        draft = Draft(tokens_bk=tokens_bk, len_b=jnp.full((b,), k, jnp.int32), parent_bk=self.tree.parent_bk(b))
        return draft, ds


def tree_from_accuracies(acc_hr: np.ndarray, size: int) -> StaticTree:
    """The `size`-node tree that maximises the expected number of accepted tokens (Medusa §3.1.2).

    Assuming heads err independently, a path (r_1 … r_d) is accepted with probability
    prod_i acc[i, r_i], and the expected accepted length is the sum of that over the tree's nodes.
    Because adding a child never beats its parent (acc <= 1), taking nodes greedily best-first
    from the root's children yields the optimal prefix-closed tree.

    Args:
      acc_hr: acc_hr[h, r] = measured probability that head h's rank-r token is the right one.
      size: nodes in the tree.
    """
    acc_hr = np.asarray(acc_hr, np.float64)
    if acc_hr.ndim != 2 or np.any(acc_hr < 0) or np.any(acc_hr > 1):
        raise TreeError(f"head accuracies must be a [heads, ranks] table of probabilities, got shape {acc_hr.shape}")
    n_heads, n_ranks = acc_hr.shape
    if size < 1:
        raise TreeError(f"tree size must be positive, got {size}")
    heap = [(-acc_hr[0, r], (r,)) for r in range(n_ranks)]
    heapq.heapify(heap)
    paths = []
    while heap and len(paths) < size:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        if len(path) < n_heads:
            for r in range(n_ranks):
                heapq.heappush(heap, (neg * acc_hr[len(path), r], (*path, r)))
    if len(paths) < size:
        raise TreeError(f"{n_heads} heads × {n_ranks} ranks allow at most {len(paths)} nodes, asked for {size}")
    return StaticTree.from_paths(paths)
