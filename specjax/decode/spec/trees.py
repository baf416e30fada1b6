"""Token trees for speculative decoding: structure, attention mask, positions, static shapes.

A tree draft has k nodes per row. Node j carries one proposed token and a parent index
`parent_bk[b, j]`: another node i < j, or -1 for the row's last committed token (the root,
which is not a node). Nodes are therefore topologically ordered, and a chain is the tree
with parents -1, 0, 1, …, k-2. The target verifies the whole tree in ONE forward over the
block [last, node_0 … node_{k-1}]: block row 0 is the root, block row 1 + j is node j.

Every node sees the committed cache, the root and its own ancestors (and itself), never a
sibling's branch, and sits at position pos + depth (depth 1 for the root's children), so the
target computes at each node exactly what a chain forward along the node's path would.

Static trees (Medusa) are written as top-k index paths: (0,) is the top-1 token of the first
head, (0, 1) the top-2 token of the second head under it, … (`StaticTree`).

Adaptive draft length: `confident_length` truncates a draft at its first unconfident position.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


class TreeError(ValueError):
    """An invalid static tree description."""


def sanitize_parents(parent_bk: jax.Array) -> jax.Array:
    """Parents clipped into -1 … j-1, so a malformed in-graph tree can never form a cycle."""
    k = parent_bk.shape[-1]
    return jnp.clip(parent_bk.astype(jnp.int32), -1, jnp.arange(k, dtype=jnp.int32) - 1)


def ancestor_mask(parent_bk: jax.Array) -> jax.Array:
    """anc_bkk[b, j, i]: node i is node j or one of its ancestors (the root excluded).

    Pointer doubling: start from "self or parent" and square the relation ceil(log2 k)
    times — a handful of [k, k] boolean products instead of a k-step sequential walk.
    """
    k = parent_bk.shape[-1]
    parent_bk = sanitize_parents(parent_bk)
    anc_bkk = jnp.eye(k, dtype=bool)[None] | (parent_bk[:, :, None] == jnp.arange(k)[None, None, :])
    for _ in range(max(math.ceil(math.log2(max(k, 2))), 1)):
        reach_bkk = jnp.einsum("bji,bil->bjl", anc_bkk.astype(jnp.int32), anc_bkk.astype(jnp.int32))
        anc_bkk = reach_bkk > 0
    return anc_bkk


def depths(anc_bkk: jax.Array) -> jax.Array:
    """Depth of each node (1 for a child of the root): its number of ancestors-or-self."""
    return jnp.sum(anc_bkk, axis=-1).astype(jnp.int32)


def block_mask(anc_bkk: jax.Array) -> jax.Array:
    """[B, k+1, k+1] visibility inside the block [root, nodes…] for `Transformer.__call__`.

    Row 0 (the root) sees itself; row 1 + j sees the root and the ancestors-or-self of node j.
    """
    b, k, _ = anc_bkk.shape
    top_b1k = jnp.zeros((b, 1, k), bool)
    left_bt1 = jnp.ones((b, k + 1, 1), bool)
    return jnp.concatenate([left_bt1, jnp.concatenate([top_b1k, anc_bkk], axis=1)], axis=2)


def block_positions(pos_b: jax.Array, depth_bk: jax.Array) -> jax.Array:
    """[B, k+1] RoPE positions of the block: the root at pos, node j at pos + depth_j."""
    return pos_b[:, None] + jnp.concatenate([jnp.zeros_like(depth_bk[:, :1]), depth_bk], axis=1)


def path_rows(path_bk: jax.Array, accepted_b: jax.Array) -> jax.Array:
    """[B, k+1] block rows along an accepted path: row 0, then 1 + path node at each depth.

    Entries past the path (i > accepted) repeat row 0 (filler, never read as committed).
    """
    k = path_bk.shape[1]
    on_path_bk = jnp.arange(k)[None, :] < accepted_b[:, None]
    rows_bk = jnp.where(on_path_bk, 1 + path_bk, 0)
    return jnp.concatenate([jnp.zeros_like(rows_bk[:, :1]), rows_bk], axis=1)


def max_valid_depth(depth_bk: jax.Array, len_b: jax.Array) -> jax.Array:
    """Deepest level holding a real (index < len_b) node, per row: what a round can accept."""
    valid_bk = jnp.arange(depth_bk.shape[1])[None, :] < len_b[:, None]
    return jnp.max(jnp.where(valid_bk, depth_bk, 0), axis=1)


def compact(tokens_bn: jax.Array, parent_bn: jax.Array, valid_bn: jax.Array, k: int):
    """A tree of n candidate nodes (topologically ordered, some invalid) as a k-node draft, valid nodes first.

    A node counts only when it and all its ancestors are valid. The valid nodes keep their order (a
    stable sort, so parents still precede children) and fill the first len_b slots; parents are
    renumbered. With more than k valid nodes the first k are kept (a prefix of a topological order is
    a tree); with fewer than n = k slots the rest are padding.

    Returns:
      (tokens_bk, parent_bk, len_b): what `Draft` wants for a tree.
    """
    b, n = tokens_bn.shape
    parent_bn = sanitize_parents(parent_bn)
    anc_bnn = ancestor_mask(parent_bn)
    valid_bn = jnp.all(~anc_bnn | valid_bn[:, None, :], axis=-1)
    order_bn = jnp.argsort(~valid_bn, axis=1, stable=True).astype(jnp.int32)
    new_index_bn = jnp.zeros((b, n), jnp.int32).at[jnp.arange(b)[:, None], order_bn].set(
        jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n)))
    if n < k:  # pad with invalid nodes (never reached: len_b <= n)
        pad = ((0, 0), (0, k - n))
        order_bn, valid_bn = jnp.pad(order_bn, pad), jnp.pad(valid_bn, pad)
    order_bk = order_bn[:, :k]
    old_parent_bk = jnp.take_along_axis(parent_bn, order_bk, axis=1)
    renumbered_bk = jnp.take_along_axis(new_index_bn, jnp.maximum(old_parent_bk, 0), axis=1)
    parent_bk = jnp.where(old_parent_bk < 0, -1, renumbered_bk)
    len_b = jnp.minimum(jnp.sum(valid_bn, axis=1), k).astype(jnp.int32)
    return jnp.take_along_axis(tokens_bn, order_bk, axis=1).astype(jnp.int32), sanitize_parents(parent_bk), len_b


@dataclasses.dataclass(frozen=True)
class StaticTree:
    """A fixed tree shape given by top-k index paths (hashable: usable as a static jit argument).

    Node j is `paths[j]` (paths sorted by length, then lexicographically, so parents come
    first). Node j's token is rank `ranks[j]` of the distribution at depth `depths[j]`, e.g.
    the (ranks[j]+1)-th most likely token of Medusa head `depths[j] - 1`.

    Attributes:
      paths: the sorted, validated paths.
    """

    paths: tuple[tuple[int, ...], ...]

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> StaticTree:
        """Validates and sorts paths such as [(0,), (0, 0), (1,)].

        Raises:
          TreeError: naming the first empty, negative, duplicate or orphaned path (one whose
            prefix is not itself a path).
        """
        norm = []
        for p in paths:
            t = tuple(int(r) for r in p)
            if not t:
                raise TreeError("empty path in tree: every node needs at least one rank")
            if min(t) < 0:
                raise TreeError(f"negative rank in tree path {t}")
            norm.append(t)
        if not norm:
            raise TreeError("a tree needs at least one path")
        seen = set()
        for t in norm:
            if t in seen:
                raise TreeError(f"duplicate tree path {t}")
            seen.add(t)
        for t in norm:
            if len(t) > 1 and t[:-1] not in seen:
                raise TreeError(f"tree path {t} has no parent: its prefix {t[:-1]} is not in the tree")
        return cls(paths=tuple(sorted(norm, key=lambda t: (len(t), t))))

    @classmethod
    def from_accuracies(cls, accuracy_dr: Sequence[Sequence[float]], size: int) -> StaticTree:
        """The `size`-node tree with the largest expected accepted length (Medusa's construction).

        accuracy_dr[d][r] estimates how often the rank-r candidate at depth d + 1 is the right
        token; a node's value is the product along its path (independence assumed), and the
        expected accepted length is the sum over nodes. Best-first growth picks the top-valued
        nodes; a child is never worth more than its parent, so the result is a valid tree.

        Raises:
          TreeError: for accuracies outside [0, 1], ragged rows, or a size the depths and ranks
            cannot fill.
        """
        acc = [[float(a) for a in row] for row in accuracy_dr]
        if not acc or any(len(row) != len(acc[0]) or not row for row in acc):
            raise TreeError("accuracies must be a non-empty [depth][rank] table with equal-length rows")
        if any(not 0.0 <= a <= 1.0 for row in acc for a in row):
            raise TreeError("accuracies must lie in [0, 1]")
        depth, ranks = len(acc), len(acc[0])
        capacity = sum(ranks ** (d + 1) for d in range(depth))
        if not 1 <= size <= capacity:
            raise TreeError(f"tree size {size} must be in 1..{capacity} for {depth} depths x {ranks} ranks")
        frontier = [(-acc[0][r], (r,)) for r in range(ranks)]
        heapq.heapify(frontier)
        chosen = []
        while len(chosen) < size:
            neg_value, path = heapq.heappop(frontier)  # ties: the lexicographically smaller path
            chosen.append(path)
            if len(path) < depth:
                for r in range(ranks):
                    heapq.heappush(frontier, (neg_value * acc[len(path)][r], (*path, r)))
        return cls.from_paths(chosen)

    @classmethod
    def chain(cls, k: int) -> StaticTree:
        """The chain of k top-1 tokens: (0,), (0, 0), …"""
        return cls.from_paths([(0,) * (i + 1) for i in range(k)])

    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def parents(self) -> np.ndarray:
        index = {p: j for j, p in enumerate(self.paths)}
        return np.array([index[p[:-1]] if len(p) > 1 else -1 for p in self.paths], np.int32)

    @property
    def depths(self) -> np.ndarray:
        return np.array([len(p) for p in self.paths], np.int32)

    @property
    def ranks(self) -> np.ndarray:
        return np.array([p[-1] for p in self.paths], np.int32)

    @property
    def max_depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def max_rank(self) -> int:
        """Largest rank + 1: how many top-k candidates each level needs."""
        return max(max(p) for p in self.paths) + 1

    def parent_bk(self, batch: int) -> jax.Array:
        """The parents broadcast to [batch, k] (what `Draft.parent_bk` wants)."""
        return jnp.broadcast_to(jnp.asarray(self.parents), (batch, self.size))

    def gather(self, topk_bdr: jax.Array) -> jax.Array:
        """Node values from per-depth top-k tables: out[b, j] = topk_bdr[b, depths[j] - 1, ranks[j]].

        Args:
          topk_bdr: [B, max_depth, >= max_rank] (token ids or their probabilities).
        """
        return topk_bdr[:, self.depths - 1, self.ranks]


def confident_length(conf_bk: jax.Array, threshold, *, cumulative: bool = True, max_len_b=None) -> jax.Array:
    """Adaptive draft length: how many leading positions are confident enough.

    The draft stops at its first position whose confidence is below `threshold`: with
    cumulative=True the confidence of position i is prod(conf[:i+1]) (the draft's estimate
    that the whole prefix survives verification); otherwise conf itself (e.g. the draft's own
    top probability there, or a tree node's path probability).

    For trees the nodes must be ordered so that truncation makes sense (nodes past len_b are
    invalid): e.g. nodes sorted by descending path probability, which is also a topological
    order, with cumulative=False.

    Args:
      conf_bk: per-position draft probabilities [B, k], in [0, 1].
      threshold: scalar (may be traced).
      max_len_b: optional cap per row (e.g. the drafter's own length).

    Returns:
      len_b int32 [B] in 0..k.
    """
    conf_bk = conf_bk.astype(jnp.float32)
    if cumulative:
        conf_bk = jnp.cumprod(conf_bk, axis=1)
    ok_bk = conf_bk >= threshold
    len_b = jnp.sum(jnp.cumprod(ok_bk.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    return len_b if max_len_b is None else jnp.minimum(len_b, max_len_b).astype(jnp.int32)


# Medusa's default 63-node tree ("mc_sim_7b_63", FasterDecoding/Medusa medusa/model/medusa_choices.py):
# top-k index paths chosen on Vicuna-7B head accuracies; depth 4, up to 10 candidates per level.
MEDUSA_63 = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
)
