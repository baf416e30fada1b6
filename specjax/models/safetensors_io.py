"""safetensors files for specjax's cache: written one array at a time, 64-byte aligned, read as views of one map.

safetensors' own `save_file` joins every array into one bytes object first and `load_file` copies every
array out of the file; a cached model is written and read here instead, so neither a conversion nor a load
holds a second copy of the weights (docs/performance.md, "Weights mapped from the cache"):

- `SafetensorsWriter` writes arrays as they come, so a caller producing them one at a time (a GGUF
  converted tensor by tensor, a model laid out for the int8 kernel matrix by matrix) holds one at a time.
  The header, which comes first in the file, is written last into room reserved from the keys declared up
  front.
- The data start 64-byte aligned and the arrays whose sizes are multiples of 64 bytes are written first,
  so each of them is 64-byte aligned in the file: `read_safetensors`' views of it become device arrays in
  place (`quant.device_array`). The files stay valid safetensors files (contiguous data, no holes).
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

__all__ = ["ALIGN", "SafetensorsWriter", "read_safetensors", "release_pages", "write_safetensors"]

NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
                "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_CODES = {np.dtype(t): code for code, t in NUMPY_DTYPES.items()}

# Alignment XLA:CPU needs to take a host buffer without copying it (jax.device_put(..., may_alias=True)).
ALIGN = 64
# Header bytes one entry takes besides its key, at most: `, "…": {"dtype": "BF16", "shape": [...],
# "data_offsets": [a, b]}` with up to _MAX_DIMS dimensions and offsets of up to 20 digits each.
_MAX_DIMS = 8
_ENTRY_ROOM = 64 + _MAX_DIMS * 22 + 2 * 22


class SafetensorsWriter:
    """A safetensors file written one array at a time through a temporary file renamed into place when the
    `with` block ends without an error (a reader never sees half a file; an error leaves nothing behind).

    Args:
      path: the file to write.
      keys: every key that may be added (the header's room is reserved from them: a key declared and never
        added costs ~300 bytes of spaces in the header).
      metadata: strings for the header's ``__metadata__``, as safetensors' own `metadata=`.

    `add` writes an array whose size is a multiple of 64 bytes at once (64-byte aligned) and keeps a
    reference to any other until the end, where they are written after the aligned ones. `discard` drops the
    file instead (its temporary is removed when the block ends).
    """

    def __init__(self, path: Path, keys: Iterable[str], metadata: Mapping[str, str] | None = None):
        self.path = Path(path)
        self._keys = set(keys)
        self._added: set[str] = set()
        self._metadata = None if metadata is None else dict(metadata)
        room = len(json.dumps(self._metadata or {})) + sum(len(json.dumps(k)) + _ENTRY_ROOM for k in self._keys)
        self._data_start = 8 + room + (-(8 + room) % ALIGN)
        self._header: dict[str, dict] = {}
        self._held: list[tuple[str, np.ndarray]] = []
        self._offset = 0
        self._tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
        self._file = None
        self._keep = True

    def __enter__(self) -> SafetensorsWriter:
        self._file = open(self._tmp, "wb")
        self._file.seek(self._data_start)
        return self

    def add(self, key: str, array) -> None:
        """Adds one array (numpy or a host-side jax array) under a declared `key`.

        Raises:
          ValueError: `key` was not declared, or was added already, or the array has more than 8 dimensions.
        """
        if key not in self._keys or key in self._added:
            raise ValueError(f"{self.path.name}: key {key!r} was not declared or was added twice")
        self._added.add(key)
        a = np.asarray(array)
        if a.ndim > _MAX_DIMS:
            raise ValueError(f"{self.path.name}: {key!r} has {a.ndim} dimensions (at most {_MAX_DIMS})")
        if a.nbytes % ALIGN:
            self._held.append((key, a))
        else:
            self._write(key, a)

    def discard(self) -> None:
        """Writes nothing: the file is neither created nor replaced when the `with` block ends."""
        self._keep = False

    def _write(self, key: str, a: np.ndarray) -> None:
        self._header[key] = {"dtype": _CODES[a.dtype], "shape": list(a.shape),
                             "data_offsets": [self._offset, self._offset + a.nbytes]}
        if a.size:
            self._file.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
        self._offset += a.nbytes

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None and self._keep:
                for key, a in self._held:
                    self._write(key, a)
                self._held.clear()
                header = ({} if self._metadata is None else {"__metadata__": self._metadata}) | self._header
                text = json.dumps(header).encode()
                room = self._data_start - 8
                assert len(text) <= room, "the reserved header room is a bound on what the keys can take"
                self._file.seek(0)
                self._file.write(room.to_bytes(8, "little") + text + b" " * (room - len(text)))
            self._file.close()
            if kind is None and self._keep:
                os.replace(self._tmp, self.path)
        finally:
            self._file.close()  # a no-op when closed above
            self._tmp.unlink(missing_ok=True)


def write_safetensors(arrays: Mapping[str, object], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Writes `arrays` (numpy or host-side jax arrays) as a safetensors file, one array at a time
    (`SafetensorsWriter`: memory stays at one array's host copy; aligned as the module says)."""
    with SafetensorsWriter(path, arrays, metadata) as f:
        for key, a in arrays.items():
            f.add(key, a)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as read-only views of one memory map (no copy: a device array made
    with `quant.device_array` is those very pages where aligned, else build_model's one copy; safetensors'
    load_file copies 1 GB more, ~1.5 s of a start). A file cut short or with a damaged header raises one of
    `loading.UNREADABLE` (ValueError, KeyError, OSError)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if 8 + n > os.fstat(f.fileno()).st_size:  # the header's trailing spaces can be cut off and still parse
            raise ValueError(f"{path} is cut short inside its header")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError(f"{path} has no safetensors header")
    header.pop("__metadata__", None)
    data = np.memmap(path, np.uint8, mode="r", offset=8 + n) if header else None
    return {name: data[info["data_offsets"][0]:info["data_offsets"][1]].view(NUMPY_DTYPES[info["dtype"]])
            .reshape(info["shape"]) for name, info in header.items()}


def release_pages(views: Iterable[np.ndarray]) -> None:
    """Hands the pages of `read_safetensors` views back from this process's resident memory (madvise
    MADV_DONTNEED over each view's pages). Their contents stay the file's: they remain in the page cache and a
    later read, by numpy or by a device array made from the view, faults them in again. For one pass over a
    file bigger than what the process needs afterwards (`packed_cache.lay_out`, `convert`). Views of anything
    other than a memory map are left alone, as is everything where the platform has no madvise."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    for v in views:
        base = v  # the memmap holding the map itself (slices of a memmap are memmaps too)
        while isinstance(base, np.ndarray) and isinstance(base.base, np.ndarray):
            base = base.base
        # Only read-only maps: a copy-on-write one ("c") would lose what was written to it.
        if not isinstance(base, np.memmap) or not isinstance(base.base, mmap.mmap) or base.mode != "r" or not v.nbytes:
            continue
        # np.memmap maps from the allocation granule below its offset: the map starts that far before its data.
        start = base.ctypes.data - base.offset % mmap.ALLOCATIONGRANULARITY
        first = (v.ctypes.data - start) // mmap.PAGESIZE * mmap.PAGESIZE
        base.base.madvise(mmap.MADV_DONTNEED, first, v.ctypes.data - start + v.nbytes - first)
