"""Gemma 3 270M end to end against HF transformers, both reading the embedded GGUF.

Three checks, sharing one model load and a handful of compilations (the file runs in about two
minutes on two CPU cores, half of it transformers reading the GGUF):
  * float32 logits at every position of five prompts (prose, code, chat template, unicode/numbers,
    and a 700+ token prompt that crosses the 512-token sliding window), on identical token ids;
  * a 64-token greedy continuation of three ragged prompts through specjax's batched `Generator`,
    token for token against `generate(do_sample=False)`;
  * cached decoding past the window: prefill N-8 tokens, then 8 single-token steps, against the
    uncached forward.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.decode.generate import GenerateConfig, Generator

pytestmark = pytest.mark.real_model

torch = pytest.importorskip("torch")

PROMPTS_DIR = Path(__file__).parents[2].parent / "shared/data/prompts"

PROSE = ("The Industrial Revolution began in Britain in the late eighteenth century, when new machines "
         "for spinning and weaving cotton moved work from cottages into factories. Within a few decades")
CODE = ("def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
        "    \"\"\"Merges two sorted lists into one sorted list.\"\"\"\n"
        "    out, i, j = [], 0, 0\n"
        "    while i < len(a) and j < len(b):\n")
CHAT_QUESTION = "Explain in two sentences why the sky is blue."
UNICODE = ("Café naïve Straße — 日本語のテキスト, русский, Ελληνικά 😀👍🏽. "
           "π ≈ 3.14159, e = 2.71828; 1,000,000 + 2024-01-31 = ?\n\t0x1F × 7 = 217")

# Max |Δlogit| allowed between specjax and transformers at any position and vocabulary entry.
# Measured on this file (float32, CPU): at most 2.7e-5 on the short prompts and 1.9e-4 on the
# 725-token one; logits reach magnitudes of ~30-50. Both sides dequantize the same Q4_K blocks to
# float32 and then accumulate float32 roundoff (~1e-7 relative) through 18 layers of 640-2048-wide
# matmuls, sandwich RMSNorms and a 640-wide logit dot product, in different summation orders, so
# differences of ~1e-5..1e-4 are expected; 1e-3 leaves 5x headroom over the worst measurement yet is
# far below any real mistake (a wrong RoPE base, norm offset, mask or window edge moves logits by
# 0.1-10).
LOGIT_TOL = 1e-3
CACHE_TOL = 1e-3  # cached vs uncached: same code and dtype, different attention widths / orders.


def long_prompt(tok, min_tokens: int = 700) -> str:
    """Alpaca-eval instructions as a numbered list, until the text reaches `min_tokens` tokens."""
    path = PROMPTS_DIR / "alpaca_eval.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    lines = ["Here is a list of questions people asked an assistant:"]
    with open(path) as f:
        for n, line in enumerate(f, 1):
            lines.append(f"{n}. {json.loads(line)['prompt'].strip()}")
            text = "\n".join(lines)
            if len(tok.encode(text)) >= min_tokens:
                return text
    raise AssertionError("not enough text for the long prompt")


@pytest.fixture(scope="module")
def prompts(real_tokenizer) -> dict[str, str]:
    chat = real_tokenizer.apply_chat_template([{"role": "user", "content": CHAT_QUESTION}])
    return {"prose": PROSE, "code": CODE, "chat": chat, "unicode": UNICODE,
            "long": long_prompt(real_tokenizer)}


@pytest.fixture(scope="module")
def prompt_ids(prompts, real_tokenizer) -> dict[str, list[int]]:
    return {name: real_tokenizer.encode(text) for name, text in prompts.items()}


def _jit_logits(model):
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(tokens_bt):
        m = nnx.merge(graphdef, state)
        t = tokens_bt.shape[1]
        hidden_btd, _ = m(tokens_bt, jnp.broadcast_to(jnp.arange(t), tokens_bt.shape))
        return m.logits(hidden_btd)

    return forward


@pytest.fixture(scope="module")
def our_logits(real_model, prompt_ids) -> dict[str, np.ndarray]:
    """Uncached float32 logits [T, V] per prompt: the short ones in one right-padded batch."""
    forward = _jit_logits(real_model)
    short = [name for name in prompt_ids if name != "long"]
    width = max(len(prompt_ids[n]) for n in short)
    batch = np.zeros((len(short), width), np.int32)  # right padding cannot affect causal rows
    for row, name in enumerate(short):
        batch[row, :len(prompt_ids[name])] = prompt_ids[name]
    out = np.asarray(forward(jnp.asarray(batch)))
    logits = {name: out[row, :len(prompt_ids[name])] for row, name in enumerate(short)}
    logits["long"] = np.asarray(forward(jnp.asarray([prompt_ids["long"]], jnp.int32)))[0]
    return logits


def hf_logits(hf_model, ids: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return hf_model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def test_tokenizer_ids_match_transformers(prompts, prompt_ids, hf_reference):
    _, hf_tok = hf_reference
    for name, text in prompts.items():
        assert prompt_ids[name] == hf_tok(text)["input_ids"], name
    assert len(prompt_ids["long"]) > 600  # past the 512-token sliding window
    assert prompt_ids["chat"][:3] == [2, 105, 2364]  # <bos><start_of_turn>user: the template is parsed


@pytest.mark.parametrize("name", ["prose", "code", "chat", "unicode", "long"])
def test_logits_match_transformers(name, prompt_ids, our_logits, hf_reference):
    hf_model, _ = hf_reference
    ours, ref = our_logits[name], hf_logits(hf_model, prompt_ids[name])
    assert ours.shape == ref.shape == (len(prompt_ids[name]), 262_144)
    diff = np.abs(ours - ref).max(axis=-1)
    print(f"\n{name}: {len(prompt_ids[name])} tokens, max |Δlogit| {diff.max():.3g} "
          f"(at position {diff.argmax()}), max |logit| {np.abs(ref).max():.3g}")
    assert diff.max() < LOGIT_TOL, f"max |Δlogit| {diff.max():.3g} at position {diff.argmax()}"
    top_ours, top_ref = ours.argmax(-1), ref.argmax(-1)
    bad = np.flatnonzero(top_ours != top_ref)
    assert bad.size == 0, f"top-1 differs at positions {bad[:10].tolist()}"


def test_cached_decode_past_the_window_equals_uncached(real_model, prompt_ids, our_logits):
    ids = prompt_ids["long"]
    n, steps = len(ids), 8
    graphdef, state = nnx.split(real_model)

    @jax.jit
    def run(tokens_bt, positions_bt, cache, start_b):
        m = nnx.merge(graphdef, state)
        hidden_btd, cache = m(tokens_bt, positions_bt, cache, start_b)
        return m.logits(hidden_btd[:, -1:])[:, 0], cache

    cache = real_model.init_cache(1, n)
    prefix = jnp.asarray([ids[:n - steps]], jnp.int32)
    _, cache = run(prefix, jnp.arange(n - steps)[None], cache, jnp.zeros((1,), jnp.int32))
    for pos in range(n - steps, n):
        at = jnp.full((1, 1), pos, jnp.int32)
        logits, cache = run(jnp.asarray([[ids[pos]]], jnp.int32), at, cache, at[:, 0])
    diff = np.abs(np.asarray(logits[0]) - our_logits["long"][-1]).max()
    print(f"\ncached vs uncached at position {n - 1}: max |Δlogit| {diff:.3g}")
    assert diff < CACHE_TOL


def test_greedy_continuations_match_transformers(real_model, real_tokenizer, prompts, prompt_ids, hf_reference):
    hf_model, _ = hf_reference
    names = ["prose", "code", "chat"]  # ragged: 3 different lengths in one batch
    assert len({len(prompt_ids[n]) for n in names}) == 3
    eos = list(real_model.cfg.eos_ids)
    outs, _ = Generator(real_model, real_tokenizer).generate(
        [prompts[n] for n in names], GenerateConfig(max_new_tokens=64, batch_size=3))
    for name, out in zip(names, outs, strict=True):
        ids = torch.tensor([prompt_ids[name]])
        with torch.inference_mode():
            ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=64,
                                    eos_token_id=eos, pad_token_id=real_model.cfg.pad_id)
        ref = ref[0, ids.shape[1]:].tolist()
        ref_reason = "eos" if ref[-1] in eos else "length"
        ref_tokens = ref[:-1] if ref_reason == "eos" else ref  # specjax's completions leave EOS out
        if out.tokens != ref_tokens:
            at = next((i for i, (a, b) in enumerate(zip(out.tokens, ref_tokens)) if a != b),
                      min(len(out.tokens), len(ref_tokens)))
            top2 = torch.topk(torch.from_numpy(hf_logits(hf_model, prompt_ids[name] + ref[:at])[-1]), 2).values
            pytest.fail(f"{name}: continuation differs at token {at}: ours {out.tokens[at:at + 5]}, "
                        f"HF {ref[at:at + 5]}; HF top-2 margin there {float(top2[0] - top2[1]):.3g}")
        assert out.finish_reason == ref_reason, name
        print(f"\n{name}: {len(ref)} tokens, finish {out.finish_reason}: {out.text!r}")
