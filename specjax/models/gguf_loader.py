"""GGUF files: hyper-parameters from the metadata, tensors dequantized by the `gguf` package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specjax.models.config import ConfigError, ModelConfig, gemma3_layer_kinds

SUPPORTED_ARCHITECTURES = ("gemma3", "llama", "qwen2")

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

# Control tokens that end a turn or a document; each one present in the vocabulary stops generation.
_END_MARKERS = ("<end_of_turn>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
_CONTROL = 3  # llama.cpp's token type of control tokens


class ModelFileError(ValueError):
    """A model file that is missing, unreadable or not what specjax can load."""


def open_gguf(path: str | Path):
    """Opens a GGUF file (`gguf_file.read_gguf`: what `gguf.GGUFReader` reads, 30-50x faster on a big
    vocabulary), turning failures into one clear message."""
    from specjax.models.gguf_file import read_gguf

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    try:
        return read_gguf(path)
    except Exception as e:  # assorted errors on corrupt input (struct.error, ValueError, an unknown tensor type)
        raise ModelFileError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def config_from_gguf(reader, path: str | Path = "<gguf>") -> ModelConfig:
    """Reads every hyper-parameter from the metadata of a gemma3, llama or qwen2 GGUF.

    Raises:
      ModelFileError: an unknown architecture, a missing key, or a feature the Transformer does not
        compute (rope scaling other than linear, Llama 3.1 frequency factors, experts, partial rotary,
        output-projection biases); the message names the metadata key or tensor.
    """
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    meta = _Metadata(reader, arch, path)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelFileError(f"{path}: GGUF metadata lacks tokenizer.ggml.tokens (the vocabulary)")
    names = {t.name for t in reader.tensors}
    try:
        arch_fields = _gemma3_fields(meta) if arch == "gemma3" else _llama_fields(meta, names)
        eos = [meta.top("tokenizer.ggml.eos_token_id", 1 if arch == "gemma3" else None)]
        eos += [meta.top(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
        eos += _end_markers(tokens, reader.fields.get("tokenizer.ggml.token_type"))
        return ModelConfig(
            family=arch,
            vocab_size=len(tokens.contents()),
            d_model=int(meta.need("embedding_length")),
            n_layers=int(meta.need("block_count")),
            ffn_dim=int(meta.need("feed_forward_length")),
            norm_eps=float(meta.need("attention.layer_norm_rms_epsilon")),
            max_seq_len=int(meta.need("context_length")),
            tie_embeddings="output.weight" not in names,
            bos_id=meta.top("tokenizer.ggml.bos_token_id", 2 if arch == "gemma3" else None),
            eos_ids=tuple(dict.fromkeys(int(i) for i in eos if i is not None)),
            pad_id=int(meta.top("tokenizer.ggml.padding_token_id", 0)),
            **arch_fields,
        )
    except ConfigError as e:
        raise ModelFileError(f"{path}: {e}") from None


class _Metadata:
    """`{arch}.*` metadata lookups whose failures name the key."""

    def __init__(self, reader, arch: str, path):
        self.reader, self.arch, self.path = reader, arch, path

    def get(self, key: str, default: Any = None) -> Any:
        return _field(self.reader, f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelFileError(f"{self.path}: GGUF metadata lacks {self.arch}.{key}")
        return value

    def top(self, key: str, default: Any = None) -> Any:
        value = _field(self.reader, key, default)
        return None if value is None else int(value)

    def refuse(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {what} is not supported")

    def rope_scale(self) -> float:
        """The linear RoPE position divisor; other scaling types are refused, naming the key."""
        key = "rope.scaling.type"
        scaling = self.get(key, "none")
        if scaling not in ("none", "linear"):
            raise self.refuse(f"{self.arch}.{key} = {scaling!r} (supported: none, linear)")
        if scaling == "linear":
            return float(self.need("rope.scaling.factor"))
        return float(self.get("rope.scale_linear", 1.0))  # the key older converters wrote


def _gemma3_fields(meta: _Metadata) -> dict[str, Any]:
    n_layers, head_dim = int(meta.need("block_count")), int(meta.need("attention.key_length"))
    n_heads = int(meta.need("attention.head_count"))
    return dict(
        n_heads=n_heads, n_kv_heads=int(meta.get("attention.head_count_kv", n_heads)), head_dim=head_dim,
        # llama.cpp hard-codes Gemma 3's pattern (every 6th layer global) and the local RoPE base
        # 10,000: neither is stored in the metadata.
        layer_kinds=gemma3_layer_kinds(n_layers, 6), sliding_window=int(meta.need("attention.sliding_window")),
        rope_base_global=float(meta.need("rope.freq_base")), rope_base_local=10_000.0,
        rope_scale_global=meta.rope_scale(), query_scale=head_dim**-0.5, qk_norm=True, sandwich_norms=True,
        activation="gelu_tanh", embed_scale=True, final_logit_softcap=meta.get("final_logit_softcapping"),
    )


def _llama_fields(meta: _Metadata, tensor_names: set[str]) -> dict[str, Any]:
    """Llama and Qwen2: pre-norm blocks, SwiGLU, full causal attention, optional q/k/v biases."""
    a = meta.arch
    n_heads = int(meta.need("attention.head_count"))
    head_dim = int(meta.get("attention.key_length", int(meta.need("embedding_length")) // n_heads))
    if int(meta.get("attention.value_length", head_dim)) != head_dim:
        raise meta.refuse(f"{a}.attention.value_length != {a}.attention.key_length")
    if int(meta.get("rope.dimension_count", head_dim)) != head_dim:
        raise meta.refuse(f"{a}.rope.dimension_count = {meta.get('rope.dimension_count')} (partial rotary)")
    if int(meta.get("expert_count", 0)):
        raise meta.refuse(f"{a}.expert_count = {meta.get('expert_count')} (mixture of experts)")
    if "rope_freqs.weight" in tensor_names:
        raise meta.refuse("tensor rope_freqs.weight (Llama 3.1 'llama3' rope frequency factors)")
    if bad := sorted(n for n in tensor_names if n.endswith(("attn_output.bias", "ffn_up.bias", "ffn_down.bias",
                                                            "ffn_gate.bias")))[:1]:
        raise meta.refuse(f"tensor {bad[0]} (only q/k/v projections may have biases)")
    n_layers = int(meta.need("block_count"))
    # llama.cpp's default when a converter wrote no base (Llama 1/2 configs without rope_theta).
    base = float(meta.get("rope.freq_base", 10_000.0))
    return dict(
        n_heads=n_heads, n_kv_heads=int(meta.get("attention.head_count_kv", n_heads)), head_dim=head_dim,
        layer_kinds=("global",) * n_layers, rope_base_global=base, rope_base_local=base,
        rope_scale_global=meta.rope_scale(), activation="silu", qkv_bias="blk.0.attn_q.bias" in tensor_names,
    )


def _end_markers(tokens, types_field) -> list[int]:
    """Ids of the well-known end-of-turn / end-of-text control tokens present in the vocabulary."""
    pieces = tokens.contents()
    candidates = range(len(pieces)) if types_field is None else np.flatnonzero(
        np.asarray(types_field.contents()) == _CONTROL).tolist()
    found = {pieces[i]: i for i in candidates}
    return [found[m] for m in _END_MARKERS if m in found]


def unpermute_qk_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes convert_hf_to_gguf's Q/K row permutation of llama-architecture files.

    llama.cpp's llama graph applies RoPE to interleaved pairs (x0, x1), (x2, x3), ..., so the
    converter reorders each head's rows from Hugging Face's split-half layout (x_j pairs with
    x_{j+d/2}, which specjax computes) to interleaved: GGUF row 2j is HF row j and row 2j+1 is
    HF row j + d/2. Works on [rows, ...] weights and [rows] biases. Qwen2 files are not permuted
    (llama.cpp runs them with NeoX-style RoPE).
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _param_name(gguf_name: str) -> str:
    base, kind = gguf_name.rsplit(".", 1) if gguf_name.endswith((".weight", ".bias")) else (gguf_name, "")
    name = None
    if base.startswith("blk."):
        _, layer, rest = base.split(".", 2)
        if rest in _BLOCK_NAMES:
            name = f"blocks.{layer}.{_BLOCK_NAMES[rest]}"
    elif base in _GLOBAL_NAMES:
        name = _GLOBAL_NAMES[base]
    if name is None or (kind == "bias" and not name.endswith(".w")):
        return gguf_name  # unknown: reported by build_model as unexpected
    return name.removesuffix(".w") + ".b" if kind == "bias" else name


# Rows dequantized at once: gguf's dequantization makes several float32 temporaries the size of its input, so a
# 262,144-row embedding done whole peaked at 1 GB more than its result.
ROW_SLICE = 16_384


class RowSlice:
    """The rows [r0, r1) of a gguf ReaderTensor, as `quant.block_quant_from_gguf` reads one."""

    def __init__(self, tensor, r0: int, r1: int):
        self.tensor_type, self.data = tensor.tensor_type, tensor.data[r0:r1]


def dequantize_rows(data: np.ndarray, tensor_type) -> np.ndarray:
    """gguf's float32 dequantization of a tensor's data, `ROW_SLICE` rows at a time into one output array."""
    import gguf

    if data.ndim != 2 or data.shape[0] <= ROW_SLICE:
        return np.asarray(gguf.quants.dequantize(data, tensor_type), dtype=np.float32)
    quantized = data.dtype == np.uint8  # block rows (GGUFReader's shapes); float and integer types keep theirs
    out = np.empty(gguf.quants.quant_shape_from_byte_shape(data.shape, tensor_type) if quantized else data.shape,
                   np.float32)
    for r0 in range(0, data.shape[0], ROW_SLICE):
        out[r0:r0 + ROW_SLICE] = gguf.quants.dequantize(data[r0:r0 + ROW_SLICE], tensor_type)
    return out


class LazyTensor:
    """One GGUF tensor in specjax's layout, dequantized only when converted to an array.

    ``build_model(cfg, lazy_weights_from_gguf(reader))`` holds one float32 tensor at a time besides the model.
    """

    def __init__(self, tensor, arch: str, heads: dict[str, int]):
        self._tensor, self._arch, self._heads = tensor, arch, heads
        self.name = _param_name(tensor.name)
        dims = tuple(int(d) for d in tensor.shape)  # GGUF order: the fastest-varying (input) dimension first
        self.shape = dims if self.name.endswith(".w") else dims[::-1]

    def __array__(self, dtype=None, copy=None):
        t = self._tensor
        w = dequantize_rows(t.data, t.tensor_type)
        module = self.name.rsplit(".", 1)[0].split(".", 2)[-1] if self.name.startswith("blocks.") else ""
        if self._arch == "llama" and module in self._heads:
            w = unpermute_qk_rows(w, self._heads[module])
        # gguf stores [out, in] row-major for linear maps; embeddings stay [vocab, d_model].
        w = np.ascontiguousarray(w.T) if self.name.endswith(".w") else w
        return w if dtype is None else w.astype(dtype, copy=False)


def lazy_weights_from_gguf(reader) -> dict[str, LazyTensor]:
    """Every tensor as a `LazyTensor`, by specjax parameter name."""
    arch = _field(reader, "general.architecture")
    n_heads = _field(reader, f"{arch}.attention.head_count")
    heads = {"attn.q": n_heads, "attn.k": _field(reader, f"{arch}.attention.head_count_kv", n_heads)}
    heads = {k: int(v) for k, v in heads.items() if v is not None}
    lazy = [LazyTensor(t, arch, heads) for t in reader.tensors]
    return {t.name: t for t in lazy}


def quantized_head_from_gguf(reader, cfg: ModelConfig) -> dict[str, np.ndarray] | None:
    """Arrays of an exact int8 copy of the output head (specjax.models.quant), or None."""
    from specjax.models.quant import block_quant_from_gguf

    name = "token_embd.weight" if cfg.tie_embeddings else "output.weight"
    tensor = next((t for t in reader.tensors if t.name == name), None)
    if tensor is None:
        return None
    parts = []  # ROW_SLICE rows at a time: float32 temporaries of one slice (the whole head's were 2.7 GB for Gemma)
    for r0 in range(0, int(tensor.data.shape[0]), ROW_SLICE):
        part = block_quant_from_gguf(RowSlice(tensor, r0, r0 + ROW_SLICE))
        if part is None:
            return None
        parts.append(part)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def tokenizer_fields(reader) -> dict[str, Any]:
    """The tokenizer.ggml.* metadata as plain Python values, for specjax.models.tokenizer."""
    def array(key: str) -> list | None:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    pieces = array("tokenizer.ggml.tokens")

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
        "pre": _field(reader, "tokenizer.ggml.pre") or "default",
        "merges": array("tokenizer.ggml.merges"),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }
