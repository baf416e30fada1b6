"""Reduced draft vocabulary (FR-Spec / EAGLE-3 style): draft over the N most frequent tokens only.

Gemma 3's output head has 262,144 rows: one head product costs ~0.34 GFLOP per position, more than
the whole body of a one-layer draft. A draft rarely needs the long tail of that vocabulary, so a
drafter can score only the N most frequent tokens of a corpus (N = 16–32k keeps >95% of the token
mass of ordinary text) and map its choices back to target ids. Verification still uses the full
target head, so this is lossless: a token outside the draft vocabulary can simply never be drafted.

Two layers:
  * `DraftVocab` is a host object (numpy): which target ids are kept, how it was built, save/load.
  * `HeadTable` is the in-graph form (a `flax.struct` pytree passed as a jit argument): the gathered
    [N, D] rows of the target's tied head plus the ids that map draft index → target id. The full
    head is a `HeadTable` too (`HeadTable.full`), so drafters have one code path for both.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


class DraftVocabError(ValueError):
    """A draft vocabulary that cannot be built or loaded (bad size, ids, or file)."""


@dataclasses.dataclass(frozen=True, eq=False)
class DraftVocab:
    """The kept target ids, sorted ascending (so draft index order follows target id order).

    Attributes:
      ids_n: int32 [N] sorted unique target ids.
      vocab_size: rows of the target vocabulary the ids index.
    """

    ids_n: np.ndarray
    vocab_size: int

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids_n)
        if ids.ndim != 1 or ids.size == 0:
            raise DraftVocabError(f"draft vocabulary ids must be a non-empty 1-D array, got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise DraftVocabError(f"draft vocabulary ids must be integers, got dtype {ids.dtype}")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise DraftVocabError(
                f"draft vocabulary ids must lie in [0, {self.vocab_size}), got {ids.min()} … {ids.max()}")
        if np.any(np.diff(ids) <= 0):
            raise DraftVocabError("draft vocabulary ids must be sorted ascending without duplicates")
        object.__setattr__(self, "ids_n", ids.astype(np.int32))

    @property
    def size(self) -> int:
        return int(self.ids_n.shape[0])

    # ------------------------------------------------------------------------------------ building
    @classmethod
    def from_counts(cls, counts_v: np.ndarray, size: int, always: Iterable[int] = ()) -> DraftVocab:
        """The `size` most frequent ids of a count vector, always including `always` (e.g. EOS ids).

        Ties are broken by the smaller id, so the result is deterministic.

        Args:
          counts_v: occurrences per target id [V].
          size: N, the number of kept ids (1 <= N <= V).
          always: ids kept regardless of their count (they take slots of the least frequent ones).
        """
        counts_v = np.asarray(counts_v)
        v = counts_v.shape[0]
        always = sorted({int(i) for i in always})
        if not 1 <= size <= v:
            raise DraftVocabError(f"draft vocabulary size must be in [1, {v}], got {size}")
        if any(not 0 <= i < v for i in always):
            raise DraftVocabError(f"always-kept ids {always} must lie in [0, {v})")
        if len(always) > size:
            raise DraftVocabError(f"draft vocabulary size {size} is smaller than the {len(always)} always-kept ids")
        rank = counts_v.astype(np.float64).copy()
        rank[always] = np.inf
        order = np.lexsort((np.arange(v), -rank))  # by count descending, then id ascending
        return cls(np.sort(order[:size]), v)

    @classmethod
    def from_token_ids(cls, sequences: Iterable[Sequence[int]], vocab_size: int, size: int,
                       always: Iterable[int] = ()) -> DraftVocab:
        """Counts the ids of tokenised sequences, then `from_counts`."""
        counts = np.zeros((vocab_size,), np.int64)
        for seq in sequences:
            ids = np.asarray(seq, np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise DraftVocabError(f"token id out of [0, {vocab_size}) in the corpus: {ids.min()} … {ids.max()}")
            counts += np.bincount(ids, minlength=vocab_size)
        return cls.from_counts(counts, size, always)

    @classmethod
    def from_texts(cls, texts: Iterable[str], tokenizer, vocab_size: int, size: int,
                   always: Iterable[int] = ()) -> DraftVocab:
        """Tokenises texts with `tokenizer.encode(text, add_bos=False)`, then `from_token_ids`."""
        return cls.from_token_ids((tokenizer.encode(t, add_bos=False) for t in texts), vocab_size, size, always)

    # ------------------------------------------------------------------------------------ mapping
    def index_of(self) -> np.ndarray:
        """Dense map target id → draft index, -1 for ids outside the draft vocabulary [V]."""
        index_v = np.full((self.vocab_size,), -1, np.int32)
        index_v[self.ids_n] = np.arange(self.size, dtype=np.int32)
        return index_v

    def coverage(self, counts_v: np.ndarray) -> float:
        """Fraction of the token mass of `counts_v` that the draft vocabulary keeps."""
        counts_v = np.asarray(counts_v, np.float64)
        return float(counts_v[self.ids_n].sum() / max(counts_v.sum(), 1.0))

    def head(self, table_vd: jax.Array, softcap: float | None = None) -> HeadTable:
        """The in-graph head over these ids: rows of the (tied) target head gathered once."""
        if table_vd.shape[0] != self.vocab_size:
            raise DraftVocabError(
                f"head table has {table_vd.shape[0]} rows but the draft vocabulary indexes {self.vocab_size}")
        ids = jnp.asarray(self.ids_n)
        return HeadTable(table_nd=jnp.take(table_vd, ids, axis=0), ids_n=ids, softcap=softcap)

    # ------------------------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Writes `<path>.npy` (the ids) and `<path>.json` (vocab_size, size); returns the .npy path."""
        npy = Path(path).with_suffix(".npy")
        npy.parent.mkdir(parents=True, exist_ok=True)
        np.save(npy, self.ids_n)
        npy.with_suffix(".json").write_text(json.dumps({"vocab_size": self.vocab_size, "size": self.size}))
        return npy

    @classmethod
    def load(cls, path: str | Path) -> DraftVocab:
        """Reads what `save` wrote (either file's path, or the common stem)."""
        npy = Path(path).with_suffix(".npy")
        meta_path = npy.with_suffix(".json")
        for f in (npy, meta_path):
            if not f.is_file():
                raise DraftVocabError(f"draft vocabulary file {f} does not exist")
        try:
            meta = json.loads(meta_path.read_text())
            vocab_size, size = int(meta["vocab_size"]), int(meta["size"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DraftVocabError(f"{meta_path}: expected JSON with integer 'vocab_size' and 'size' ({e})") from None
        ids = np.load(npy, allow_pickle=False)
        if ids.shape != (size,):
            raise DraftVocabError(f"{npy}: holds {ids.shape} ids but {meta_path} says size {size}")
        try:
            return cls(ids, vocab_size)
        except DraftVocabError as e:
            raise DraftVocabError(f"{npy}: {e}") from None


@struct.dataclass
class HeadTable:
    """An output head restricted to some rows: logits over N candidates, and the way back to target ids.

    Attributes:
      table_nd: head rows [N, D] (the whole tied embedding for the full vocabulary).
      ids_n: target id of each row [N], or None when the rows ARE the target vocabulary.
      softcap: the target's final logit soft-cap (static), or None.
    """

    table_nd: jax.Array
    ids_n: jax.Array | None = None
    softcap: float | None = struct.field(pytree_node=False, default=None)

    @classmethod
    def full(cls, table_vd: jax.Array, softcap: float | None = None) -> HeadTable:
        """The target's own head over its whole vocabulary."""
        return cls(table_nd=table_vd, ids_n=None, softcap=softcap)

    @property
    def size(self) -> int:
        return self.table_nd.shape[0]

    def logits(self, hidden_xd: jax.Array) -> jax.Array:
        """float32 logits [..., N] of hidden states [..., D] (as `Transformer.logits` on these rows)."""
        lead, d = hidden_xd.shape[:-1], hidden_xd.shape[-1]
        # 2-D product: XLA:CPU runs [M, D] @ [N, D]^T faster than a batched einsum (docs/performance.md).
        logits_mn = jax.lax.dot_general(hidden_xd.reshape(-1, d).astype(self.table_nd.dtype), self.table_nd,
                                        (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        logits = logits_mn.reshape(*lead, self.size)
        return logits if self.softcap is None else jnp.tanh(logits / self.softcap) * self.softcap

    def to_target(self, index_x: jax.Array) -> jax.Array:
        """Target ids of draft indices (identity for the full head)."""
        return index_x.astype(jnp.int32) if self.ids_n is None else jnp.take(self.ids_n, index_x, axis=0)
