"""A GGUF file's metadata and tensors, read with numpy over one memory map.

`gguf.GGUFReader` (the gguf package) makes a numpy view for every part of every metadata value: Gemma 3's
262,144 vocabulary strings took 17 s of a 25 s first conversion (3.2 million memmap slices; 43rd session's
profile). This reader parses the same format (GGUF v2 / v3, little-endian; the gguf package's type constants
and block sizes) with `struct` over the map and returns numeric arrays as one `np.frombuffer` each: ~0.3 s for
that vocabulary. Tensors are views of the map shaped as `GGUFReader` shapes them (quantized types as uint8
rows of their blocks), so `gguf.quants.dequantize` takes them as they are.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GGUFFile", "GGUFField", "GGUFTensor", "read_gguf"]

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
            12: "<f8"}  # GGUFValueType → numpy dtype (all but STRING and ARRAY)
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GGUFField:
    """One metadata value: a number, a bool, a string, or a list of them (numeric lists as numpy arrays)."""

    name: str
    value: Any

    def contents(self) -> Any:
        """The value as plain Python (lists for arrays), as `gguf.ReaderField.contents()` gives it."""
        if isinstance(self.value, np.ndarray):
            return self.value.tolist()
        return list(self.value) if isinstance(self.value, list) else self.value


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: `shape` in GGUF order (fastest-varying first), `data` a read-only view of the file."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    fields: dict[str, GGUFField]
    tensors: list[GGUFTensor]


class _Cursor:
    """Reads little-endian GGUF values from a buffer, advancing an offset."""

    def __init__(self, buf, offset: int = 0):
        self.buf, self.at = buf, offset

    def take(self, fmt: str):
        try:
            value = struct.unpack_from(fmt, self.buf, self.at)
        except struct.error:
            raise ValueError(f"the file ends inside its metadata (byte {self.at})") from None
        self.at += struct.calcsize(fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<Q")
        if self.at + n > len(self.buf):
            raise ValueError(f"a string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8", "replace")
        self.at += n
        return s

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[item])
                if self.at + count * dtype.itemsize > len(self.buf):
                    raise ValueError(f"an array of {count} values runs past the end of the file")
                out = np.frombuffer(self.buf, dtype, count, self.at).copy()  # the map may close; arrays are small
                self.at += count * dtype.itemsize
                return out
            return [self.value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata value type {kind}")
        dtype = np.dtype(_SCALARS[kind])
        if self.at + dtype.itemsize > len(self.buf):
            raise ValueError("a value runs past the end of the file")
        out = np.frombuffer(self.buf, dtype, 1, self.at)[0].item()
        self.at += dtype.itemsize
        return out


def read_gguf(path: str | Path) -> GGUFFile:
    """Reads a GGUF file's metadata and maps its tensors.

    Raises:
      ValueError: not a GGUF file, an unsupported version or byte order, a duplicated key or tensor name, an
        unknown value or tensor type, or a file cut short.
    """
    import gguf

    data = np.memmap(path, np.uint8, mode="r")
    buf = data.base if isinstance(data.base, mmap.mmap) else memoryview(data)
    c = _Cursor(buf)
    if bytes(buf[:4]) != _MAGIC:
        raise ValueError("no GGUF magic at the start of the file")
    version = c.take("<4xI")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (byte-swapped: a big-endian file) is not supported: 2 or 3")
    n_tensors, n_fields = c.take("<Q"), c.take("<Q")
    # The header's own values come first under these names, as in gguf.GGUFReader.
    fields = {name: GGUFField(name, v) for name, v in (("GGUF.version", version), ("GGUF.tensor_count", n_tensors),
                                                         ("GGUF.kv_count", n_fields))}
    for _ in range(n_fields):
        name = c.string()
        if name in fields:
            raise ValueError(f"metadata key {name!r} appears twice")
        fields[name] = GGUFField(name, c.value(c.take("<I")))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        dims = np.array([c.take("<Q") for _ in range(n_dims)], np.uint64)
        infos.append((name, dims, gguf.GGMLQuantizationType(c.take("<I")), c.take("<Q")))
    alignment = int(fields["general.alignment"].value) if "general.alignment" in fields else _DEFAULT_ALIGNMENT
    start = c.at + (-c.at % alignment)
    tensors, names = [], set()
    for name, dims, kind, offset in infos:
        if name in names:
            raise ValueError(f"tensor {name!r} appears twice")
        names.add(name)
        tensors.append(GGUFTensor(name, kind, dims, _tensor_data(data, start + offset, dims, kind)))
    return GGUFFile(fields, tensors)


def _tensor_data(data: np.ndarray, at: int, dims: np.ndarray, kind) -> np.ndarray:
    """The view `gguf.GGUFReader` gives: typed for float and integer types, uint8 block rows for quantized ones."""
    import gguf

    n = int(np.prod(dims, dtype=np.uint64))
    shape = tuple(int(d) for d in reversed(dims.tolist()))
    block, size = gguf.GGML_QUANT_SIZES[kind]
    plain = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
             "I32": np.int32, "I64": np.int64}.get(kind.name)
    if plain is None:
        dtype, count, shape = np.uint8, n * size // block, gguf.quants.quant_shape_to_byte_shape(shape, kind)
    else:
        dtype, count = plain, n
    nbytes = count * np.dtype(dtype).itemsize
    if at + nbytes > len(data):
        raise ValueError(f"tensor data at byte {at} runs past the end of the file")
    # A plain ndarray view, not a memmap: numpy calls memmap.__array_finalize__ on every slice of a memmap
    # subclass, 2.2 million times (2.6 s) in gguf's dequantization of Qwen.
    return np.asarray(data[at:at + nbytes]).view(dtype).reshape(shape)
