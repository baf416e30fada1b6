"""qwen2 and llama GGUF files: tiny random files (tests/models/tiny_gguf.py) against HF transformers.

Two references, both independent of specjax's GGUF code:
  * HF transformers reading the same GGUF (`from_pretrained(folder, gguf_file=...)`: its own dequantization,
    its own undoing of llama.cpp's Q/K permutation, its own tokenizer from the metadata);
  * a transformers model of the same config holding the ground-truth weights (drawn in HF layout before the
    file was written), which also covers what HF's GGUF path ignores (linear RoPE scaling).
The file mixes Q4_K, Q6_K, Q8_0 and F32 tensors, q/k/v biases (qwen2) and an untied head.

Tolerance: both sides run float32 with different operation orders (see test_hf_loader.py); logits of
O(1-10) then differ by ~1e-6-1e-5, so ATOL = 1e-4, while a wrong permutation, bias or norm moves them by O(1).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import full_logits
from tiny_gguf import Tiny, byte_level_vocab, permute, write_tiny_gguf

import specjax.models.loading as loading
from specjax.models.gguf_loader import ModelFileError, config_from_gguf, open_gguf, unpermute_qk_rows

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
TEXTS = ["the other def in  there\n\n\tx = 12345 + 678", "日本語 é ü 🙂 <tool_call> hi", "   spaces   ", "",
         "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>def f(x):\n    return x", "it's  they'll [PAD268]"]
CASES = {"qwen2": Tiny(), "llama": Tiny(arch="llama"), "llama-linear-rope": Tiny(arch="llama", linear_rope=2.0)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    return {name: write_tiny_gguf(folder / f"{name}.gguf", t) for name, t in CASES.items()}


@pytest.fixture(scope="module")
def loaded(files, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECJAX_CACHE", str(cache))
        return {name: loading.load_gguf(path) for name, (path, _) in files.items()}


def reference_model(t: Tiny, state: dict[str, np.ndarray]):
    """A transformers model of the same config holding the ground-truth weights."""
    cls_cfg, cls = ((transformers.Qwen2Config, transformers.Qwen2ForCausalLM) if t.arch == "qwen2" else
                    (transformers.LlamaConfig, transformers.LlamaForCausalLM))
    rope = {"rope_type": "linear", "factor": t.linear_rope} if t.linear_rope else {"rope_type": "default"}
    cfg = cls_cfg(vocab_size=state["model.embed_tokens.weight"].shape[0], hidden_size=t.d_model,
                  num_hidden_layers=t.n_layers, num_attention_heads=t.n_heads, num_key_value_heads=t.n_kv_heads,
                  intermediate_size=t.ffn, rms_norm_eps=t.eps, max_position_embeddings=t.context,
                  rope_parameters={**rope, "rope_theta": t.rope_base}, tie_word_embeddings=False,
                  attn_implementation="eager")
    model = cls(cfg).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(tokens).long()).logits.float().numpy()


def test_unpermute_inverts_the_converters_permutation():
    rng = np.random.default_rng(0)
    for heads, kv in [(4, 4), (4, 2), (8, 1)]:
        q = rng.normal(size=(heads * 16, 24))
        k, bias = rng.normal(size=(kv * 16, 24)), rng.normal(size=kv * 16)
        np.testing.assert_array_equal(unpermute_qk_rows(permute(q, heads, heads), heads), q)
        np.testing.assert_array_equal(unpermute_qk_rows(permute(k, heads, kv), kv), k)
        np.testing.assert_array_equal(unpermute_qk_rows(permute(bias, heads, kv), kv), bias)
        assert not np.array_equal(permute(q, heads, heads), q)


@pytest.mark.parametrize("name", list(CASES))
def test_config_from_metadata(files, loaded, name):
    t, vocab = CASES[name], byte_level_vocab(CASES[name].arch)
    cfg = loaded[name][0].cfg
    assert (cfg.family, cfg.n_layers, cfg.d_model, cfg.ffn_dim) == (t.arch, t.n_layers, t.d_model, t.ffn)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size) == (
        t.n_heads, t.n_kv_heads, t.head_dim, len(vocab["tokens"]))
    assert cfg.layer_kinds == ("global",) * t.n_layers and cfg.sliding_window is None
    assert (cfg.rope_base_global, cfg.rope_scale_global) == (t.rope_base, t.linear_rope or 1.0)
    assert cfg.norm_eps == pytest.approx(t.eps) and cfg.max_seq_len == t.context
    assert not cfg.tie_embeddings and cfg.qkv_bias == (t.arch == "qwen2")
    assert not (cfg.qk_norm or cfg.sandwich_norms or cfg.embed_scale) and cfg.activation == "silu"
    tokens = vocab["tokens"]
    ends = ["<|im_end|>", "<|endoftext|>"] if t.arch == "qwen2" else ["<|end_of_text|>", "<|eot_id|>"]
    assert cfg.eos_ids == tuple(tokens.index(e) for e in ends) and cfg.bos_id == vocab["bos"]


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_tiny_logits_match_transformers_reading_the_gguf(files, loaded, name):
    path, truth = files[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32, attn_implementation="eager").eval()
    state = hf.state_dict()
    for key, value in truth.items():  # the reference holds the ground truth: its GGUF reading is right too
        np.testing.assert_array_equal(state[key].numpy(), value, err_msg=key)
    model, tok = loaded[name]
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": TEXTS[0]}]))
    tokens = np.stack([ids[:24], np.random.default_rng(1).integers(0, model.cfg.vocab_size, 24)]).astype(np.int32)
    expected = hf_logits(hf, tokens)
    assert expected.std() > 0.5  # logits large enough for ATOL to mean something
    np.testing.assert_allclose(np.asarray(full_logits(model, jnp.asarray(tokens))), expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_tiny_logits_match_a_transformers_model_of_the_same_weights(files, loaded, name):
    _, truth = files[name]
    model = loaded[name][0]
    tokens = np.random.default_rng(2).integers(0, model.cfg.vocab_size, (2, 40)).astype(np.int32)
    expected = hf_logits(reference_model(CASES[name], truth), tokens)
    assert expected.std() > 0.5
    np.testing.assert_allclose(np.asarray(full_logits(model, jnp.asarray(tokens))), expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_tiny_tokenizer_and_chat_template_match_transformers(files, loaded, name):
    path, _ = files[name]
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = loaded[name][1]
    for text in TEXTS:
        assert tok.encode(text, add_bos=False) == ref(text, add_special_tokens=False).input_ids, text
        assert tok.decode(tok.encode(text, add_bos=False), skip_special=False) == text
    assert tok.add_bos == (name == "llama")
    for messages in ([{"role": "user", "content": "hi"}],
                     [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                      {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}]):
        text = tok.apply_chat_template(messages)
        assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tok.apply_chat_template(messages, add_generation_prompt=False) == ref.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).startswith(
        "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n")  # the template's default system prompt
    im_start = tok.encode("<|im_start|>", add_bos=False)
    assert len(im_start) == 1 or name == "llama"  # a control token of the qwen2 vocabulary stays whole


# ------------------------------------------------------------------------------------------- refusals
def _refused(tmp_path, message: str, t: Tiny = CASES["qwen2"], **kwargs) -> str:
    path, _ = write_tiny_gguf(tmp_path / "bad.gguf", t, **kwargs)
    with pytest.raises(ModelFileError) as e:
        config_from_gguf(open_gguf(path), path)
    assert message in str(e.value) and str(path) in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                                 "context_length", "attention.layer_norm_rms_epsilon"])
def test_missing_key_is_named(tmp_path, key):
    _refused(tmp_path, f"GGUF metadata lacks qwen2.{key}", skip=(key,))


def test_unsupported_rope_scaling_is_named(tmp_path):
    _refused(tmp_path, "qwen2.rope.scaling.type = 'yarn' (supported: none, linear) is not supported",
             extra={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0})


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(extra_tensors={"rope_freqs.weight": (np.ones(32, np.float32), None)}), "tensor rope_freqs.weight"),
    (dict(extra={"expert_count": 8}), "llama.expert_count = 8"),
    (dict(skip=("rope.dimension_count",), extra={"rope.dimension_count": 32}), "llama.rope.dimension_count = 32"),
    (dict(extra_tensors={"blk.0.attn_output.bias": (np.ones(256, np.float32), None)}),
     "tensor blk.0.attn_output.bias"),
])
def test_unsupported_llama_features_are_named(tmp_path, kwargs, message):
    _refused(tmp_path, message, Tiny(arch="llama"), **kwargs)


def test_missing_linear_factor_is_named(tmp_path):
    _refused(tmp_path, "lacks qwen2.rope.scaling.factor", extra={"rope.scaling.type": "linear"})


def test_cli_prints_one_error_line(tmp_path, capsys):
    from specjax.decode.cli import DecodeOptions, run

    path, _ = write_tiny_gguf(tmp_path / "yarn.gguf", CASES["qwen2"], extra={"rope.scaling.type": "yarn"})
    assert run(DecodeOptions(model=str(path), prompt="hi", quiet=True)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "qwen2.rope.scaling.type" in err[0]


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_lazy_weights_build_the_same_model(files, loaded, name, monkeypatch):
    import dataclasses

    from specjax.models import backend_profile, transformer
    from specjax.models.gguf_loader import lazy_weights_from_gguf
    from specjax.models.params import build_model

    # The loaded model also holds the file's exact int8 head, which the native kernel would sum in another
    # order than the float32 table's product; the XLA path's block-wise product sums like the table's.
    prof = dataclasses.replace(backend_profile.CPU, native_max_rows=0)
    monkeypatch.setattr(transformer, "profile_for", lambda backend=None: prof)

    path, _ = files[name]
    reader = open_gguf(path)
    lazy = lazy_weights_from_gguf(reader)
    assert all(tuple(t.shape) == np.asarray(t).shape for t in lazy.values())  # shapes known before dequantizing
    model = build_model(config_from_gguf(reader, path), lazy)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, model.cfg.vocab_size, (1, 12)), jnp.int32)
    np.testing.assert_array_equal(np.asarray(full_logits(model, tokens)),
                                  np.asarray(full_logits(loaded[name][0], tokens)))
