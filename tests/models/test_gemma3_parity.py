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

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import full_logits
from flax import nnx

from specjax.decode.generate import GenerateConfig, Generator

# Slow tier: ~2.5 min of the default tier on 2 cores (transformers reading the GGUF, the continuations).
pytestmark = [pytest.mark.real_model, pytest.mark.slow]

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
# Measured (float32, CPU): prose 5.5e-5, code 9.0e-5, chat 3.0e-4 (at position 1, where |logit|
# reaches 97), unicode 8.0e-5, long (724 tokens) 8.0e-5; |logit| is ~15-100 elsewhere. Both sides
# dequantize the same Q4_K blocks to float32 and then accumulate float32 roundoff (~1e-7 relative)
# through 18 layers of 640-2048-wide matmuls, sandwich RMSNorms and a 640-wide logit dot product, in
# different summation orders: ~3e-6 of the logit magnitude, i.e. up to ~3e-4. 1e-3 leaves 3x
# headroom over the worst measurement yet catches real mistakes: moving the sliding window by one
# token changes the long prompt's logits by 0.4-0.65, a norm epsilon of 1e-5 by 16, and even a
# local RoPE base of 10001 instead of 10000 by 1.0e-3.
LOGIT_TOL = 1e-3
# Cached vs uncached, same model: measured 2.0e-5 to 2.6e-5 (softmax over 724 cache slots vs over
# the block, one-row vs many-row matmuls: same roundoff scale as above).
CACHE_TOL = 1e-3


def long_prompt(tok, min_tokens: int = 700) -> str:
    """Alpaca-eval instructions as a numbered list, until the text reaches `min_tokens` tokens."""
    path = PROMPTS_DIR / "alpaca_eval.jsonl"
    # The project's data lives beside the checkout (../shared), as in CI; never skip silently.
    assert path.is_file(), f"{path} not found: tests expect the shared/ data folder beside the checkout"
    lines = ["Here is a list of questions people asked an assistant:"]
    with open(path) as f:
        for n, line in enumerate(f, 1):
            lines.append(f"{n}. {json.loads(line)['prompt'].strip()}")
            text = "\n".join(lines)
            if len(tok.encode(text)) >= min_tokens:
                return text
    raise AssertionError("not enough text for the long prompt")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Single-threaded torch: on a small shared CPU, OpenMP workers spinning against JAX's thread
    pool and other processes made transformers' generate ~10x slower (15 ms per tiny matmul)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def prompts(real_tokenizer) -> dict[str, str]:
    chat = real_tokenizer.apply_chat_template([{"role": "user", "content": CHAT_QUESTION}])
    return {"prose": PROSE, "code": CODE, "chat": chat, "unicode": UNICODE,
            "long": long_prompt(real_tokenizer)}


@pytest.fixture(scope="module")
def prompt_ids(prompts, real_tokenizer) -> dict[str, list[int]]:
    return {name: real_tokenizer.encode(text) for name, text in prompts.items()}


@jax.jit(static_argnums=0)
def _cached_step(graphdef, state, tokens_bt, positions_bt, cache, start_b):
    m = nnx.merge(graphdef, state)
    hidden_btd, cache = m(tokens_bt, positions_bt, cache, start_b)
    return m.logits(hidden_btd[:, -1:])[:, 0], cache


@pytest.fixture(scope="module")
def our_logits(real_model, prompt_ids) -> dict[str, np.ndarray]:
    """Uncached float32 logits [T, V] per prompt: the short ones in one right-padded batch."""
    # conftest's full_logits passes the weights as arguments (nnx.jit), never as closure constants: those
    # would become 1 GB of HLO constants and a 20 s compilation instead of 2 s.
    forward = functools.partial(full_logits, real_model)
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
    run = functools.partial(_cached_step, *nnx.split(real_model))
    cache = real_model.init_cache(1, n)
    prefix = jnp.asarray([ids[:n - steps]], jnp.int32)
    _, cache = run(prefix, jnp.arange(n - steps)[None], cache, jnp.zeros((1,), jnp.int32))
    for pos in range(n - steps, n):
        at = jnp.full((1, 1), pos, jnp.int32)
        logits, cache = run(jnp.asarray([[ids[pos]]], jnp.int32), at, cache, at[:, 0])
    diff = np.abs(np.asarray(logits[0]) - our_logits["long"][-1]).max()
    print(f"\ncached vs uncached at position {n - 1}: max |Δlogit| {diff:.3g}")
    assert diff < CACHE_TOL


def hf_greedy(hf_model, rows: list[list[int]], n: int, eos: list[int], pad: int) -> list[list[int]]:
    """`generate(do_sample=False)` on a left-padded batch; each row cut after its first EOS."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                eos_token_id=eos, pad_token_id=pad)
    new = out[:, width:].tolist()
    return [r[:next((i + 1 for i, t in enumerate(r) if t in eos), len(r))] for r in new]


def test_greedy_continuations_match_transformers(real_model, real_tokenizer, prompts, prompt_ids,
                                                 hf_reference):
    hf_model, _ = hf_reference
    names = ["prose", "code", "chat"]  # ragged: three prompt lengths in one batch
    assert len({len(prompt_ids[n]) for n in names}) == 3
    eos = list(real_model.cfg.eos_ids)
    outs, _ = Generator(real_model, real_tokenizer).generate(
        [prompts[n] for n in names], GenerateConfig(max_new_tokens=64, batch_size=3))
    refs = hf_greedy(hf_model, [prompt_ids[n] for n in names], 64, eos, real_model.cfg.pad_id)
    for name, out, ref in zip(names, outs, refs, strict=True):
        ref_reason = "eos" if ref[-1] in eos else "length"
        ref_tokens = ref[:-1] if ref_reason == "eos" else ref  # specjax's completions leave EOS out
        if out.tokens != ref_tokens:
            at = next((i for i, (a, b) in enumerate(zip(out.tokens, ref_tokens, strict=False)) if a != b),
                      min(len(out.tokens), len(ref_tokens)))
            top2 = np.sort(hf_logits(hf_model, prompt_ids[name] + ref[:at])[-1])[-2:]
            pytest.fail(f"{name}: continuation differs at token {at}: ours {out.tokens[at:at + 5]}, "
                        f"HF {ref[at:at + 5]}; HF top-2 margin there {float(top2[1] - top2[0]):.3g}")
        assert out.finish_reason == ref_reason, name
        print(f"\n{name}: {len(ref)} tokens, finish {out.finish_reason}: {out.text!r}")
