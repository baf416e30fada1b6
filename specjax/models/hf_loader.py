"""Loads Hugging Face checkpoint directories (config.json + safetensors) for Llama, Qwen2 and Gemma 3.

Only what the Transformer can compute exactly is accepted: every unsupported option
(rope types other than default/linear, attention soft-capping, output-projection biases,
Qwen2 sliding windows, ...) is refused with a ConfigError naming it, rather than loaded
into a model that would silently compute something else.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open

from specjax.models.config import ConfigError, ModelConfig, gemma3_layer_kinds
from specjax.models.params import WeightsError, build_model
from specjax.models.transformer import Transformer

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "gemma3_text", "gemma3")

# Checkpoints on the Hub are often saved as a diff against the transformers class defaults
# (notably Gemma 3's multimodal `text_config`), so absent keys must read as those defaults.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, hidden_act="silu", max_position_embeddings=2048,
                  rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=None),
    "qwen2": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, hidden_act="silu",
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None),
    "gemma3": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                   hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                   rms_norm_eps=1e-6, rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
                   query_pre_attn_scalar=256, sliding_window=4096, tie_word_embeddings=True,
                   bos_token_id=2, eos_token_id=1, pad_token_id=0),
}

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
_LAYER_KINDS = {"full_attention": "global", "sliding_attention": "local"}


def _rope(params: dict[str, Any], default_theta: float, where: str) -> tuple[float, float]:
    """(base, linear scale) of one rope parameter dict; refuses rope types we cannot compute."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear"):
        raise ConfigError(f"{where}: rope type {rope_type!r} is not supported (only 'default' and 'linear')")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(
            f"{where}: partial_rotary_factor={params['partial_rotary_factor']} is not supported")
    theta = params.get("rope_theta")
    scale = float(params["factor"]) if rope_type == "linear" else 1.0
    return float(theta if theta is not None else default_theta), scale


def _gemma3_rope(c: dict[str, Any]) -> tuple[tuple[float, float], tuple[float, float]]:
    """Global and local (base, scale) from either the per-layer-type `rope_parameters`
    (transformers >= 5) or the old `rope_theta` / `rope_local_base_freq` / `rope_scaling` keys,
    where the scaling always applied to the global layers only."""
    rp = c.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:
        full, sliding = rp.get("full_attention") or {}, rp.get("sliding_attention") or {}
    else:
        full, sliding = {**(c.get("rope_scaling") or {}), **rp}, {}
    g = _rope(full, c.get("rope_theta", 1_000_000.0), "gemma3 full_attention")
    local = _rope(sliding, c.get("rope_local_base_freq", 10_000.0), "gemma3 sliding_attention")
    return g, local


def _eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list | tuple) else (int(value),)


def config_from_hf(config: dict[str, Any]) -> ModelConfig:
    """Maps a Hugging Face config.json dict to a ModelConfig.

    Args:
      config: the parsed config.json; model_type must be llama, qwen2, gemma3_text or gemma3
        (the multimodal wrapper, of which only the text model is used).

    Returns:
      The equivalent ModelConfig.

    Raises:
      ConfigError: unknown model_type or an option the Transformer does not implement.
    """
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}")
    if model_type == "gemma3":
        # Special-token ids and tying often live only at the wrapper's top level.
        top = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")
               if k in config}
        config = {**top, **(config.get("text_config") or {}), "model_type": "gemma3_text"}
    family = "gemma3" if model_type.startswith("gemma3") else model_type
    c = {**_DEFAULTS[family], **{k: v for k, v in config.items() if v is not None or k.endswith("_id")}}
    where = f"{model_type} config"

    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
    act_name = c.get("hidden_activation") or c.get("hidden_act")
    if act_name not in _ACTIVATIONS:
        raise ConfigError(
            f"{where}: activation {act_name!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
    if c.get("mlp_bias"):
        raise ConfigError(f"{where}: mlp_bias=True is not supported")
    if family != "qwen2" and c.get("attention_bias"):
        # Llama/Gemma put the bias on o_proj too, which the Transformer does not have.
        raise ConfigError(f"{where}: attention_bias=True is not supported (no output-projection bias)")

    common = dict(
        family=family, vocab_size=int(c["vocab_size"]), d_model=int(c["hidden_size"]),
        n_layers=int(c["num_hidden_layers"]), n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
        ffn_dim=int(c["intermediate_size"]), norm_eps=float(c["rms_norm_eps"]),
        activation=_ACTIVATIONS[act_name], tie_embeddings=bool(c["tie_word_embeddings"]),
        max_seq_len=int(c["max_position_embeddings"]),
        bos_id=int(c["bos_token_id"]) if c.get("bos_token_id") is not None else None,
        eos_ids=_eos(c.get("eos_token_id")),
        # pad only fills masked prompt slots, so any id is correct when the checkpoint names none.
        pad_id=int(c["pad_token_id"]) if c.get("pad_token_id") is not None else 0,
    )
    n = common["n_layers"]

    if family in ("llama", "qwen2"):
        if c.get("use_sliding_window"):
            raise ConfigError(f"{where}: use_sliding_window=True is not supported")
        params = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
        base, scale = _rope(params, c["rope_theta"], where)
        return ModelConfig(**common, layer_kinds=("global",) * n, rope_base_global=base,
                           rope_base_local=base, rope_scale_global=scale, qkv_bias=family == "qwen2")

    if c.get("attn_logit_softcapping") is not None:
        raise ConfigError(f"{where}: attn_logit_softcapping={c['attn_logit_softcapping']} is not supported")
    if c.get("use_bidirectional_attention"):
        raise ConfigError(f"{where}: use_bidirectional_attention=True is not supported")
    types = c.get("layer_types")
    if types is None:
        pattern = int(c.get("sliding_window_pattern") or c.get("_sliding_window_pattern") or 6)
        kinds = gemma3_layer_kinds(n, pattern)
    else:
        unknown = sorted(set(types) - set(_LAYER_KINDS))
        if unknown:
            raise ConfigError(f"{where}: unknown layer_types {unknown}; supported: {sorted(_LAYER_KINDS)}")
        kinds = tuple(_LAYER_KINDS[t] for t in types)
    (g_base, g_scale), (l_base, l_scale) = _gemma3_rope(c)
    if l_scale != 1.0 and "local" in kinds:
        raise ConfigError(f"{where}: rope scaling of sliding_attention layers is not supported")
    cap = c.get("final_logit_softcapping")
    return ModelConfig(
        **common, layer_kinds=kinds, sliding_window=int(c["sliding_window"]) if "local" in kinds else None,
        rope_base_global=g_base, rope_base_local=l_base, rope_scale_global=g_scale,
        query_scale=float(c["query_pre_attn_scalar"]) ** -0.5, qk_norm=True, sandwich_norms=True,
        embed_scale=True, final_logit_softcap=float(cap) if cap is not None else None,
    )


# Per-layer HF suffix -> (our suffix, transpose). Linear weights are [out, in] in PyTorch.
_LAYER_MAP = {
    **{f"self_attn.{p}_proj.weight": (f"attn.{p}.w", True) for p in "qkvo"},
    **{f"self_attn.{p}_proj.bias": (f"attn.{p}.b", False) for p in "qkv"},
    **{f"mlp.{p}_proj.weight": (f"mlp.{p}.w", True) for p in ("gate", "up", "down")},
    "self_attn.q_norm.weight": ("attn.q_norm.scale", False),
    "self_attn.k_norm.weight": ("attn.k_norm.scale", False),
    "input_layernorm.weight": ("attn_norm.scale", False),
}
# The same HF name means different things: Llama's post_attention_layernorm is the pre-MLP
# norm, Gemma's is the sandwich norm after attention.
_LLAMA_NORMS = {"post_attention_layernorm.weight": ("mlp_norm.scale", False)}
_GEMMA_NORMS = {
    "post_attention_layernorm.weight": ("post_attn_norm.scale", False),
    "pre_feedforward_layernorm.weight": ("mlp_norm.scale", False),
    "post_feedforward_layernorm.weight": ("post_mlp_norm.scale", False),
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Multimodal Gemma 3 nests the text model: `language_model.model.*` (original checkpoints)
# or `model.language_model.*` (transformers >= 4.52 in memory).
_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
             ("language_model.lm_head.", "lm_head."))
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                    "model.multi_modal_projector.")
_NP_DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64}


def _check_contained(directory: Path, index: Path, files: list[str]) -> None:
    """Refuses shard names that lead outside the model directory (`../x`, absolute paths): an index must
    not make the loader read arbitrary files. The check is on the names, not on resolved paths: the
    Hugging Face cache's snapshot folders hold symlinks into a blobs folder next to them."""
    for name in files:
        norm = os.path.normpath(name) if isinstance(name, str) else ""
        if not norm or os.path.isabs(norm) or norm == ".." or norm.startswith(".." + os.sep):
            raise WeightsError(f"{index}: shard {name!r} lies outside the model directory {directory}")


def _safetensors_files(directory: Path) -> list[Path]:
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        names = list(json.loads(index.read_text())["weight_map"].values())
        _check_contained(directory, index, names)
        files = sorted(set(names))
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that do not exist: {missing}")
        return [directory / f for f in files]
    others = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pth"))
    hint = f" (found {others}; only safetensors is supported)" if others else ""
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {directory}{hint}")


def _read_raw(path: Path, name: str) -> np.ndarray:
    """Reads one tensor from the file's own header: numpy has no bfloat16, so safetensors'
    numpy backend cannot return BF16 tensors; ml_dtypes supplies the dtype."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(header_len))[name]
        start, end = info["data_offsets"]
        f.seek(8 + header_len + start)
        raw = f.read(end - start)
    return np.frombuffer(raw, dtype=_NP_DTYPES[info["dtype"]]).reshape(info["shape"])


def _tensors(files: list[Path]):
    """Yields (name, shape, read) for every tensor of every file; read() loads the array, so
    tensors that are skipped are never read."""
    for path in files:
        with safe_open(str(path), framework="np") as f:
            names = f.keys()
            for name in names:
                read = lambda f=f, name=name, path=path: _get(f, path, name)
                yield name, f.get_slice(name).get_shape(), read


def _get(f, path: Path, name: str) -> np.ndarray:
    try:
        return f.get_tensor(name)
    except TypeError:  # bfloat16: numpy lacks the dtype, so safetensors' numpy backend refuses it
        return _read_raw(path, name)


def load_hf_weights(directory: str | Path, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Reads a checkpoint's safetensors into build_model's name -> array mapping.

    Tensors are transposed to [in, out] and Gemma norm weights get the +1 of their
    (1 + w) convention (in float32). Rotary inv_freq buffers and, for Gemma 3, the vision
    tower are skipped; any other unrecognised tensor is kept under its HF name so that
    build_model reports it as unexpected.

    Args:
      directory: holds model.safetensors or model.safetensors.index.json with its shards.
      cfg: the configuration from config_from_hf (decides norm names and conventions).

    Returns:
      Arrays by parameter name, in the checkpoint's dtype except for shifted norms.

    Raises:
      FileNotFoundError: no safetensors checkpoint (or a shard named by the index is missing).
      WeightsError: a duplicated tensor, a tied head that differs from the embedding, or an index naming a
        shard outside the directory.
    """
    gemma = cfg.family == "gemma3"
    layer_map = {**_LAYER_MAP, **(_GEMMA_NORMS if gemma else _LLAMA_NORMS)}
    out: dict[str, np.ndarray] = {}
    for hf_name, shape, read in _tensors(_safetensors_files(Path(directory))):
        name = hf_name
        for old, new in _PREFIXES:
            if name.startswith(old):
                name = new + name[len(old):]
        if name.endswith("rotary_emb.inv_freq") or (gemma and name.startswith(_VISION_PREFIXES)):
            continue
        is_norm, transpose = name == "model.norm.weight", False
        if name == "model.embed_tokens.weight":
            ours = "embed"
        elif name == "lm_head.weight":
            ours = "head"
        elif is_norm:
            ours = "final_norm.scale"
        elif (m := _LAYER_RE.fullmatch(name)) and m.group(2) in layer_map:
            suffix, transpose = layer_map[m.group(2)]
            ours, is_norm = f"blocks.{m.group(1)}.{suffix}", suffix.endswith("norm.scale")
        else:
            # Not read: build_model only needs the name (and shape) to report it.
            out[hf_name] = np.broadcast_to(np.float32(0), tuple(shape))
            continue
        if ours in out:
            raise WeightsError(f"{directory}: tensor {hf_name!r} maps to {ours!r}, which is already loaded")
        w = read()
        if gemma and is_norm:
            w = w.astype(np.float32) + 1.0
        out[ours] = w.T if transpose else w
    if cfg.tie_embeddings and "head" in out:
        # Some exporters write the tied head out explicitly; only an identical copy is harmless.
        head = out.pop("head")
        if "embed" in out and not np.array_equal(head, out["embed"]):
            raise WeightsError(f"{directory}: tie_word_embeddings is true but lm_head.weight differs "
                               "from the embedding")
    return out


def load_hf_model(directory: str | Path, dtype=jnp.float32) -> tuple[Transformer, ModelConfig]:
    """Builds a Transformer from a Hugging Face checkpoint directory.

    Args:
      directory: holds config.json and safetensors weights (single file or sharded).
      dtype: parameter (and KV cache) dtype.

    Returns:
      (model, config). eos_ids also include generation_config.json's eos_token_id, since
      chat checkpoints often list their end-of-turn token only there.

    Raises:
      FileNotFoundError: the directory, config.json or the weights are missing.
      ConfigError: the configuration is unsupported.
      WeightsError: tensors missing, unexpected or of the wrong shape.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {directory}")
    cfg = config_from_hf(json.loads(config_path.read_text()))
    gen_path = directory / "generation_config.json"
    if gen_path.is_file():
        extra = _eos(json.loads(gen_path.read_text()).get("eos_token_id"))
        cfg = cfg.replace(eos_ids=cfg.eos_ids + tuple(e for e in extra if e not in cfg.eos_ids))
    weights = load_hf_weights(directory, cfg)
    return build_model(cfg, weights, dtype, source=f"Hugging Face checkpoint {directory}"), cfg
