"""Model configuration: one frozen dataclass covers Gemma 3 and the Llama / Qwen2 family."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax.numpy as jnp

LayerKind = Literal["global", "local"]
Activation = Literal["gelu_tanh", "silu"]


class ConfigError(ValueError):
    """A model configuration that specjax cannot build (bad or unsupported values)."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    Attributes:
      family: "gemma3", "llama" or "qwen2" (for messages and chat templates only; every
        architectural difference is an explicit field below).
      vocab_size: rows of the embedding table.
      d_model: width of the residual stream.
      n_layers: number of decoder blocks.
      n_heads: query heads.
      n_kv_heads: key/value heads (GQA/MQA when smaller than n_heads).
      head_dim: width of one head.
      ffn_dim: hidden width of the gated MLP.
      layer_kinds: per layer, "global" (full causal) or "local" (sliding window).
      sliding_window: a query at position q sees keys q-sliding_window+1 … q in local layers.
      rope_base_global: RoPE base of global layers.
      rope_base_local: RoPE base of local layers.
      rope_scale_global: linear RoPE position scaling of global layers (1.0 = none).
      query_scale: multiplier applied to queries before the dot product.
      norm_eps: epsilon of every RMSNorm.
      qk_norm: RMSNorm over each query/key head before RoPE (Gemma 3).
      sandwich_norms: extra RMSNorm after attention and after the MLP (Gemma 2/3).
      activation: gate activation of the MLP.
      embed_scale: multiply embeddings by sqrt(d_model) (Gemma).
      tie_embeddings: the output head is the transposed embedding table.
      qkv_bias: biases on the q/k/v projections (Qwen2).
      final_logit_softcap: tanh soft-cap of the logits, or None.
      max_seq_len: longest sequence (prompt + generation) the model supports.
      bos_id, eos_ids, pad_id: special token ids.
    """

    family: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    layer_kinds: tuple[LayerKind, ...]
    sliding_window: int | None = None
    rope_base_global: float = 10_000.0
    rope_base_local: float = 10_000.0
    rope_scale_global: float = 1.0
    query_scale: float | None = None
    norm_eps: float = 1e-6
    qk_norm: bool = False
    sandwich_norms: bool = False
    activation: Activation = "silu"
    embed_scale: bool = False
    tie_embeddings: bool = True
    qkv_bias: bool = False
    final_logit_softcap: float | None = None
    max_seq_len: int = 8192
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0

    def __post_init__(self) -> None:
        if len(self.layer_kinds) != self.n_layers:
            raise ConfigError(
                f"layer_kinds has {len(self.layer_kinds)} entries for n_layers={self.n_layers}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if "local" in self.layer_kinds and not self.sliding_window:
            raise ConfigError("local layers need a positive sliding_window")
        if self.activation not in ("gelu_tanh", "silu"):
            raise ConfigError(f"unknown activation {self.activation!r}")

    @property
    def q_scale(self) -> float:
        """Query multiplier: explicit, else 1/sqrt(head_dim)."""
        return self.query_scale if self.query_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def embed_multiplier(self) -> float:
        return math.sqrt(self.d_model) if self.embed_scale else 1.0

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def gemma3_layer_kinds(n_layers: int, pattern: int = 6) -> tuple[LayerKind, ...]:
    """Gemma 3's interleaving: every `pattern`-th layer (1-based) is global, the rest local."""
    return tuple("global" if (i + 1) % pattern == 0 else "local" for i in range(n_layers))


def gemma3_270m() -> ModelConfig:
    """Gemma 3 270M's shapes (what the embedded GGUF holds); used for abstract checks."""
    return ModelConfig(
        family="gemma3",
        vocab_size=262_144,
        d_model=640,
        n_layers=18,
        n_heads=4,
        n_kv_heads=1,
        head_dim=256,
        ffn_dim=2048,
        layer_kinds=gemma3_layer_kinds(18),
        sliding_window=512,
        rope_base_global=1_000_000.0,
        rope_base_local=10_000.0,
        query_scale=256**-0.5,
        norm_eps=1e-6,
        qk_norm=True,
        sandwich_norms=True,
        activation="gelu_tanh",
        embed_scale=True,
        tie_embeddings=True,
        max_seq_len=32_768,
        bos_id=2,
        eos_ids=(1, 106),
        pad_id=0,
    )


def qwen2_5_coder_1_5b() -> ModelConfig:
    """Qwen2.5-Coder-1.5B-Instruct's shapes (what its GGUF's metadata says); used for abstract checks."""
    return ModelConfig(family="qwen2", vocab_size=151_936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2,
                       head_dim=128, ffn_dim=8960, layer_kinds=("global",) * 28, sliding_window=None,
                       rope_base_global=1_000_000.0, rope_base_local=1_000_000.0, norm_eps=1e-6, activation="silu",
                       tie_embeddings=False, qkv_bias=True, max_seq_len=32_768, bos_id=151_643,
                       eos_ids=(151_645, 151_643), pad_id=151_643)


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def resolve_dtype(name: str):
    """Maps a dtype option to a jnp dtype, with a clear message for anything else."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"dtype={name!r} is not one of {sorted(DTYPES)}") from None


def increasing_layers(layers) -> bool:
    """Whether `layers` are strictly increasing non-negative integer layer indices (fused-layer lists)."""
    return all(isinstance(i, int) and i >= 0 for i in layers) and list(layers) == sorted(set(layers))
