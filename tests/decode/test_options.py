"""The decode command's structured options (`decode/options.py`): one source of defaults, nested `spec`,
and the flat spellings of earlier releases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from specjax.decode import GenerateConfig, SamplingConfig, SpecConfig
from specjax.decode.options import FLAT_ALIASES, DecodeOptions, SpecOptions, flat_overrides
from specjax.decode.spec.policy import Adaptive

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def test_the_yaml_holds_no_option_values_only_hydra_settings():
    cfg = yaml.safe_load((CONFIG_DIR / "decode.yaml").read_text())
    assert set(cfg) == {"defaults", "hydra"}
    assert "decode_schema" in cfg["defaults"]


def test_defaults_are_the_library_dataclasses_defaults():
    opts = DecodeOptions()
    gen, sampling = GenerateConfig(), SamplingConfig()
    assert (opts.max_new_tokens, opts.batch_size, opts.chat) == (gen.max_new_tokens, gen.batch_size, gen.chat)
    assert (opts.temperature, opts.top_k, opts.top_p, opts.seed) == (sampling.temperature, sampling.top_k,
                                                                     sampling.top_p, sampling.seed)
    assert opts.spec.config() is None  # method none: plain decoding
    # Every speculation default reaches SpecConfig unchanged, so the two cannot disagree.
    assert SpecOptions(method="ngram").config() == SpecConfig(method="ngram")
    assert SpecConfig().policy() == Adaptive()


def test_flat_keywords_build_the_nested_options():
    opts = DecodeOptions.from_flat(quiet=True, spec="layerskip", spec_k=6, spec_layer_list=[0, 2],
                                   spec_probe_every=8, draft_vocab=0, eagle_top_k=2)
    assert opts.quiet and opts.spec.method == "layerskip" and opts.spec.k == 6
    assert opts.spec.adaptive.probe_every == 8 and opts.spec.drafter.eagle_top_k == 2
    assert opts.spec.config() == SpecConfig(method="layerskip", k=6, layers=(0, 2), probe_every=8, eagle_top_k=2)
    with pytest.raises(TypeError):
        DecodeOptions.from_flat(spec_nonsense=1)


def test_flat_command_line_overrides_are_rewritten_and_others_pass():
    assert flat_overrides(["spec=ngram", "spec_k=8", "draft_model=m.gguf", "+spec_verify_cost=2", "~spec_layers",
                           "spec.k=3", "prompt=spec_k=1", "--cfg", "hydra.run.dir=."]) == [
        "spec.method=ngram", "spec.k=8", "spec.drafter.draft_model=m.gguf", "+spec.adaptive.verify_cost=2",
        "~spec.drafter.layers", "spec.k=3", "prompt=spec_k=1", "--cfg", "hydra.run.dir=."]
    # Every alias points at a real nested field.
    for key in FLAT_ALIASES.values():
        node = DecodeOptions()
        for part in key.split("."):
            assert part in {f.name for f in dataclasses.fields(node)}, key
            node = getattr(node, part)


def test_hydra_composes_flat_spellings_into_the_structured_options():
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="decode_schema", node=DecodeOptions)
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        cfg = compose("decode", overrides=flat_overrides(["spec=ngram", "spec_k=8", "spec_probe_every=4",
                                                          "spec.drafter.max_ngram=2", "max_new_tokens=7"]))
    opts = OmegaConf.to_object(cfg)
    assert isinstance(opts, DecodeOptions) and opts.max_new_tokens == 7
    assert opts.spec.config() == SpecConfig(method="ngram", k=8, probe_every=4, max_ngram=2)
