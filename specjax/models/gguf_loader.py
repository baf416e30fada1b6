"""GGUF files: hyper-parameters from the metadata, tensors dequantized by the `gguf` package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specjax.models.config import ConfigError, ModelConfig, gemma3_layer_kinds

SUPPORTED_ARCHITECTURES = ("gemma3",)

# llama.cpp tensor names → specjax parameter names (per block, then global).
_BLOCK_NAMES = {
    "attn_q": "attn.q.w",
    "attn_k": "attn.k.w",
    "attn_v": "attn.v.w",
    "attn_output": "attn.o.w",
    "attn_q_norm": "attn.q_norm.scale",
    "attn_k_norm": "attn.k_norm.scale",
    "attn_norm": "attn_norm.scale",
    "post_attention_norm": "post_attn_norm.scale",
    "ffn_norm": "mlp_norm.scale",
    "post_ffw_norm": "post_mlp_norm.scale",
    "ffn_gate": "mlp.gate.w",
    "ffn_up": "mlp.up.w",
    "ffn_down": "mlp.down.w",
}
_GLOBAL_NAMES = {"token_embd": "embed", "output_norm": "final_norm.scale", "output": "head"}


class ModelFileError(ValueError):
    """A model file that is missing, unreadable or not what specjax can load."""


def open_gguf(path: str | Path):
    """Opens a GGUF file with the `gguf` package, turning failures into one clear message."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the gguf package raises assorted errors on corrupt input
        raise ModelFileError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def config_from_gguf(reader, path: str | Path = "<gguf>") -> ModelConfig:
    """Reads every hyper-parameter from the metadata; refuses unknown architectures."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}); Llama and Qwen2 load from Hugging Face directories"
        )

    def need(key: str):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ModelFileError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    n_layers = int(need("block_count"))
    head_dim = int(need("attention.key_length"))
    n_heads = int(need("attention.head_count"))
    n_kv = _field(reader, f"{arch}.attention.head_count_kv", n_heads)
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise ModelFileError(f"{path}: rope scaling type {scaling!r} is not supported (none, linear)")
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id", 1))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelFileError(f"{path}: GGUF metadata lacks tokenizer.ggml.tokens (the vocabulary)")
    vocab = len(tokens.data)
    end_of_turn = _find_token(tokens, "<end_of_turn>")
    try:
        return ModelConfig(
            family=arch,
            vocab_size=vocab,
            d_model=int(need("embedding_length")),
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(n_kv),
            head_dim=head_dim,
            ffn_dim=int(need("feed_forward_length")),
            # llama.cpp hard-codes Gemma 3's pattern (every 6th layer global) and the local
            # RoPE base 10,000: neither is stored in the metadata.
            layer_kinds=gemma3_layer_kinds(n_layers, 6),
            sliding_window=int(need("attention.sliding_window")),
            rope_base_global=float(need("rope.freq_base")),
            rope_base_local=10_000.0,
            rope_scale_global=(float(_field(reader, f"{arch}.rope.scaling.factor", 1.0))
                               if scaling == "linear" else 1.0),
            query_scale=head_dim**-0.5,
            norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            qk_norm=True,
            sandwich_norms=True,
            activation="gelu_tanh",
            embed_scale=True,
            tie_embeddings="output.weight" not in {t.name for t in reader.tensors},
            final_logit_softcap=_field(reader, f"{arch}.final_logit_softcapping"),
            max_seq_len=int(need("context_length")),
            bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 2)),
            eos_ids=tuple(dict.fromkeys(i for i in (eos, end_of_turn) if i is not None)),
            pad_id=int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
        )
    except ConfigError as e:
        raise ModelFileError(f"{path}: {e}") from None


def _find_token(field, piece: str) -> int | None:
    # Gemma's control tokens sit near the start of the vocabulary; scan only that part.
    for i, idx in enumerate(field.data[:1024]):
        if bytes(field.parts[idx]).decode("utf-8", "replace") == piece:
            return i
    return None


def _param_name(gguf_name: str) -> str:
    base = gguf_name.removesuffix(".weight")
    if base.startswith("blk."):
        _, layer, rest = base.split(".", 2)
        if rest in _BLOCK_NAMES:
            return f"blocks.{layer}.{_BLOCK_NAMES[rest]}"
    elif base in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[base]
    return gguf_name  # unknown: reported by build_model as unexpected


def weights_from_gguf(reader) -> dict[str, np.ndarray]:
    """Dequantizes every tensor to float32 in specjax's layout (linear maps as [in, out])."""
    import gguf

    out = {}
    for t in reader.tensors:
        name = _param_name(t.name)
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        # gguf stores [out, in] row-major for linear maps; embeddings stay [vocab, d_model].
        out[name] = np.ascontiguousarray(w.T) if name.endswith(".w") else w
    return out


def quantized_head_from_gguf(reader, cfg: ModelConfig) -> dict[str, np.ndarray] | None:
    """Arrays of an exact int8 copy of the output head (specjax.models.quant), or None."""
    from specjax.models.quant import block_quant_from_gguf

    name = "token_embd.weight" if cfg.tie_embeddings else "output.weight"
    tensor = next((t for t in reader.tensors if t.name == name), None)
    return None if tensor is None else block_quant_from_gguf(tensor)


def tokenizer_fields(reader) -> dict[str, Any]:
    """The tokenizer.ggml.* metadata as plain Python values, for specjax.models.tokenizer."""
    tokens = reader.fields["tokenizer.ggml.tokens"]
    parts = tokens.parts
    pieces = [bytes(parts[i]).decode("utf-8", "replace") for i in tokens.data]

    def array(key: str):
        f = reader.fields.get(key)
        if f is None:
            return None
        return np.concatenate([np.asarray(f.parts[i]) for i in f.data]).tolist()

    return {
        "model": _field(reader, "tokenizer.ggml.model"),
        "tokens": pieces,
        "scores": array("tokenizer.ggml.scores"),
        "token_types": array("tokenizer.ggml.token_type"),
        "bos_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "unk_id": _field(reader, "tokenizer.ggml.unknown_token_id"),
        "pad_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "add_bos": bool(_field(reader, "tokenizer.ggml.add_bos_token", True)),
        "add_space_prefix": bool(_field(reader, "tokenizer.ggml.add_space_prefix", False)),
    }
