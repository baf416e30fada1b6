"""Packed training rows and a deterministic, resumable batch order.

Documents (token ids plus a per-token "is a training target" flag) are concatenated and cut into
rows of `seq_len` tokens. Rows are packed across document boundaries (every document starts with
BOS, and positions restart at 0 in each row): no padding is wasted, at the price of a document
occasionally attending to the tail of the previous one.

The batch order is a pure function of (seed, batch index): epoch e visits the rows in the order of
`np.random.default_rng((seed, e)).permutation`. The data position saved with a checkpoint is just
the number of batches consumed, so a resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from specjax.jsonl import jsonl_rows
from specjax.train.config import TrainConfigError


@dataclasses.dataclass(frozen=True)
class Document:
    """Token ids and target flags: target_n[i] = 1 when ids_n[i] is a token the draft must predict."""

    ids_n: np.ndarray
    target_n: np.ndarray


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """tokens [N, T] int32 and mask [N, T] float32 (mask[r, t] = 1: token t+1 is a target).

    features: optional [N, T, D] frozen-target features of the rows (`features.py`), batched with them.
    """

    tokens: np.ndarray
    mask: np.ndarray
    features: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-row arrays a batch is cut from."""
        out = {"tokens": self.tokens, "mask": self.mask}
        return out if self.features is None else {**out, "features": self.features}

    @property
    def n_rows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def target_tokens(self) -> int:
        return int(self.mask.sum())


def pack(docs: Iterable[Document], seq_len: int, pad_id: int = 0) -> PackedRows:
    """Concatenates documents and cuts rows of seq_len tokens (the last partial row is padded)."""
    docs = list(docs)
    if not docs:
        return PackedRows(np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.float32))
    ids = np.concatenate([d.ids_n for d in docs]).astype(np.int32)
    target = np.concatenate([d.target_n for d in docs]).astype(np.float32)
    n_rows = -(-ids.size // seq_len)
    pad = n_rows * seq_len - ids.size
    ids = np.pad(ids, (0, pad), constant_values=pad_id).reshape(n_rows, seq_len)
    target = np.pad(target, (0, pad)).reshape(n_rows, seq_len)
    # mask at t says token t+1 is a target; the last position of a row has no next token in the row.
    mask = np.zeros_like(target)
    mask[:, :-1] = target[:, 1:]
    return PackedRows(ids, mask)


class BatchOrder:
    """Batches of `batch_size` rows shaped [accum, batch_size // accum, T], by global batch index."""

    def __init__(self, rows: PackedRows, batch_size: int, accum: int, seed: int):
        if rows.n_rows < batch_size:
            raise TrainConfigError(
                f"the training split has {rows.n_rows} rows of {rows.tokens.shape[1]} tokens, fewer than "
                f"batch_size={batch_size}: use more data (data.num_prompts) or a smaller batch_size / seq_len")
        self.rows, self.batch_size, self.accum, self.seed = rows, batch_size, accum, seed
        self.per_epoch = rows.n_rows // batch_size
        self._epoch, self._perm = -1, None

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """The index-th batch of the run (epochs follow each other, each freshly shuffled)."""
        epoch, i = divmod(index, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng((self.seed, epoch)).permutation(self.rows.n_rows)
        idx = self._perm[i * self.batch_size:(i + 1) * self.batch_size]
        lead = (self.accum, self.batch_size // self.accum)
        return {k: v[idx].reshape(*lead, *v.shape[1:]) for k, v in self.rows.arrays().items()}


def dev_batches(rows: PackedRows, batch_size: int, limit: int = 0) -> list[dict[str, np.ndarray]]:
    """The dev split in order, as [batch_size, T] batches (the last one padded with mask 0 rows)."""
    out = []
    for start in range(0, rows.n_rows, batch_size):
        part = {k: np.asarray(v[start:start + batch_size]) for k, v in rows.arrays().items()}
        pad = batch_size - part["tokens"].shape[0]
        out.append({k: np.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)) for k, v in part.items()})
        if limit and len(out) >= limit:
            break
    return out


# ---------------------------------------------------------------------------------------- corpora


def read_texts(path: str | Path, fmt: str, field: str = "text") -> list[str]:
    """Documents of a plain text file (blank-line separated) or a jsonl file (`field` of each line).

    Raises:
      TrainConfigError: missing file, bad JSON line, or a line without the field (with line number).
    """
    path = Path(path)
    if not path.is_file():
        raise TrainConfigError(f"data.path: file not found: {path}")
    if fmt == "text":
        text = path.read_text(encoding="utf-8")
        return [d.strip() for d in text.split("\n\n") if d.strip()]
    docs = []
    for lineno, obj in jsonl_rows(path, TrainConfigError):
        if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
            raise TrainConfigError(f"{path}:{lineno}: no string field {field!r} (set data.text_field)")
        docs.append(obj[field])
    return docs


def corpus_documents(texts: Sequence[str], tokenizer) -> list[Document]:
    """Every token of a plain corpus is a target (language-model style), BOS excepted."""
    docs = []
    for t in texts:
        ids = np.asarray(tokenizer.encode(t), np.int32)
        target = np.ones_like(ids, np.float32)
        target[0] = 0.0
        docs.append(Document(ids, target))
    return docs


def split_dev(items: Sequence, dev_count: int, seed: int) -> tuple[list, list]:
    """(train, dev): a seeded shuffle, then the first dev_count items are the dev split.

    The shuffle depends only on `seed` and the item count, so the dev split is the same for every
    run over the same data, whatever the run's own seed.
    """
    order = np.random.default_rng(seed).permutation(len(items))
    dev = [items[i] for i in order[:dev_count]]
    train = [items[i] for i in order[dev_count:]]
    return train, dev
