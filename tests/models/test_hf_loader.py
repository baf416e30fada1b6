"""Hugging Face directory loader: tiny random transformers checkpoints must give the same logits.

Tolerance: both sides compute in float32 but with different operation orders (PyTorch scales
scores after QK^T, we scale queries before; linear RoPE divides positions instead of
frequencies; different matmul blockings), so logits of O(1-10) differ by a few ulps
accumulated over the layers, ~1e-6-1e-5. ATOL = 1e-4 leaves headroom for that while any real
mapping error (a missing +1 on a norm, a transposed weight, a wrong window or rope base)
moves logits by O(0.1-1).
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import forward, full_logits, logits_of
from safetensors.torch import load_file, save_file
from transformers import (
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specjax.models.config import ConfigError
from specjax.models.hf_loader import config_from_hf, load_hf_model, load_hf_weights
from specjax.models.params import WeightsError

ATOL = 1e-4
VOCAB, T = 128, 16
SHAPES = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=96)
GEMMA_TYPES = ["sliding_attention", "full_attention", "sliding_attention",
               "sliding_attention", "full_attention", "sliding_attention"]


def _gemma_cfg(**kw) -> Gemma3TextConfig:
    args = {**SHAPES, "num_hidden_layers": 6, "layer_types": GEMMA_TYPES, "sliding_window": 4,
            # query_pre_attn_scalar != head_dim and distinct rope bases, so each is checked.
            "query_pre_attn_scalar": 24, "max_position_embeddings": 64,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
            "attn_implementation": "eager", **kw}
    return Gemma3TextConfig(**args)


def _randomize(model: torch.nn.Module, gemma: bool, seed: int = 0) -> torch.nn.Module:
    """O(1) activations and non-trivial norms, so every tensor's mapping shows in the logits.

    Gemma norms are drawn around 0 (the stored w of scale 1 + w), Llama/Qwen2 norms around 1,
    so a missing or spurious +1 changes every norm by 1.
    """
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2).add_(0.0 if gemma else 1.0)
            elif p.ndim == 1:
                p.normal_(0.0, 0.5)  # biases
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return model.eval()


def _tokens(batch: int = 2, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, T)).astype(np.int32)


def _hf_logits(model: torch.nn.Module, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(tokens).long()).logits.float().numpy()


def _our_logits(m, tokens: np.ndarray) -> np.ndarray:
    return np.asarray(full_logits(m, jnp.asarray(tokens)))


def _save(model, path, **kw):
    model.save_pretrained(path, safe_serialization=True, **kw)
    return path


def _check(model, path, **save_kw):
    tokens = _tokens()
    expected = _hf_logits(model, tokens)
    m, cfg = load_hf_model(_save(model, path, **save_kw))
    got = _our_logits(m, tokens)
    assert expected.std() > 0.5  # logits large enough for ATOL to be meaningful
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    return m, cfg


def test_llama_matches_transformers(tmp_path):
    hf = LlamaForCausalLM(LlamaConfig(**SHAPES, rope_scaling={"rope_type": "linear", "factor": 2.0},
                                      rope_theta=500.0, attn_implementation="eager"))
    _, cfg = _check(_randomize(hf, gemma=False), tmp_path)
    assert (cfg.family, cfg.tie_embeddings, cfg.rope_scale_global, cfg.rope_base_global) == (
        "llama", False, 2.0, 500.0)


def test_qwen2_mqa_tied_matches_transformers(tmp_path):
    hf = Qwen2ForCausalLM(Qwen2Config(**{**SHAPES, "num_key_value_heads": 1}, tie_word_embeddings=True,
                                      attn_implementation="eager"))
    _, cfg = _check(_randomize(hf, gemma=False), tmp_path)
    assert cfg.qkv_bias and cfg.tie_embeddings and cfg.n_kv_heads == 1


def test_gemma3_matches_transformers(tmp_path):
    hf = _randomize(Gemma3ForCausalLM(_gemma_cfg(final_logit_softcapping=8.0)), gemma=True)
    _, cfg = _check(hf, tmp_path)
    assert cfg.layer_kinds == ("local", "global", "local", "local", "global", "local")
    assert (cfg.sliding_window, cfg.rope_base_local, cfg.rope_base_global, cfg.rope_scale_global) == (
        4, 100.0, 5000.0, 2.0)
    # The window matters in these sequences: without it the logits differ.
    m, _ = load_hf_model(tmp_path)
    m.cfg = cfg.replace(sliding_window=T)
    assert np.abs(_our_logits(m, _tokens()) - _hf_logits(hf, _tokens())).max() > 100 * ATOL


def test_gemma3_sharded_matches_transformers(tmp_path):
    hf = _randomize(Gemma3ForCausalLM(_gemma_cfg(num_key_value_heads=1)), gemma=True, seed=3)
    _check(hf, tmp_path, max_shard_size="40KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    assert (tmp_path / "model.safetensors.index.json").is_file()
    sorted(tmp_path.glob("model-*.safetensors"))[-1].unlink()
    with pytest.raises(FileNotFoundError, match="names shards that do not exist"):
        load_hf_model(tmp_path)


def test_gemma3_multimodal_wrapper_loads_text_model(tmp_path):
    text = {**_gemma_cfg().to_dict(), "final_logit_softcapping": None}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=127,
                       boi_token_index=125, eoi_token_index=126, eos_token_id=[1, 106],
                       attn_implementation="eager")
    hf = _randomize(Gemma3ForConditionalGeneration(cfg), gemma=True)
    _, ours = _check(hf, tmp_path)
    assert ours.eos_ids[:1] == (1,) and 106 in ours.eos_ids
    # The other nesting of the text model (`model.language_model.*`) loads the same.
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    renamed = {k.replace("language_model.model.", "model.language_model."): v for k, v in tensors.items()}
    assert renamed != tensors
    save_file(renamed, path, metadata={"format": "pt"})
    m, _ = load_hf_model(tmp_path)
    np.testing.assert_allclose(_our_logits(m, _tokens()), _hf_logits(hf, _tokens()), rtol=0, atol=ATOL)


def test_gemma3_cached_decoding_matches_full_forward(tmp_path):
    hf = _randomize(Gemma3ForCausalLM(_gemma_cfg()), gemma=True, seed=5)
    m, _ = load_hf_model(_save(hf, tmp_path))
    tokens = _tokens(batch=2, seed=7)
    full = _our_logits(m, tokens)
    np.testing.assert_allclose(full, _hf_logits(hf, tokens), rtol=0, atol=ATOL)
    b, prefill = tokens.shape[0], 5
    cache = m.init_cache(b, 24)
    positions = jnp.broadcast_to(jnp.arange(prefill), (b, prefill))
    hidden, cache = forward(m, jnp.asarray(tokens[:, :prefill]), positions, cache, jnp.zeros((b,), jnp.int32))
    steps = [np.asarray(logits_of(m, hidden))]
    for p in range(prefill, T):  # well past the window of 4
        pos = jnp.full((b, 1), p, jnp.int32)
        hidden, cache = forward(m, jnp.asarray(tokens[:, p:p + 1]), pos, cache, jnp.full((b,), p, jnp.int32))
        steps.append(np.asarray(logits_of(m, hidden)))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=ATOL)


def test_gemma3_bfloat16(tmp_path):
    """A bf16 checkpoint (numpy cannot read it natively) and bf16 compute.

    Read into float32, the bf16 weights must reproduce transformers run on the same rounded
    weights at ATOL. Computing in bf16 rounds at 2**-9 relative per operation, an error of
    ~1e-2 of the logit scale that has no a-priori absolute bound; so ours must be about as
    accurate as transformers' own bf16 forward, both measured against the float32 reference.
    """
    _save(_randomize(Gemma3ForCausalLM(_gemma_cfg()), gemma=True, seed=9).to(torch.bfloat16), tmp_path)
    # Reloaded rather than cast back with .float(): .to(bfloat16) also rounds the rotary
    # inv_freq buffers, which from_pretrained recomputes.
    reload = lambda dtype: Gemma3ForCausalLM.from_pretrained(tmp_path, dtype=dtype,
                                                             attn_implementation="eager")
    tokens = _tokens()
    reference = _hf_logits(reload(torch.float32), tokens)
    m, cfg = load_hf_model(tmp_path)
    weights = load_hf_weights(tmp_path, cfg)
    assert weights["blocks.0.attn.q.w"].dtype == ml_dtypes.bfloat16
    assert weights["blocks.0.attn_norm.scale"].dtype == np.float32  # the +1 is applied in float32
    np.testing.assert_allclose(_our_logits(m, tokens), reference, rtol=0, atol=ATOL)
    m, _ = load_hf_model(tmp_path, dtype=jnp.bfloat16)
    assert m.embed[...].dtype == jnp.bfloat16
    ours_err = np.abs(_our_logits(m, tokens) - reference).max()
    hf_err = np.abs(_hf_logits(reload(torch.bfloat16), tokens) - reference).max()
    print(f"bf16 max |logit error|: specjax {ours_err:.4f}, transformers {hf_err:.4f}")
    assert ours_err <= 2 * hf_err


def test_default_tables_match_transformers():
    """Hub configs omit keys equal to the transformers defaults, so ours must agree with them."""
    for cls in (LlamaConfig, Qwen2Config, Gemma3TextConfig):
        full = cls().to_dict()
        assert config_from_hf({"model_type": full["model_type"]}) == config_from_hf(full)
    assert config_from_hf({"model_type": "gemma3"}) == config_from_hf(Gemma3Config().to_dict())


def test_old_style_gemma3_config_keys():
    old = {"model_type": "gemma3_text", "num_hidden_layers": 12, "rope_theta": 1e6,
           "rope_local_base_freq": 1e4, "rope_scaling": {"type": "linear", "factor": 8.0},
           "sliding_window_pattern": 3, "hidden_activation": "gelu_pytorch_tanh", "eos_token_id": [1, 106]}
    cfg = config_from_hf(old)
    assert cfg.layer_kinds == ("local", "local", "global") * 4
    assert (cfg.rope_base_global, cfg.rope_base_local, cfg.rope_scale_global) == (1e6, 1e4, 8.0)
    assert cfg.eos_ids == (1, 106) and cfg.q_scale == 256**-0.5


@pytest.mark.parametrize(("change", "match"), [
    ({"model_type": "mistral"}, r"model_type 'mistral' is not supported; supported: \['llama'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope type 'llama3' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"attention_bias": True}, "attention_bias=True is not supported"),
    ({"mlp_bias": True}, "mlp_bias=True is not supported"),
    ({"hidden_act": "gelu"}, "activation 'gelu' is not supported"),
])
def test_unsupported_llama_options(change, match):
    with pytest.raises(ConfigError, match=match):
        config_from_hf({"model_type": "llama", **change})


@pytest.mark.parametrize(("config", "match"), [
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window=True is not supported"),
    ({"model_type": "gemma3_text", "attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not"),
    ({"model_type": "gemma3_text", "rope_parameters": {"sliding_attention": {"rope_type": "linear",
                                                                            "factor": 2.0}}},
     "rope scaling of sliding_attention layers is not supported"),
    ({"model_type": "gemma3_text", "layer_types": ["chunked_attention"] * 26}, "unknown layer_types"),
])
def test_unsupported_other_options(config, match):
    with pytest.raises(ConfigError, match=match):
        config_from_hf(config)


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory .*nope does not exist"):
        load_hf_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        load_hf_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no model.safetensors .* only safetensors is supported"):
        load_hf_model(tmp_path)


def test_unknown_model_type_on_disk(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported"):
        load_hf_model(tmp_path)


def test_missing_and_unexpected_tensors(tmp_path):
    hf = LlamaForCausalLM(LlamaConfig(**SHAPES))
    _save(hf, tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.0.self_attn.q_proj.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"missing \['blocks.0.attn.q.w'\]"):
        load_hf_model(tmp_path)
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(64, 64)
    tensors["model.extra.weight"] = torch.zeros(3)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"unexpected \['model.extra.weight'\]"):
        load_hf_model(tmp_path)


def test_tied_head_must_equal_embedding(tmp_path):
    hf = _randomize(Gemma3ForCausalLM(_gemma_cfg()), gemma=True)
    _save(hf, tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})
    load_hf_model(tmp_path)  # an identical copy is accepted
    tensors["lm_head.weight"] += 1
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(WeightsError, match="lm_head.weight differs from the embedding"):
        load_hf_model(tmp_path)
