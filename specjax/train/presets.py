"""Named model shapes for training configs (real checkpoints bring their own config)."""

from __future__ import annotations

from specjax.models.config import ModelConfig, gemma3_270m, qwen2_5_coder_1_5b
from specjax.train.config import ArchConfig, TrainConfigError


def _gemma3(n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, ffn_dim: int) -> ModelConfig:
    return gemma3_270m().replace(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                 ffn_dim=ffn_dim, layer_kinds=_kinds(n_layers))


def _kinds(n_layers: int) -> tuple[str, ...]:
    # Gemma 3's 5 local : 1 global pattern; a draft shorter than 6 layers still gets a global
    # last layer so it sees the whole context.
    kinds = ["global" if (i + 1) % 6 == 0 else "local" for i in range(n_layers)]
    kinds[-1] = "global"
    return tuple(kinds)


def tiny() -> ModelConfig:
    """Test-sized Gemma-3-shaped model (vocab 64)."""
    return gemma3_270m().replace(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                                 ffn_dim=64, layer_kinds=("local", "global"), sliding_window=4,
                                 query_scale=0.25, max_seq_len=512, eos_ids=(1,))


PRESETS = {
    "tiny": tiny,
    "gemma3_270m": gemma3_270m,
    "gemma3_1b": lambda: _gemma3(26, 1152, 4, 1, 6912),
    "gemma3_12b": lambda: _gemma3(48, 3840, 16, 8, 15360),
    "qwen2.5_coder_1.5b": qwen2_5_coder_1_5b,
}
_OVERRIDES = ("d_model", "ffn_dim", "n_heads", "n_kv_heads", "head_dim", "vocab_size")


def model_config(arch: ArchConfig) -> ModelConfig:
    """The ModelConfig of a preset with the ArchConfig's overrides applied.

    Raises:
      TrainConfigError: unknown preset.
    """
    if arch.preset not in PRESETS:
        raise TrainConfigError(f"arch preset {arch.preset!r} is not one of {sorted(PRESETS)}")
    cfg = PRESETS[arch.preset]()
    changes = {k: getattr(arch, k) for k in _OVERRIDES if getattr(arch, k) is not None}
    if arch.n_layers is not None:
        changes["n_layers"] = arch.n_layers
        changes["layer_kinds"] = (_tiny_kinds(arch.n_layers) if arch.preset == "tiny"
                                  else ("global",) * arch.n_layers if cfg.sliding_window is None  # Qwen, Llama
                                  else _kinds(arch.n_layers))
    return cfg.replace(**changes)


def _tiny_kinds(n_layers: int) -> tuple[str, ...]:
    return tuple("global" if i == n_layers - 1 else "local" for i in range(n_layers))
