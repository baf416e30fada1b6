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

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.models.config import ModelConfig
from specjax.models.gguf_loader import ROW_SLICE, RowSlice, dequantize_rows
from specjax.models.weight_formats import attach_packed, is_matrix, pack_exact, pack_matrix

PACKED_VERSION = "1"


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
        part = RowSlice(tensor, r0, min(r0 + ROW_SLICE, out_dim))
        arrays = pack_exact(part, fmt)  # the file's integers, unpacked: no float pass
        if arrays is None:
            arrays = pack_matrix(np.asarray(gguf.quants.dequantize(part.data, part.tensor_type), np.float32), fmt)
        slices.append(arrays)
    forms = {tuple((k, a.dtype, a.shape[1:]) for k, a in sorted(d.items())) for d in slices}
    if len(forms) > 1:
        # Slices took different forms (exact in one, quantized in another): redone whole from float,
        # so a matrix has one form. Rare.
        slices = [pack_matrix(dequantize_rows(tensor.data, tensor.tensor_type), fmt)]
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
    from specjax.models.gguf_loader import _param_name, config_from_gguf, open_gguf, tokenizer_fields
    from specjax.models.loading import _check_finite, config_to_json
    from specjax.models.safetensors_io import SafetensorsWriter, release_pages
    from specjax.models.tokenizer import Tokenizer

    progress(f"reading {path.name} for weights={fmt} (first use only; cached afterwards)")
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path)
    names = {t.name: _param_name(t.name) for t in reader.tensors}
    keys = [f"{n}:{part}" if is_matrix(n) else n for n in names.values()
            for part in (("values", "scale", "offset") if is_matrix(n) else ("",))]
    # Written as converted: one tensor's arrays in memory at a time (the file's pages aside).
    with SafetensorsWriter(folder / "weights.safetensors", keys, metadata={"weights": fmt}) as f:
        for t in reader.tensors:
            name = names[t.name]
            stored = tensor_arrays(t, name, fmt, _row_permutation(reader, name))
            # Garbage in a GGUF's data shows up as NaN / inf in the float arrays (a block's scale, a norm), as
            # in the float32 conversion: refused, not decoded into empty or wrong text.
            # (np.isfinite takes bfloat16 as it is: no float32 copy of a whole matrix.)
            _check_finite({k: a for k, a in stored.items() if a.dtype.kind not in "iub"}, path)
            for key, a in stored.items():
                f.add(key, a)
            release_pages([t.data])  # the GGUF's pages of this tensor: read once
    Tokenizer.from_gguf_fields(**tokenizer_fields(reader)).save(folder / "tokenizer")
    (folder / "config.json").write_text(config_to_json(cfg))


def build_packed_model(cfg: ModelConfig, weights_file: Path, dtype=jnp.float32, source: str = "checkpoint",
                       tiled_file: Path | None = None):
    """A Transformer from a packed weights.safetensors, its arrays the file's pages where aligned (`device_array`).

    `tiled_file`: matrices found there are taken in the int8 kernel's layout as they were saved
    (`save_tiled`), the rest from `weights_file`.

    Raises:
      WeightsError: names or shapes that do not fit `cfg` (all listed).
    """
    from flax import nnx

    from specjax.models.params import WeightsError, abstract_transformer, param_shapes
    from specjax.models.quant import BlockQuant, device_array
    from specjax.models.safetensors_io import read_safetensors

    expected = param_shapes(cfg, dtype)
    tiled = read_tiled(tiled_file) if tiled_file is not None else {}
    stored = read_safetensors(weights_file)  # views of one memory map: only what is used is read
    by_matrix = _by_matrix(stored)
    matrices, plain = set(by_matrix), {k for k in stored if ":" not in k}
    missing = sorted(set(expected) - matrices - plain)
    extra = sorted((matrices | plain) - set(expected)) + sorted(set(tiled) - matrices)
    if missing or extra:
        raise WeightsError(f"{source} does not match the model: missing {missing[:8]}, unexpected {extra[:8]}")
    graphdef, state = nnx.split(abstract_transformer(cfg, dtype))
    flat = nnx.to_flat_state(state)
    for path, var in flat:
        name = ".".join(map(str, path))
        # Packed matrices get a scalar placeholder; attach_packed drops it.
        var.set_value(device_array(stored[name], dtype) if name in plain else jnp.zeros((), dtype))
    model = nnx.merge(graphdef, nnx.from_flat_state(flat))
    packed = {}
    for name in matrices:
        bq = tiled[name] if name in tiled else BlockQuant.from_arrays(by_matrix[name])
        want = expected[name][::-1] if name.endswith(".w") else expected[name]
        if bq.shape != tuple(want):
            raise WeightsError(f"{source} does not match the model: {name} is {bq.shape}, expected {want}")
        packed[name] = bq
    attach_packed(model, packed)
    return model


def tiled_file(folder: Path) -> Path:
    """Where a packed folder keeps its matrices in the int8 kernel's layout (named by the layout's version)."""
    from specjax.models.tile_layout import LAYOUT_VERSION

    return folder / f"tiled-{LAYOUT_VERSION}.safetensors"


def read_tiled(file: Path) -> dict:
    """The matrices `lay_out` wrote, by params.py name, as `TiledBlockQuant`s whose arrays are the file's pages
    (`quant.device_array`)."""
    from specjax.models.int8_activations import TiledBlockQuant
    from specjax.models.safetensors_io import read_safetensors

    return {name: TiledBlockQuant(**arrays) for name, arrays in _by_matrix(read_safetensors(file)).items()}


def _by_matrix(stored: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """A cache file's ``<name>:<part>`` arrays grouped by matrix name (plain ``<name>`` arrays left out)."""
    parts: dict[str, dict[str, np.ndarray]] = {}
    for key, a in stored.items():
        if ":" in key:
            name, part = key.split(":")
            parts.setdefault(name, {})[part] = a
    return parts


def lay_out(weights_file: Path, file: Path, progress: Callable[[str], None] = lambda s: None) -> int:
    """Writes the matrices of a packed weights.safetensors that the int8 kernel takes, laid out for it
    (`int8_activations.laid_out`), to `file` (what `build_packed_model`'s `tiled_file` reads), file to file:
    one layout in memory at a time, and the pages of each source matrix handed back once it is written (a
    pass over Qwen's 1.5 GB file would otherwise stay resident). Returns how many were written (none: no
    file).

    Raises:
      OSError: the file could not be written (nothing is left behind); errors of `loading.UNREADABLE` for a
        damaged `weights_file`.
    """
    from specjax.models.int8_activations import TiledBlockQuant, laid_out
    from specjax.models.quant import BlockQuant
    from specjax.models.safetensors_io import SafetensorsWriter, read_safetensors, release_pages

    parts = _by_matrix(read_safetensors(weights_file))
    # Each matrix made when its turn comes (a misaligned file's arrays are copies), written, then let go.
    matrices = ((name, BlockQuant.from_arrays(arrays)) for name, arrays in parts.items())
    count = 0
    with SafetensorsWriter(file, [f"{name}:{part}" for name in parts for part in TiledBlockQuant.PARTS]) as f:
        for name, tiled in laid_out(matrices, progress=progress):
            for part, a in tiled.arrays().items():
                f.add(f"{name}:{part}", a)
            release_pages(parts[name].values())
            count += 1
        if not count:  # no matrix the kernel takes: no file
            f.discard()
    return count


def load_packed_gguf(path: Path, sha256: str, fmt: str, dtype, progress: Callable[[str], None],
                     tiled: bool = False):
    """(model, tokenizer) of a GGUF in weight format `fmt`, converting into the cache on first use.

    `tiled`: the matrices the int8 activation kernel takes come laid out for it (compact scales; cached).
    A cached folder that cannot be read (a truncated file, a damaged header) is converted again after one
    warning line; unreadable twice is a ModelFileError. (No checksum: it would cost ~1 s of every Qwen start.)
    """
    from specjax.models.artifacts import warn
    from specjax.models.loading import UNREADABLE, ModelFileError, cache_root, config_from_json
    from specjax.models.tokenizer import Tokenizer

    target = cache_root() / f"gguf-packed-{PACKED_VERSION}-{sha256[:32]}-{fmt}"
    for attempt in (1, 2):
        if not (target / "config.json").is_file():
            _convert_into(path, fmt, target, progress)
        try:
            cfg = config_from_json((target / "config.json").read_text())
            progress(f"loading cached weights ({fmt})")
            return _packed_model(cfg, target, dtype, str(path), tiled, progress), Tokenizer.load(target / "tokenizer")
        except UNREADABLE as e:
            if attempt == 2:
                raise ModelFileError(f"the converted model at {target} is unreadable ({e}); delete that folder "
                                     "and run again") from None
            warn(f"the cached weights at {target} are unreadable ({type(e).__name__}: {e}); converting again")
            shutil.rmtree(target, ignore_errors=True)
    raise AssertionError("unreachable")


def _convert_into(path: Path, fmt: str, target: Path, progress) -> None:
    """Converts into a temporary folder renamed to `target` (a half-written folder is never picked up)."""
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        convert(path, fmt, tmp, progress)
        if not (target / "config.json").is_file():  # another process may have finished first
            shutil.rmtree(target, ignore_errors=True)
            tmp.replace(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _packed_model(cfg: ModelConfig, folder: Path, dtype, source: str, tiled: bool, progress):
    """`load_packed_gguf`'s model: with `tiled`, from the folder's int8 layout if it has one, else laid out
    now and saved there (a Qwen start: 2.3 s less). The layout's matrices are the file's pages, mapped in place
    (`quant.device_array`): no second copy in memory, and steps 1.2× faster than from a copy (docs/performance.md,
    "Weights mapped from the cache")."""
    from specjax.models.artifacts import warn
    from specjax.models.loading import UNREADABLE

    weights, layout = folder / "weights.safetensors", tiled_file(folder)
    if tiled and layout.is_file():
        try:
            model = build_packed_model(cfg, weights, dtype, source, layout)
            _drop_other_layouts(layout)
            return model
        except UNREADABLE as e:  # a damaged or stale file: lay out again
            warn(f"the cached int8 layout {layout} is unreadable ({type(e).__name__}: {e}); laying out again")
            layout.unlink(missing_ok=True)
    if tiled:
        try:
            written = lay_out(weights, layout, progress)
        except OSError as e:  # a full disk costs the next start 2 s, not this run (load_model lays out in memory)
            warn(f"could not cache the int8 layout in {layout} ({e})")
        else:
            if written:  # this run too maps the file it wrote, as every later start does
                _drop_other_layouts(layout)
                return build_packed_model(cfg, weights, dtype, source, layout)
    return build_packed_model(cfg, weights, dtype, source)


def _drop_other_layouts(layout: Path) -> None:
    """Removes the folder's layouts of other versions: no start reads them again (a 1.2 GB copy each for Qwen)."""
    for stale in layout.parent.glob("tiled-*.safetensors"):
        if stale != layout:
            with contextlib.suppress(OSError):  # another user's file, a read-only cache: left as it is
                stale.unlink(missing_ok=True)
