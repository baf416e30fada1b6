"""GGUF loading: clear errors on bad files, the real file's hyper-parameters, and a tiny round trip.

The tiny files are written with `gguf.GGUFWriter` the way llama.cpp's converter lays out Gemma 3:
llama.cpp tensor names, linear maps stored [out, in], F32 data, `gemma3.*` and `tokenizer.ggml.*`
metadata. The name table below is written out independently of the loader's, so a wrong mapping
or a missing transpose fails the round trip.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import full_logits

import specjax.models.loading as loading
from specjax.models.config import ModelConfig, gemma3_270m, gemma3_layer_kinds
from specjax.models.gguf_loader import ModelFileError, config_from_gguf, open_gguf
from specjax.models.params import build_model, param_shapes
from specjax.models.tokenizer import Tokenizer

gguf = pytest.importorskip("gguf")

# --------------------------------------------------------------------------------------- tiny GGUF files
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "llo", "hello", "▁w", "or", "ld", "▁world"]
TOKENS = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + PIECES
TOKEN_TYPES = [3] * len(SPECIALS) + [6] * 256 + [1] * len(PIECES)  # control, byte, normal
SCORES = [-1000.0] * len(SPECIALS) + [0.0] * 256 + [-float(i) for i in range(len(PIECES))]

N_LAYERS, D, HEADS, KV_HEADS, HEAD_DIM, FFN, WINDOW, CONTEXT = 6, 16, 2, 1, 8, 32, 4, 128
EPS = float(np.float32(1e-6))  # stored as float32

# llama.cpp name → specjax name, and whether the tensor is a linear map (GGUF [out, in]).
_LLAMA_CPP_BLOCK = {
    "attn_q": ("attn.q.w", True), "attn_k": ("attn.k.w", True), "attn_v": ("attn.v.w", True),
    "attn_output": ("attn.o.w", True), "attn_q_norm": ("attn.q_norm.scale", False),
    "attn_k_norm": ("attn.k_norm.scale", False), "attn_norm": ("attn_norm.scale", False),
    "post_attention_norm": ("post_attn_norm.scale", False), "ffn_norm": ("mlp_norm.scale", False),
    "post_ffw_norm": ("post_mlp_norm.scale", False), "ffn_gate": ("mlp.gate.w", True),
    "ffn_up": ("mlp.up.w", True), "ffn_down": ("mlp.down.w", True),
}


def tiny_config() -> ModelConfig:
    """What the loader must read back from the tiny file."""
    return ModelConfig(
        family="gemma3", vocab_size=len(TOKENS), d_model=D, n_layers=N_LAYERS, n_heads=HEADS,
        n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, ffn_dim=FFN, layer_kinds=gemma3_layer_kinds(N_LAYERS),
        sliding_window=WINDOW, rope_base_global=1e6, rope_base_local=10_000.0, query_scale=HEAD_DIM**-0.5,
        norm_eps=EPS, qk_norm=True, sandwich_norms=True, activation="gelu_tanh", embed_scale=True,
        tie_embeddings=True, final_logit_softcap=None, max_seq_len=CONTEXT, bos_id=2, eos_ids=(1, 5), pad_id=0,
    )


def tiny_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random specjax-named weights; norm scales around 1 so activations stay tame."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(tiny_config()).items():
        w = rng.normal(size=shape).astype(np.float32)
        out[name] = 1.0 + 0.1 * w if name.endswith(".scale") else 0.3 * w
    return out


def gguf_tensors(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """specjax weights under llama.cpp names and layout."""
    out = {"token_embd.weight": weights["embed"], "output_norm.weight": weights["final_norm.scale"]}
    for i in range(N_LAYERS):
        for cpp, (ours, linear) in _LLAMA_CPP_BLOCK.items():
            w = weights[f"blocks.{i}.{ours}"]
            out[f"blk.{i}.{cpp}.weight"] = np.ascontiguousarray(w.T) if linear else w
    return out


def write_gguf(path, arch: str = "gemma3", skip: tuple[str, ...] = (), tensors=None, tokenizer: bool = True):
    """A gemma3-style GGUF; `skip` leaves out `{arch}.<key>` metadata entries."""
    w = gguf.GGUFWriter(str(path), arch)
    meta = {
        "context_length": (w.add_uint32, CONTEXT), "embedding_length": (w.add_uint32, D),
        "block_count": (w.add_uint32, N_LAYERS), "feed_forward_length": (w.add_uint32, FFN),
        "attention.head_count": (w.add_uint32, HEADS), "attention.head_count_kv": (w.add_uint32, KV_HEADS),
        "attention.key_length": (w.add_uint32, HEAD_DIM), "attention.value_length": (w.add_uint32, HEAD_DIM),
        "attention.layer_norm_rms_epsilon": (w.add_float32, 1e-6),
        "attention.sliding_window": (w.add_uint32, WINDOW), "rope.freq_base": (w.add_float32, 1e6),
    }
    for key, (add, value) in meta.items():
        if key not in skip:
            add(f"{arch}.{key}", value)
    if tokenizer:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(TOKENS)
        w.add_token_scores(SCORES)
        w.add_token_types(TOKEN_TYPES)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
    for name, array in (tensors or {}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def read_config(path):
    return config_from_gguf(open_gguf(path), path)


# ------------------------------------------------------------------------------------------ bad files
def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "absent.gguf"
    with pytest.raises(ModelFileError, match="model file not found") as e:
        open_gguf(path)
    assert str(path) in str(e.value)
    with pytest.raises(ModelFileError, match="model file not found") as e:
        loading.load_gguf(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("content", [b"", b"GGUF", np.random.default_rng(0).bytes(4096)],
                         ids=["empty", "magic", "random"])
def test_garbage_is_not_a_readable_gguf(tmp_path, content):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match="is not a readable GGUF file") as e:
        open_gguf(path)
    assert str(path) in str(e.value)


def test_unsupported_architecture_is_named(tmp_path):
    path = write_gguf(tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(ModelFileError) as e:
        read_config(path)
    message = str(e.value)
    assert "'mamba' is not supported" in message and "supported: gemma3, llama, qwen2" in message
    assert str(path) in message


@pytest.mark.parametrize("key", ["block_count", "attention.key_length", "attention.head_count",
                                 "embedding_length", "feed_forward_length", "attention.sliding_window",
                                 "rope.freq_base", "attention.layer_norm_rms_epsilon", "context_length"])
def test_missing_metadata_key_is_named(tmp_path, key):
    path = write_gguf(tmp_path / "partial.gguf", skip=(key,))
    with pytest.raises(ModelFileError, match=f"lacks gemma3.{key}$") as e:
        read_config(path)
    assert str(path) in str(e.value)


def test_missing_vocabulary_is_a_model_file_error(tmp_path):
    path = write_gguf(tmp_path / "no_vocab.gguf", tokenizer=False)
    with pytest.raises(ModelFileError, match="tokenizer.ggml.tokens"):
        read_config(path)


def test_load_model_messages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFileError, match="model file not found: nonexistent.gguf"):
        loading.load_model("nonexistent.gguf")
    missing_dir = tmp_path / "some" / "dir-without-config"
    with pytest.raises(ModelFileError, match="no such file or directory") as e:
        loading.load_model(str(missing_dir))
    assert "dir-without-config" in str(e.value) and "gemma3-270m" in str(e.value)
    missing_dir.mkdir(parents=True)  # exists, but holds no checkpoint
    with pytest.raises((ModelFileError, FileNotFoundError), match="no config.json in .*dir-without-config"):
        loading.load_model(str(missing_dir))


# ------------------------------------------------------------------------------------------ round trip
def test_tiny_gemma3_round_trip_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    weights = tiny_weights()
    path = write_gguf(tmp_path / "tiny.gguf", tensors=gguf_tensors(weights))

    model, tok = loading.load_gguf(path)
    assert model.cfg == tiny_config()
    reference = build_model(tiny_config(), weights)
    tokens = jnp.asarray([[2, 270, 271, 268, 4, 100, 277, 5, 1, 9, 33, 264]], jnp.int32)  # 12 > window 4
    expected = np.asarray(full_logits(reference, tokens))
    np.testing.assert_array_equal(np.asarray(full_logits(model, tokens)), expected)

    direct = Tokenizer.from_gguf_fields(TOKENS, SCORES, TOKEN_TYPES, bos_id=2, eos_id=1, unk_id=3, pad_id=0,
                                        add_bos=True, add_space_prefix=False, model="llama")
    text = "hello world <start_of_turn>hi"
    assert tok.encode(text) == direct.encode(text)
    assert tok.encode("hello world")[:2] == [2, TOKENS.index("hello")]
    assert tok.decode(tok.encode(text), skip_special=False) == "<bos>" + text
    assert (tok.bos_id, tok.eos_ids, tok.vocab_size) == (2, (1, 5), len(TOKENS))

    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(entries) == 1 and entries[0].name.startswith("gguf-")  # no leftover temporary folder
    assert {"config.json", "weights.safetensors", "tokenizer"} <= {p.name for p in entries[0].iterdir()}

    def no_reading(*args, **kwargs):
        raise AssertionError("the cached conversion should be used")

    monkeypatch.setattr(loading, "open_gguf", no_reading)
    again, tok2 = loading.load_gguf(path)
    assert again.cfg == model.cfg and tok2.encode(text) == tok.encode(text)
    np.testing.assert_array_equal(np.asarray(full_logits(again, tokens)), expected)


# ---------------------------------------------------------------------------------------- the real file
@pytest.fixture(scope="module")
def real_config():
    from specjax.models.loading import default_model_path

    path = default_model_path()
    return config_from_gguf(open_gguf(path), path)  # ~12 s: gguf parses 262k token strings


@pytest.mark.real_model
def test_real_gemma3_270m_config(real_config):
    cfg = real_config
    assert (cfg.family, cfg.n_layers, cfg.d_model, cfg.ffn_dim) == ("gemma3", 18, 640, 2048)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size) == (4, 1, 256, 262_144)
    assert cfg.q_scale == 1 / 16
    assert [i for i, k in enumerate(cfg.layer_kinds) if k == "global"] == [5, 11, 17]
    assert (cfg.rope_base_global, cfg.rope_base_local, cfg.rope_scale_global) == (1e6, 10_000.0, 1.0)
    assert cfg.sliding_window == 512 and cfg.max_seq_len == 32_768
    assert cfg.tie_embeddings and cfg.final_logit_softcap is None
    assert (cfg.bos_id, cfg.eos_ids, cfg.pad_id) == (2, (1, 106), 0)
    assert cfg.norm_eps == pytest.approx(1e-6)
    assert cfg.qk_norm and cfg.sandwich_norms and cfg.embed_scale and cfg.activation == "gelu_tanh"
    assert cfg.replace(norm_eps=1e-6) == gemma3_270m()  # the abstract config used elsewhere agrees


@pytest.mark.parametrize("qtype", ["Q8_0", "F16"])
def test_row_sliced_dequantization_and_head_copy_equal_the_whole_tensor(monkeypatch, qtype):
    """The float32 conversion dequantizes, and the int8 head copy is recovered, `ROW_SLICE` rows at a time (the
    whole of Gemma's 262,144-row embedding at once peaked at 2.7 GB more): the same arrays as the whole tensor."""
    from types import SimpleNamespace

    import gguf

    from specjax.models import gguf_loader
    from specjax.models.quant import block_quant_from_gguf

    kind = gguf.GGMLQuantizationType[qtype]
    w = np.random.default_rng(0).standard_normal((37, 64)).astype(np.float32)
    tensor = SimpleNamespace(name="output.weight", tensor_type=kind, data=gguf.quants.quantize(w, kind))
    whole = np.asarray(gguf.quants.dequantize(tensor.data, kind), np.float32)
    monkeypatch.setattr(gguf_loader, "ROW_SLICE", 8)  # 37 rows: four whole slices and a short one
    np.testing.assert_array_equal(gguf_loader.dequantize_rows(tensor.data, kind), whole)
    reader, cfg = SimpleNamespace(tensors=[tensor]), SimpleNamespace(tie_embeddings=False)
    head, want = gguf_loader.quantized_head_from_gguf(reader, cfg), block_quant_from_gguf(tensor)
    if qtype == "F16":  # no exact int8 form, sliced or not
        assert head is None and want is None
    else:
        assert head.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(head[k], want[k])
