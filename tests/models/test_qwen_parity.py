"""The real Qwen2.5-Coder-1.5B-Instruct GGUF (the `qwen` extra) against HF transformers reading the same file.

HF runs first, in a subprocess (tests/models/qwen_hf_reference.py) that saves its outputs as .npy and exits,
so its float32 copy (6.2 GB) is freed before specjax builds its own from the GGUF tensor by tensor: the test
never holds two models (measured peak 10.9 GB RSS: one float32 model, its jitted programs and buffers).

Checked on three chat-templated prompts (HumanEval code, a SpecBench writing prompt, a Chinese one): top-1 at
every prompt position, max |Δlogit|, and a 64-token greedy continuation; plus tokenizer ids on varied text.

Tolerance: both sides dequantize the Q4_K/Q6_K blocks to identical float32 values (the tiny-file tests check
this bit for bit), so the logits differ only by float32 roundoff accumulated in different summation orders.
The Gemma 3 270M parity (test_gemma3_parity.py, 18 layers, 640-2048 wide) measures up to 3e-4, i.e. ~3e-6
of the logit magnitude; Qwen2.5-1.5B has 28 layers, 1536-8960 wide matmuls and logits of ~10-40, so the same
relative roundoff, scaled by depth and width, stays near 1e-3. LOGIT_TOL = 1e-2 leaves ~10x headroom for it,
while mapping mistakes are far larger: a missing Q/K un-permutation moves the tiny model's logits by 7.6, a
norm epsilon of 1e-5 moves Gemma's by 16 (subtler slips, a RoPE base of 10001, move them by ~1e-3 and are
left to the tiny-file tests, where ATOL is 1e-4). The printed numbers are the measurement.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from qwen_model import qwen_gguf_or_skip

pytestmark = pytest.mark.slow

LOGIT_TOL = 1e-2
STEPS = 64
_ROOTS = [Path(__file__).parents[2].parent, Path(__file__).parents[2].parent.parent]  # checkout or worktree
PROMPTS = next((r / "shared/data/prompts" for r in _ROOTS if (r / "shared/data/prompts").is_dir()), None)
TEXTS = [
    "def reverse(s: str) -> str:\n    return s[::-1]\n\n\nclass Foo(Bar):\n\tpass  # tab\n",
    "naïve café — “quotes” ½ ∑ x² → ∞, ÅÉÎ, ﬁ ligature, Ελληνικά, русский",
    "emoji 🙂👍🏽🇫🇷 and ZWJ 👩‍💻 done",
    "spaces:      eight   and\n\n\n\nnewlines\r\n\tand tabs\t\t\t|",
    "中文：请写一个函数，把字符串反转。谢谢！1234567890",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|><tool_call>",
    "numbers 3.14159 1,000,000 0x1F and 2026-12-01T12:00:00Z",
    "",
]


def _conversations() -> list[list[dict]]:
    assert PROMPTS is not None, "tests expect the shared/ data folder beside the checkout"
    first = lambda name: json.loads((PROMPTS / name).read_text().splitlines()[0])["prompt"]
    return [[{"role": "user", "content": first("humaneval_dev.jsonl")}],
            [{"role": "user", "content": first("specbench_dev.jsonl")}],
            [{"role": "system", "content": "你是一个乐于助人的编程助手。"},
             {"role": "user", "content": "用Python写一个函数，判断一个字符串是否是回文，并解释思路。"}]]


@pytest.fixture(scope="module")
def qwen_path() -> Path:
    return qwen_gguf_or_skip()


@pytest.fixture(scope="module")
def our_tokenizer(qwen_path):
    from specjax.models.gguf_loader import open_gguf, tokenizer_fields
    from specjax.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf_fields(**tokenizer_fields(open_gguf(qwen_path)))


@pytest.fixture(scope="module")
def reference(qwen_path, tmp_path_factory):
    path = qwen_path
    out = tmp_path_factory.mktemp("qwen_hf")
    job = out / "job.json"
    job.write_text(json.dumps({"conversations": _conversations(), "texts": [], "steps": STEPS}))
    t0 = time.perf_counter()
    script = Path(__file__).with_name("qwen_hf_reference.py")
    subprocess.run([sys.executable, str(script), str(path), str(job), str(out)], check=True, timeout=3600)
    print(f"\nHF reference: {time.perf_counter() - t0:.0f} s")
    return path, out


@pytest.fixture(scope="module")
def ours(reference, our_tokenizer):
    from specjax.models.gguf_loader import config_from_gguf, lazy_weights_from_gguf, open_gguf
    from specjax.models.params import build_model

    path, _ = reference
    t0 = time.perf_counter()
    reader = open_gguf(path)
    model = build_model(config_from_gguf(reader, path), lazy_weights_from_gguf(reader))
    print(f"\nspecjax load: {time.perf_counter() - t0:.0f} s")
    return _Jitted(model), our_tokenizer


class _Jitted:
    """The model's forward and head as `jax.jit` over its split state.

    Why not conftest's `nnx.jit` helpers: for a 6.2 GB float32 model they held further copies of the weights
    (the test was killed at 19.4 GB RSS); a plain `jax.jit` of a pure function of the state holds one.
    """

    def __init__(self, model):
        self.graph, self.state = nnx.split(model)
        self.init_cache = model.init_cache
        merge = lambda state: nnx.merge(self.graph, state)
        self._forward = jax.jit(lambda st, *args: merge(st)(*args))
        self._logits = jax.jit(lambda st, hidden: merge(st).logits(hidden))

    def forward(self, tokens_bt, positions_bt, cache=None, start_b=None):
        return self._forward(self.state, tokens_bt, positions_bt, cache, start_b)

    def logits(self, hidden_btd):
        return self._logits(self.state, hidden_btd)

    def full_logits(self, tokens_bt):
        t = tokens_bt.shape[1]
        return self.logits(self.forward(tokens_bt, jnp.arange(t)[None])[0])


def test_tokenizer_ids_match_transformers(qwen_path, our_tokenizer):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen_path.parent), gguf_file=qwen_path.name)
    for text in TEXTS:
        ids = ref(text, add_special_tokens=False).input_ids
        assert our_tokenizer.encode(text) == ids, text
        assert our_tokenizer.decode(ids, skip_special=False) == text
    assert our_tokenizer.encode("<|im_start|><|im_end|><|endoftext|>") == [151644, 151645, 151643]


def _greedy(model: _Jitted, prompt: np.ndarray, steps: int) -> list[int]:
    cache = model.init_cache(1, len(prompt) + steps)
    start = jnp.zeros((1,), jnp.int32)
    hidden, cache = model.forward(jnp.asarray(prompt[None]), jnp.arange(len(prompt))[None], cache, start)
    nxt, out = int(jnp.argmax(model.logits(hidden[:, -1:]))), []
    for i in range(steps):
        out.append(nxt)
        pos = jnp.asarray([[len(prompt) + i]], jnp.int32)
        hidden, cache = model.forward(jnp.asarray([[nxt]], jnp.int32), pos, cache, pos[:, 0])
        nxt = int(jnp.argmax(model.logits(hidden)))
    return out


@pytest.mark.parametrize("i", range(3))
def test_logits_and_greedy_continuation_match_transformers(reference, ours, i):
    _, out = reference
    model, tok = ours
    prompt = np.load(out / f"prompt_{i}.npy")
    assert tok.encode(tok.apply_chat_template(_conversations()[i])) == prompt.tolist()  # same template, same ids
    expected = np.load(out / f"logits_{i}.npy")
    got = np.asarray(model.full_logits(jnp.asarray(prompt[None])))[0]
    delta = np.abs(got - expected).max()
    top1 = (got.argmax(-1) == expected.argmax(-1)).mean()
    greedy, want = _greedy(model, prompt, STEPS), np.load(out / f"greedy_{i}.npy").tolist()
    first = next((n for n, (a, b) in enumerate(zip(greedy, want, strict=True)) if a != b), None)
    print(f"\nprompt {i}: {len(prompt)} tokens, max |dlogit| {delta:.2e}, top-1 agreement {top1:.3f}, "
          f"greedy first divergence {first}; ours: {tok.decode(greedy)!r}")
    assert top1 == 1.0 and delta < LOGIT_TOL
    assert greedy == want
    jax.clear_caches()  # programs of this prompt length are not reused


def test_the_qwen_preset_is_the_files_config(qwen_path):
    """`config.qwen2_5_coder_1_5b()` (the training presets' shape for abstract checks) is what the GGUF says."""
    from specjax.models.config import qwen2_5_coder_1_5b
    from specjax.models.gguf_loader import config_from_gguf, open_gguf

    from_file = config_from_gguf(open_gguf(qwen_path), qwen_path)
    preset = qwen2_5_coder_1_5b()
    assert from_file.norm_eps == pytest.approx(preset.norm_eps)  # the file stores 1e-6 as a float32
    assert from_file.replace(norm_eps=preset.norm_eps) == preset
