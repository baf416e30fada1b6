"""GGUF files in a low-precision weight format: converted tensor by tensor, cached, loaded per tensor.

`weights=bfloat16|int8|q4` (weight_formats.py) never builds the float32 model. Conversion reads one
GGUF tensor at a time (in row slices of at most `ROW_SLICE` rows, so Qwen's 151,936-row embedding
is never dequantized whole) and keeps only its packed arrays; loading moves one stored array at a
time to the device. Peak RSS therefore stays near the stored format's size (docs/performance.md
has the measurements). The folder, ``<cache>/gguf-packed-<version>-<sha256 of the file>-<format>``,
holds config.json, tokenizer/ and weights.safetensors (matrices as ``<name>:values`` /
``:scale`` / ``:offset``, norms and biases float32 under their own names).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.models.config import ModelConfig
from specjax.models.weight_formats import attach_packed, is_matrix, pack_matrix

PACKED_VERSION = "1"
ROW_SLICE = 16_384


class _RowSlice:
    """The rows [r0, r1) of a gguf ReaderTensor (what quant.block_quant_from_gguf reads)."""

    def __init__(self, tensor, r0: int, r1: int):
        self.tensor_type, self.data = tensor.tensor_type, tensor.data[r0:r1]


def tensor_arrays(tensor, name: str, fmt: str, row_perm: Callable[[np.ndarray], np.ndarray] | None = None
                  ) -> dict[str, np.ndarray]:
    """The stored arrays of one GGUF tensor in `fmt`, keyed as in weights.safetensors.

    Args:
      tensor: a gguf ReaderTensor.
      name: its specjax parameter name (gguf_loader naming).
      fmt: "bfloat16", "int8" or "q4".
      row_perm: reorders rows of [out, ...] arrays (llama files' Q/K rows), applied after packing:
        a format's blocks run along `in`, so whole rows move unchanged.
    """
    import gguf

    if not is_matrix(name):
        w = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        return {name: row_perm(w) if row_perm else w}
    out_dim = int(tensor.data.shape[0])
    slices = []
    for r0 in range(0, out_dim, ROW_SLICE):
        part = _RowSlice(tensor, r0, min(r0 + ROW_SLICE, out_dim))
        slices.append(pack_matrix(np.asarray(gguf.quants.dequantize(part.data, part.tensor_type), np.float32),
                                  fmt, part))
    forms = {tuple((k, a.dtype, a.shape[1:]) for k, a in sorted(d.items())) for d in slices}
    if len(forms) > 1:
        # Slices took different forms (exact in one, quantized in another): redone whole from float,
        # so a matrix has one form. Rare.
        w_oi = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        slices = [pack_matrix(w_oi, fmt)]
    arrays = {f"{name}:{k}": np.concatenate([d[k] for d in slices]) for k in slices[0]}
    return {k: row_perm(a) if row_perm else a for k, a in arrays.items()}


def _row_permutation(reader, name: str):
    """llama files store Q/K rows permuted for llama.cpp's interleaved RoPE (gguf_loader undoes it)."""
    from specjax.models.gguf_loader import _field

    arch = _field(reader, "general.architecture")
    module = name.rsplit(".", 1)[0].split(".", 2)[-1] if name.startswith("blocks.") else ""
    if arch != "llama" or module not in ("attn.q", "attn.k"):
        return None
    from specjax.models.gguf_loader import unpermute_qk_rows

    key = "attention.head_count" if module == "attn.q" else "attention.head_count_kv"
    heads = int(_field(reader, f"{arch}.{key}", _field(reader, f"{arch}.attention.head_count")))
    return lambda a: unpermute_qk_rows(a, heads)


def convert(path: Path, fmt: str, folder: Path, progress: Callable[[str], None]) -> None:
    """Writes config.json, tokenizer/ and weights.safetensors of `fmt` into `folder`, one tensor at a time."""
    from safetensors.numpy import save_file

    from specjax.models.gguf_loader import _param_name, config_from_gguf, open_gguf, tokenizer_fields
    from specjax.models.loading import _check_finite, config_to_json
    from specjax.models.tokenizer import Tokenizer

    progress(f"reading {path.name} for weights={fmt} (first use only; cached afterwards)")
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path)
    arrays: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = _param_name(t.name)
        stored = tensor_arrays(t, name, fmt, _row_permutation(reader, name))
        # Garbage in a GGUF's data shows up as NaN / inf in the float arrays (a block's scale, a norm), as in
        # the float32 conversion: refused, not decoded into empty or wrong text.
        # (np.isfinite takes bfloat16 as it is: no float32 copy of a whole matrix.)
        _check_finite({k: a for k, a in stored.items() if a.dtype.kind not in "iub"}, path)
        arrays.update(stored)
    save_file(arrays, str(folder / "weights.safetensors"), metadata={"weights": fmt})
    del arrays
    Tokenizer.from_gguf_fields(**tokenizer_fields(reader)).save(folder / "tokenizer")
    (folder / "config.json").write_text(config_to_json(cfg))


def build_packed_model(cfg: ModelConfig, weights_file: Path, dtype=jnp.float32, source: str = "checkpoint"):
    """A Transformer from a packed weights.safetensors, moving one stored array at a time to the device.

    Raises:
      WeightsError: names or shapes that do not fit `cfg` (all listed).
    """
    from flax import nnx
    from safetensors import safe_open

    from specjax.models.params import WeightsError, param_shapes
    from specjax.models.quant import BlockQuant
    from specjax.models.transformer import Transformer

    expected = param_shapes(cfg, dtype)
    with safe_open(str(weights_file), framework="numpy") as f:
        keys = set(f.keys())
        matrices = {k.split(":")[0] for k in keys if ":" in k}
        plain = keys - {k for k in keys if ":" in k}
        missing = sorted(set(expected) - matrices - plain)
        extra = sorted((matrices | plain) - set(expected))
        if missing or extra:
            raise WeightsError(f"{source} does not match the model: missing {missing[:8]}, unexpected {extra[:8]}")
        abstract = nnx.eval_shape(lambda: Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        flat = nnx.to_flat_state(state)
        for path, var in flat:
            name = ".".join(map(str, path))
            # Packed matrices get a scalar placeholder; attach_packed drops it.
            var.set_value(jnp.asarray(f.get_tensor(name), dtype) if name in plain else jnp.zeros((), dtype))
        model = nnx.merge(graphdef, nnx.from_flat_state(flat))
        packed = {}
        for name in matrices:
            parts = {k: jnp.asarray(f.get_tensor(f"{name}:{k}")) for k in ("values", "scale", "offset")
                     if f"{name}:{k}" in keys}
            bq = BlockQuant.from_arrays(parts)
            want = expected[name][::-1] if name.endswith(".w") else expected[name]
            if bq.shape != tuple(want):
                raise WeightsError(f"{source} does not match the model: {name} is {bq.shape}, expected {want}")
            packed[name] = bq
    attach_packed(model, packed)
    return model


def load_packed_gguf(path: Path, sha256: str, fmt: str, dtype, progress: Callable[[str], None]):
    """(model, tokenizer) of a GGUF in weight format `fmt`, converting into the cache on first use."""
    from specjax.models.loading import cache_root, config_from_json
    from specjax.models.tokenizer import Tokenizer

    target = cache_root() / f"gguf-packed-{PACKED_VERSION}-{sha256[:32]}-{fmt}"
    if not (target / "config.json").is_file():
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            convert(path, fmt, tmp, progress)
            if not (target / "config.json").is_file():  # another process may have finished first
                shutil.rmtree(target, ignore_errors=True)
                tmp.replace(target)  # atomic: a half-written folder is never picked up
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    cfg = config_from_json((target / "config.json").read_text())
    progress(f"loading cached weights ({fmt})")
    model = build_packed_model(cfg, target / "weights.safetensors", dtype, source=str(path))
    return model, Tokenizer.load(target / "tokenizer")

