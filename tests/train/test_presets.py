"""Named model shapes of training configs (`specjax.train.presets`)."""

from __future__ import annotations

import pytest

from specjax.train.config import ArchConfig, TrainConfigError
from specjax.train.presets import PRESETS, model_config


def test_qwen_preset_keeps_every_layer_global_when_cut():
    """Qwen2 has no sliding window: a shortened copy is all global layers (Gemma's 5:1 pattern would
    give it local layers with no window to use)."""
    cfg = model_config(ArchConfig(preset="qwen2.5_coder_1.5b", n_layers=3))
    assert cfg.layer_kinds == ("global",) * 3 and cfg.sliding_window is None
    assert (cfg.d_model, cfg.n_kv_heads, cfg.qkv_bias, cfg.tie_embeddings) == (1536, 2, True, False)


def test_gemma_presets_keep_the_local_global_pattern():
    assert model_config(ArchConfig(preset="gemma3_270m", n_layers=7)).layer_kinds == (
        "local", "local", "local", "local", "local", "global", "global")
    assert model_config(ArchConfig(preset="tiny", n_layers=2)).layer_kinds == ("local", "global")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name):
    cfg = model_config(ArchConfig(preset=name))
    assert len(cfg.layer_kinds) == cfg.n_layers


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(TrainConfigError, match="qwen2.5_coder_1.5b"):
        model_config(ArchConfig(preset="qwen3"))
