"""A tiny random Llama as a Hugging Face directory (config.json, model.safetensors, tokenizer.json).

Command-line tests run `python -m specjax.decode model=<this directory>` in a subprocess: the real
loading path, in seconds, without the embedded Gemma. The tokenizer is byte-level BPE without merges
(one token per byte, GPT-2's byte alphabet) plus <s>, </s> and ChatML's turn markers, so any text
round-trips and chat=true has a template. Six layers: the README's layer-skip example drafts with four.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8)


def _gpt2_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (what byte-level BPE vocabularies spell)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _tokenizer_json(vocab: dict[str, int]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return tok.to_str()


def write_tiny_hf_model(directory: str | Path, seed: int = 0, max_positions: int = 512,
                        always: str | None = None) -> Path:
    """Writes the tiny model into `directory` (created) and returns it.

    With `always` (one character), the model writes that character at every step, greedy or sampled:
    every token embeds to the same vector, the blocks add nothing, and the head's row for that byte
    points along the normed hidden state (tests of stop strings need a known output).
    """
    from safetensors.numpy import save_file
    from tokenizers import pre_tokenizers

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for special in ("<s>", "</s>", "<|im_start|>", "<|im_end|>"):  # ChatML markers: chat=true works
        vocab[special] = len(vocab)
    n_vocab = len(vocab)
    (d / "tokenizer.json").write_text(_tokenizer_json(vocab), encoding="utf-8")
    config = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=n_vocab, **SHAPE,
                  hidden_act="silu", max_position_embeddings=max_positions, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
                  torch_dtype="float32")
    (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
    rng = np.random.default_rng(seed)
    h, f, hd = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["head_dim"]
    q, kv = SHAPE["num_attention_heads"] * hd, SHAPE["num_key_value_heads"] * hd

    def w(*shape):
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(n_vocab, h), "model.norm.weight": np.ones(h, np.float32),
               "lm_head.weight": w(n_vocab, h)}
    for i in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
                        p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
                        p + "mlp.gate_proj.weight": w(f, h), p + "mlp.up_proj.weight": w(f, h),
                        p + "mlp.down_proj.weight": w(h, f), p + "input_layernorm.weight": np.ones(h, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(h, np.float32)})
    if always is not None:
        e = rng.standard_normal(h).astype(np.float32)
        tensors["model.embed_tokens.weight"] = np.tile(e, (n_vocab, 1))
        for i in range(SHAPE["num_hidden_layers"]):
            tensors[f"model.layers.{i}.self_attn.o_proj.weight"][:] = 0
            tensors[f"model.layers.{i}.mlp.down_proj.weight"][:] = 0
        byte_char = {b: c for b, c in zip(range(256), _gpt2_alphabet(), strict=True)}[always.encode()[0]]
        tensors["lm_head.weight"][vocab[byte_char]] = 10 * e / np.sqrt(np.mean(e * e))
    save_file(tensors, str(d / "model.safetensors"))
    return d
