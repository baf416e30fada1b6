"""Tiny random qwen2 / llama GGUF files laid out as llama.cpp's convert_hf_to_gguf.py writes them.

Weights are drawn in Hugging Face's layout and stored the converter's way: linear maps [out, in], the llama
architecture's Q/K rows permuted for llama.cpp's interleaved RoPE (the converter's formula, copied below),
Qwen2's not. Quantized tensors are random blocks of real formats (Q4_K and Q6_K, as in Qwen2.5's Q4_K_M
file, and Q8_0): the dequantized values are the ground truth handed to the references.
"""

from __future__ import annotations

import dataclasses

import numpy as np

gguf = __import__("gguf")
Q = gguf.GGMLQuantizationType

CHATML_TEMPLATE = (  # Qwen2.5's template without its tools branch: a default system prompt when none is given
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclasses.dataclass(frozen=True)
class Tiny:
    """Shapes of a tiny model; 256-wide inputs so K-quant blocks (256 values) fit every matrix."""

    arch: str = "qwen2"
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn: int = 512
    context: int = 64
    rope_base: float = 10_000.0
    eps: float = 1e-6
    linear_rope: float | None = None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def byte_level_vocab(arch: str) -> dict:
    """A GPT-2 style vocabulary: the 256 byte pieces, a few merges, control and unused tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spell = bytes_to_unicode()
    g = spell[ord(" ")]
    pieces = [spell[b] for b in range(256)] + [g + "t", "he", g + "th", "er", g + "the", "in", g + "in", "def"]
    merges = [f"{g} t", "h e", f"{g}t h", "e r", f"{g}th e", "i n", f"{g} in", "d e", "de f"]
    pieces = pieces[:-1] + ["de", "def"]
    if arch == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        ids = dict(bos=len(pieces), eos=len(pieces) + 2, pad=len(pieces))
        pre, add_bos = "qwen2", False
    else:
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
        ids = dict(bos=len(pieces), eos=len(pieces) + 1, pad=len(pieces) + 1)
        pre, add_bos = "llama-bpe", True
    tokens = pieces + specials + ["<tool_call>", "[PAD268]", "[PAD269]"]
    types = [1] * len(pieces) + [3] * len(specials) + [4, 5, 5]
    return dict(tokens=tokens, types=types, merges=merges, pre=pre, add_bos=add_bos, **ids)


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF split-half rows -> llama.cpp interleaved rows)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_blocks(qtype, rows: int, cols: int, rng, scale: float) -> np.ndarray:
    """Random bytes of `qtype` with sane float16 block scales; dequantized values are O(scale)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.Q8_0:
        return gguf.quants.quantize(rng.normal(0, scale, (rows, cols)).astype(np.float32), Q.Q8_0)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    f16 = lambda v: np.frombuffer(np.float16(v).tobytes(), np.uint8)
    # As llama.cpp quantizes, each block's largest scale (and min) integer is the format's extreme: 63 for Q4_K,
    # -128 for Q6_K (specjax's int8 kernel keeps such scales compact, tile_layout.factor_blocks).
    if qtype == Q.Q4_K:  # d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        raw[..., 0:2] = f16(2 * scale / (63 * 15))
        raw[..., 2:4] = f16(scale / 63)
        raw[..., 4] |= 0x3F  # sub-block 0's scale: 63
        raw[..., 8] |= 0x3F  # and its min
    elif qtype == Q.Q6_K:  # 128 + 64 bytes of 6-bit values, 16 int8 scales, d (f16)
        scales = rng.integers(-64, 64, (rows, cols // block, 16)).astype(np.int8)
        scales[..., 0] = -128
        raw[..., 192:208] = scales.view(np.uint8)
        raw[..., 208:210] = f16(scale / (64 * 32))
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, -1)


# Storage of each tensor (the Q4_K_M mix: Q4_K mostly, Q6_K for v / down / output), some F32 and Q8_0.
_FORMATS = {"token_embd": Q.Q4_K, "output": Q.Q6_K, "attn_q": Q.Q4_K, "attn_k": Q.Q8_0, "attn_v": Q.Q6_K,
            "attn_output": Q.F32, "ffn_gate": Q.Q4_K, "ffn_up": Q.Q8_0, "ffn_down": Q.Q6_K}
_HF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}


def tiny_tensors(t: Tiny, vocab: int, seed: int = 0) -> tuple[dict, dict]:
    """(GGUF tensors {name: (array, raw qtype or None)}, HF state dict of the same values as float32)."""
    rng = np.random.default_rng(seed)
    gguf_t, hf = {}, {}
    kv = t.n_kv_heads * t.head_dim
    shapes = {"token_embd": (vocab, t.d_model), "output": (vocab, t.d_model), "attn_q": (t.d_model, t.d_model),
              "attn_k": (kv, t.d_model), "attn_v": (kv, t.d_model), "attn_output": (t.d_model, t.d_model),
              "ffn_gate": (t.ffn, t.d_model), "ffn_up": (t.ffn, t.d_model), "ffn_down": (t.d_model, t.ffn)}

    def matrix(base: str, gguf_name: str, hf_name: str) -> None:
        rows, cols = shapes[base]
        qtype = _FORMATS[base]
        scale = {"token_embd": 1.0, "output": 6 * cols**-0.5}.get(base, 1.5 * cols**-0.5)  # O(1) logits
        if qtype == Q.F32:
            data = rng.normal(0, scale, (rows, cols)).astype(np.float32)
            values = data
        else:
            data = random_blocks(qtype, rows, cols, rng, scale)
            values = gguf.quants.dequantize(data, qtype).astype(np.float32)
        heads = {"attn_q": (t.n_heads, t.n_heads), "attn_k": (t.n_heads, t.n_kv_heads)}.get(base)
        stored = permute(data, *heads) if t.arch == "llama" and heads else data
        gguf_t[gguf_name] = (np.ascontiguousarray(stored), None if qtype == Q.F32 else qtype)
        hf[hf_name] = values

    def vector(gguf_name: str, hf_name: str, n: int, around: float, heads=None) -> None:
        v = (around + rng.normal(0, 0.3 if around == 0 else 0.1, n)).astype(np.float32)
        stored = permute(v, *heads) if t.arch == "llama" and heads else v
        gguf_t[gguf_name], hf[hf_name] = (np.ascontiguousarray(stored), None), v

    matrix("token_embd", "token_embd.weight", "model.embed_tokens.weight")
    matrix("output", "output.weight", "lm_head.weight")
    vector("output_norm.weight", "model.norm.weight", t.d_model, 1.0)
    for i in range(t.n_layers):
        for base, hf_base in _HF_NAMES.items():
            matrix(base, f"blk.{i}.{base}.weight", f"model.layers.{i}.{hf_base}.weight")
        biases = [("q", t.d_model, (t.n_heads, t.n_heads)), ("k", kv, (t.n_heads, t.n_kv_heads)), ("v", kv, None)]
        for proj, n, heads in biases if t.arch == "qwen2" else []:  # Llama has no q/k/v biases
            vector(f"blk.{i}.attn_{proj}.bias", f"model.layers.{i}.self_attn.{proj}_proj.bias", n, 0.0, heads)
        vector(f"blk.{i}.attn_norm.weight", f"model.layers.{i}.input_layernorm.weight", t.d_model, 1.0)
        vector(f"blk.{i}.ffn_norm.weight", f"model.layers.{i}.post_attention_layernorm.weight", t.d_model, 1.0)
    return gguf_t, hf


def write_tiny_gguf(path, t: Tiny, skip: tuple[str, ...] = (), extra: dict | None = None,
                    extra_tensors: dict | None = None, seed: int = 0):
    """Writes the file; returns (path, HF state dict). `skip` leaves out `{arch}.<key>` entries, `extra`
    adds `{arch}.<key>: value` entries (str or int or float)."""
    vocab = byte_level_vocab(t.arch)
    tensors, hf = tiny_tensors(t, len(vocab["tokens"]), seed)
    w = gguf.GGUFWriter(str(path), t.arch)
    a = t.arch
    meta = {"context_length": (w.add_uint32, t.context), "embedding_length": (w.add_uint32, t.d_model),
            "block_count": (w.add_uint32, t.n_layers), "feed_forward_length": (w.add_uint32, t.ffn),
            "attention.head_count": (w.add_uint32, t.n_heads), "attention.head_count_kv": (w.add_uint32, t.n_kv_heads),
            "attention.layer_norm_rms_epsilon": (w.add_float32, t.eps), "rope.freq_base": (w.add_float32, t.rope_base)}
    if t.arch == "llama":
        meta["rope.dimension_count"] = (w.add_uint32, t.head_dim)
    if t.linear_rope:
        meta["rope.scaling.type"] = (w.add_string, "linear")
        meta["rope.scaling.factor"] = (w.add_float32, t.linear_rope)
    for key, (add, value) in meta.items():
        if key not in skip:
            add(f"{a}.{key}", value)
    for key, value in (extra or {}).items():
        add = w.add_string if isinstance(value, str) else w.add_uint32 if isinstance(value, int) else w.add_float32
        add(f"{a}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    w.add_pad_token_id(vocab["pad"])
    w.add_add_bos_token(vocab["add_bos"])
    if t.arch == "llama":
        w.add_eot_token_id(vocab["eos"] + 1)
    w.add_chat_template(CHATML_TEMPLATE)
    for name, (array, qtype) in {**tensors, **(extra_tensors or {})}.items():
        w.add_tensor(name, array, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, hf
