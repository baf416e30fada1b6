"""The frozen target's features of the packed rows, computed once and cached on disk.

Medusa and EAGLE heads read the target's final-normed hidden states f_t (what `Transformer.__call__`
returns) and nothing else from its layers; the target is frozen, so f_t of a packed row never changes
during a run. Computing them once for the train and dev rows turns a head-training step from "target
forward + heads" into "heads" only.

An EAGLE-3 head also reads the outputs of a few target blocks (`TaskConfig.eagle_layers`): they are
stored after f_t in the same array, [rows, seq_len, (1 + n) · d_model], and the layers enter the key.

Layout: ``<feature_dir>/<key>/<split>.npy``, float32 [rows, seq_len, d_model], memory-mapped when read.
The key hashes the target's identity, the compute dtype, the format version and the packed token ids
themselves (so the data source, its cache key, the split and the packing all enter it: any change
in what the rows hold gives another key). float32 because the cached path must give the uncached
loss (it does to float rounding, see tests/train/test_features.py); under compute_dtype=bfloat16
the features are computed by the bf16 target and stored exactly (bf16 values fit in float32).
Gemma 3 270M: 640 floats = 2.5 KiB per token, ~220 MB for 86k tokens.

A computation interrupted part-way resumes: rows are written into ``<split>.npy.partial`` (a
memory-mapped .npy) and the count of finished rows into ``<split>.done``; the finished file is
renamed into place at the end. A lock file per split serialises two runs that need the same
features (eagle and medusa started together): the second waits, then reads the first one's file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from specjax.train.data import PackedRows
from specjax.train.step import cast_floats
from specjax.train.task import positions_like

_FORMAT = "1"


def feature_root(feature_dir: str | None) -> Path:
    """The folder holding feature caches (default: ~/.cache/specjax/features)."""
    from specjax.models.loading import cache_root

    return Path(feature_dir).expanduser() if feature_dir else cache_root() / "features"


def feature_key(identity: str, compute_dtype: str, train: PackedRows, dev: PackedRows,
                taps: tuple[int, ...] = ()) -> str:
    """Hash of everything the cached features depend on (target, dtype, tapped layers, the packed rows' ids)."""
    meta = {"target": identity, "dtype": compute_dtype, "format": _FORMAT,
            "shapes": [train.tokens.shape, dev.tokens.shape]}
    if taps:  # absent without taps: the keys of existing final-feature caches stay valid
        meta["taps"] = list(taps)
    h = hashlib.sha256(json.dumps(meta).encode())
    h.update(np.ascontiguousarray(train.tokens, np.int32).tobytes())
    h.update(np.ascontiguousarray(dev.tokens, np.int32).tobytes())
    return h.hexdigest()[:24]


def target_features(model, tokens_bt, taps: tuple[int, ...] = ()) -> jax.Array:
    """f_t of packed rows [B, T, D], followed by the tapped blocks' outputs when `taps` names any."""
    f_btd, _, taps_btx = model.forward(tokens_bt, positions_like(tokens_bt), taps=taps)
    return f_btd if taps_btx is None else jnp.concatenate([f_btd, taps_btx.astype(f_btd.dtype)], axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _features_btd(graphdef, state, tokens_bt, taps):
    return target_features(nnx.merge(graphdef, state), tokens_bt, taps).astype(jnp.float32)


def _write_done(path: Path, n: int) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(str(n))
    tmp.replace(path)  # atomic: a killed run never leaves a count ahead of the rows written


def split_features(model, rows: PackedRows, folder: Path, split: str, chunk: int, compute_dtype: str,
                   progress: bool = True, taps: tuple[int, ...] = ()) -> np.ndarray:
    """[rows, T, D] float32 features of `rows` (memory-mapped), computed (resumably) unless cached.

    Args:
      model: the frozen target Transformer.
      rows: the packed rows.
      folder: this cache key's folder.
      split: "train" or "dev" (the file name).
      chunk: rows per target forward (a static shape: the last chunk is padded).
      compute_dtype: "float32" or "bfloat16": the dtype the uncached loss would run the target in.
      progress: show a progress bar.
      taps: target blocks whose outputs follow f_t (EAGLE-3).
    """
    final = folder / f"{split}.npy"
    shape = (rows.n_rows, rows.tokens.shape[1], model.cfg.d_model * (1 + len(taps)))
    if rows.n_rows == 0:
        return np.zeros(shape, np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    # Two runs started together (eagle and medusa share a key) must not write one partial file at once:
    # the second waits for the first, then reads its finished file.
    with open(folder / f"{split}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_file():
            feats = np.load(final, mmap_mode="r")
            if feats.shape == shape:
                return feats
        _compute(model, rows, folder, split, chunk, compute_dtype, shape, progress, taps)
    return np.load(final, mmap_mode="r")


def _compute(model, rows: PackedRows, folder: Path, split: str, chunk: int, compute_dtype: str, shape: tuple,
             progress: bool, taps: tuple[int, ...]) -> None:
    """Writes <split>.npy, resuming a <split>.npy.partial whose first <split>.done rows are finished."""
    final = folder / f"{split}.npy"
    partial, done_path = folder / f"{split}.npy.partial", folder / f"{split}.done"
    start = int(done_path.read_text()) if partial.is_file() and done_path.is_file() else 0
    out = None
    if start:
        out = np.lib.format.open_memmap(partial, mode="r+")
        if out.shape != shape or out.dtype != np.float32:
            out, start = None, 0
    if out is None:
        out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=shape)
    graphdef, state = nnx.split(model)
    if compute_dtype == "bfloat16":
        state = cast_floats(state, jnp.bfloat16)
    bar = tqdm(total=rows.n_rows, initial=start, desc=f"target features ({split})", unit="row", disable=not progress)
    for lo in range(start, rows.n_rows, chunk):
        tok = rows.tokens[lo:lo + chunk]
        n = tok.shape[0]
        tok = np.pad(tok, ((0, chunk - n), (0, 0)), constant_values=model.cfg.pad_id)
        out[lo:lo + n] = np.asarray(_features_btd(graphdef, state, jnp.asarray(tok), taps))[:n]
        out.flush()
        _write_done(done_path, lo + n)
        bar.update(n)
    bar.close()
    del out
    partial.replace(final)
    done_path.unlink(missing_ok=True)


def attach_features(model, identity: str, train: PackedRows, dev: PackedRows, feature_dir: str | None, chunk: int,
                    compute_dtype: str, progress: bool = True,
                    log: Callable[[str], None] = lambda s: None,
                    taps: tuple[int, ...] = ()) -> tuple[PackedRows, PackedRows]:
    """(train, dev) rows carrying their cached target features (computed first when missing; with `taps`, the
    tapped blocks' outputs after f_t)."""
    folder = feature_root(feature_dir) / feature_key(identity, compute_dtype, train, dev, taps)
    cached = (folder / "train.npy").is_file() and (folder / "dev.npy").is_file()
    log(f"target features: {'cached' if cached else 'computing into'} {folder}")
    train_f = split_features(model, train, folder, "train", chunk, compute_dtype, progress, taps)
    dev_f = split_features(model, dev, folder, "dev", chunk, compute_dtype, progress, taps)
    return dataclasses.replace(train, features=train_f), dataclasses.replace(dev, features=dev_f)
