"""EAGLE drafter: an EAGLE head run autoregressively over features, grown into an EAGLE-2 dynamic tree.

Alignment (`models/eagle.py`): the head's pair at position t is (feature f_t, token x_{t+1}); its
output ĝ_{t+1} predicts x_{t+2}. Its KV cache holds, at slot t, the pair of position t.

Per row, with the last committed token x_P at position P (not yet run through the target):

  * committed pairs 0 … P-1 are in the head's cache, built from the TARGET's features (`init` over
    the prompt, `observe` over each round's committed tokens, whose `Observation.hidden_btd[i]` is
    exactly f at the position before token i); the last of them, (f_{P-1}, x_P), gave the root
    feature ĝ_P, kept in the draft state;
  * `propose` drafts from ĝ_P: depth 1 is the top-K of head(ĝ_P); each further depth runs the K
    frontier nodes through the head as one block — pair (parent's ĝ, node token) at position
    P + depth - 1, written at the tree slots P + (depth-1)·K + f, attending to the committed slots
    and its own ancestors only (`dynamic_tree.slot_mask`) — and adds their top-K children to the
    pool; the best `k` pool entries form the tree (`dynamic_tree`);
  * `observe` overwrites slots P … with the committed pairs (so the tree's temporary entries are
    replaced by the target's true features) and takes the last output as the next root feature.

An EAGLE-3 head (`EagleConfig.fuse_layers`) reads, at committed positions, the fusion of the target's
tapped layers instead of f (`EagleHead.committed_features`); the drafter declares those layers in
`feature_layers`, so the loop hands their outputs over (`Prefill.taps_btx`, `Observation.taps_btx`).

Drafts are deterministic (top-k), so q = None: verification treats each node as a point mass,
which keeps tree sampling lossless with any weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.decode.spec import cost
from specjax.decode.spec.drafters import dynamic_tree as dt
from specjax.decode.spec.drafters.base import Draft, Observation, Prefill
from specjax.decode.spec.drafters.heads import HeadParams, output_head, vocab_head
from specjax.decode.spec.trees import confident_length
from specjax.models.eagle import EagleHead
from specjax.models.kv_cache import KVCache


class EagleDrafterError(ValueError):
    """Invalid EAGLE drafter settings."""


@struct.dataclass
class EagleState:
    """Draft state: the head's KV cache and the root feature ĝ_P [B, D] of each row."""

    cache: KVCache
    root_feat_bd: jax.Array


@dataclasses.dataclass(frozen=True)
class EagleDrafter:
    """EAGLE-2 dynamic-tree drafter (static: hashable, a jit argument); weights go in `HeadParams`.

    Attributes:
      graphdef: `nnx.split(eagle_head)[0]`.
      depth: tree depth (draft forward passes per round: depth - 1, plus the root's head product).
      top_k: children per expanded node and nodes expanded per depth.
      min_path_prob: adaptive tree size — a row's tree keeps only the nodes whose path probability
        under the draft is at least this (nodes are best-first, so they form a prefix); 0 keeps all
        k. A row left with no node drafts nothing (len_b = 0), which lets the loop's adaptive policy
        fall back to plain rounds when the head is unsure.
      feature_layers: the target blocks an EAGLE-3 head fuses (set by `build` from the head's config).
    The tree budget is the loop's k (SpecConfig.k): 1 <= k <= top_k + (depth-1)·top_k².
    """

    cheap: ClassVar[bool] = False  # depth - 1 head forwards, each with a head product

    graphdef: Any
    depth: int = 4
    top_k: int = 4
    min_path_prob: float = 0.0
    feature_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("depth", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise EagleDrafterError(f"EagleDrafter.{name} must be a positive integer, got {value!r}")
        if not 0.0 <= self.min_path_prob <= 1.0:
            raise EagleDrafterError(f"EagleDrafter.min_path_prob must be in [0, 1], got {self.min_path_prob!r}")

    @classmethod
    def build(cls, head: EagleHead, model, vocab=None, depth: int = 4, top_k: int = 4, min_path_prob: float = 0.0):
        """(drafter, draft_params) for an EAGLE head on `model`, optionally over a `DraftVocab`."""
        graphdef, weights = nnx.split(head)
        table = None if vocab is None else vocab_head(model, vocab)
        return (cls(graphdef, depth, top_k, float(min_path_prob), tuple(head.cfg.fuse_layers)),
                HeadParams(weights=weights, vocab=table))

    @property
    def tree_slots(self) -> int:
        """Cache slots past the committed context that one round's tree expansion writes."""
        return (self.depth - 1) * self.top_k

    def _head(self, params: HeadParams) -> EagleHead:
        return nnx.merge(self.graphdef, params.weights)

    def init(self, model, draft_params: HeadParams, prefill: Prefill) -> EagleState:
        """Runs the head over the prompt's pairs (f_t, x_{t+1}), the last one ending in the first token."""
        head = self._head(draft_params)
        b, t = prefill.tokens_bt.shape
        rows = jnp.arange(b)
        next_bt = jnp.pad(prefill.tokens_bt[:, 1:], ((0, 0), (0, 1)))
        next_bt = next_bt.at[rows, prefill.len_b - 1].set(prefill.first_b)
        cache = head.init_cache(b, prefill.num_slots + self.tree_slots)
        positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        feat_btd = head.committed_features(prefill.hidden_btd, prefill.taps_btx)
        g_btd, cache = head(feat_btd, next_bt, model.embed[...], positions_bt, cache, jnp.zeros((b,), jnp.int32))
        return EagleState(cache=cache, root_feat_bd=g_btd[rows, prefill.len_b - 1])

    def observe(self, model, draft_params: HeadParams, draft_state: EagleState, obs: Observation) -> EagleState:
        """Writes the committed pairs (target feature, committed token) at their slots; new root feature."""
        head = self._head(draft_params)
        b, t = obs.tokens_bt.shape
        positions_bt = obs.pos_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
        feat_btd = head.committed_features(obs.hidden_btd, obs.taps_btx)
        g_btd, cache = head(feat_btd, obs.tokens_bt, model.embed[...], positions_bt, draft_state.cache, obs.pos_b)
        last_bd = g_btd[jnp.arange(b), jnp.maximum(obs.n_b - 1, 0)]
        root_bd = jnp.where((obs.n_b > 0)[:, None], last_bd, draft_state.root_feat_bd)
        return EagleState(cache=cache, root_feat_bd=root_bd)

    def max_accept(self, k: int) -> int:
        """A round accepts at most one path: the tree's depth."""
        return self.depth

    def draft_cost(self, model, draft_params: HeadParams, k: int) -> float:
        """The root's head product, then depth - 1 passes of the head layer with a head product each
        (the tree budget k only selects among their candidates), in target steps (`draft_cost`)."""
        head = cost.head_bytes(model, draft_params.vocab)
        layer = cost.nbytes(draft_params.weights)
        return cost.step_fraction(model, head) + (self.depth - 1) * cost.step_fraction(model, layer + head)

    def propose(self, model, draft_params: HeadParams, state, k: int) -> tuple[Draft, EagleState]:
        """A k-node EAGLE-2 tree per row, grown from the root feature (see the module docstring)."""
        n_pool = dt.pool_size(self.depth, self.top_k)
        if not 1 <= k <= n_pool:
            raise EagleDrafterError(f"tree budget k={k} must be in [1, {n_pool}] for depth={self.depth}, "
                                    f"top_k={self.top_k} (the candidates the tree expansion collects)")
        head, table = self._head(draft_params), output_head(model, draft_params)
        ds: EagleState = state.draft_state
        pool, cache = self._grow(head, table, model.embed[...], ds, state.pos_b)
        tree = dt.select_tree(pool, k)
        len_b = jnp.full(state.pos_b.shape, k, jnp.int32)
        if self.min_path_prob > 0:
            len_b = confident_length(jnp.exp(tree.score_bn), self.min_path_prob, cumulative=False)
        draft = Draft(tokens_bk=table.to_target(tree.tokens_bn), len_b=len_b, parent_bk=tree.parent_bn)
        return draft, ds.replace(cache=cache)

    def _grow(self, head: EagleHead, table, embed_vd, ds: EagleState, pos_b: jax.Array):
        """Expands the tree depth by depth; returns the candidate pool and the cache with tree writes."""
        kk, m = self.top_k, self.tree_slots
        b = pos_b.shape[0]
        pool = dt.root_pool(table.logits(ds.root_feat_bd), kk)
        frontier_bf = jnp.broadcast_to(jnp.arange(kk, dtype=jnp.int32), (b, kk))
        feat_bfd = jnp.broadcast_to(ds.root_feat_bd[:, None, :], (b, kk, ds.root_feat_bd.shape[-1]))
        own_fm = jax.nn.one_hot(jnp.arange(kk), max(m, 1), dtype=bool)  # frontier node f sits at tree slot f
        anc_bfm = jnp.broadcast_to(own_fm, (b, kk, max(m, 1)))
        cache = ds.cache
        for d in range(1, self.depth):
            tokens_bf = table.to_target(jnp.take_along_axis(pool.tokens_bp, frontier_bf, axis=1))
            positions_bf = jnp.broadcast_to((pos_b + d - 1)[:, None], (b, kk))
            mask_bfs = dt.slot_mask(anc_bfm, pos_b, cache.num_slots)
            g_bfd, cache = head(feat_bfd, tokens_bf, embed_vd, positions_bf, cache, pos_b + (d - 1) * kk,
                                mask_bts=mask_bfs)
            pool, children_bc = dt.expand(pool, frontier_bf, table.logits(g_bfd), kk)
            if d == self.depth - 1:
                break
            frontier_bf = dt.select_frontier(pool, children_bc, kk)
            parent_bf = (frontier_bf - children_bc[:, :1]) // kk  # children of frontier node f are f·K … f·K+K-1
            feat_bfd = jnp.take_along_axis(g_bfd, parent_bf[:, :, None], axis=1)
            own_fm = jax.nn.one_hot(d * kk + jnp.arange(kk), m, dtype=bool)
            anc_bfm = jnp.take_along_axis(anc_bfm, parent_bf[:, :, None], axis=1) | own_fm[None]
        return pool, cache
