"""weights= from GGUF files: the per-format cache, and greedy / perplexity checks on the real models."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import full_logits
from qwen_model import qwen_gguf_or_skip
from test_gguf_loader import gguf_tensors, tiny_weights, write_gguf

import specjax.models.loading as loading
import specjax.models.weight_formats as wf


@pytest.mark.parametrize("fmt", ["bfloat16", "int8", "q4"])
def test_cached_conversion_equals_the_first_and_the_float_model_packed(fmt, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "tiny.gguf", tensors=gguf_tensors(tiny_weights()))
    said: list[str] = []
    first, _ = loading.load_gguf(path, progress=said.append, weights=fmt)
    assert any("first use only" in s for s in said)
    said.clear()
    again, tok = loading.load_gguf(path, progress=said.append, weights=fmt)
    assert not any("first use only" in s for s in said) and tok.encode("hello")
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith(fmt)]
    reference, _ = loading.load_gguf(path)
    wf.pack_model(reference, fmt)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 200, (2, 8)), jnp.int32)
    want = full_logits(reference, tokens)
    np.testing.assert_array_equal(full_logits(first, tokens), full_logits(again, tokens))
    np.testing.assert_allclose(full_logits(again, tokens), want, rtol=1e-6, atol=1e-6)
    assert again.embed is None and again.embed_packed is not None



@pytest.mark.parametrize("damage", ["weights", "tokenizer"])
def test_an_unreadable_cached_conversion_is_converted_again_once(damage, tmp_path, monkeypatch, capsys):
    """A truncated weights file or a broken tokenizer in the packed folder: one warning line, the folder
    converted again, the same model; unreadable again after that: one ModelFileError, no traceback."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "tiny.gguf", tensors=gguf_tensors(tiny_weights()))
    first, _ = loading.load_gguf(path, weights="q4")
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 200, (2, 8)), jnp.int32)
    want = full_logits(first, tokens)
    del first  # its arrays are the file's pages: cut short under it, its next read of a lost page is a SIGBUS
    (folder,) = (tmp_path / "cache").glob("gguf-packed-*-q4")
    broken = folder / "weights.safetensors" if damage == "weights" else next((folder / "tokenizer").glob("*.json"))
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    capsys.readouterr()
    said: list[str] = []
    again, _ = loading.load_gguf(path, progress=said.append, weights="q4")
    err = capsys.readouterr().err
    assert err.count("warning: the cached weights at") == 1 and "converting again" in err, err
    assert any("first use only" in s for s in said)
    np.testing.assert_array_equal(full_logits(again, tokens), want)

    def convert_badly(gguf, fmt, folder, progress):
        (folder / "config.json").write_text("not json")

    monkeypatch.setattr("specjax.models.packed_cache.convert", convert_badly)
    (folder / "config.json").write_text("{")
    with pytest.raises(loading.ModelFileError, match="is unreadable .*delete that folder"):
        loading.load_gguf(path, weights="q4")


# ---------------------------------------------------------------------------------- real models (slow)
PROMPTS = [
    "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Q: What are the three states of matter?\nA:",
    "Once upon a time, in a small village at the foot of the mountains, there lived",
]
PPL_TEXT = (  # a fixed text for perplexity (public-domain style prose and code), ~700 tokens: on ~80 tokens a
    # format's perplexity moved by 2-4% with the order of float32 sums alone (38th session), on ~1,000 by 0.1%
    "The history of computing is a story of abstraction. Early machines were programmed by rewiring "
    "panels; later, stored programs let the same hardware run many tasks. High-level languages hid the "
    "registers, operating systems hid the devices, and libraries hid the algorithms.\n\n"
    "def mean(values):\n    return sum(values) / len(values)\n\n"
    "Each layer lets people think about what they want to do rather than how the machine does it.\n\n"
    "A river begins as rain on high ground. Water gathers in small channels, the channels join into streams, "
    "and the streams cut valleys over thousands of years. Where the land flattens the river slows, drops the "
    "sand and silt it carried, and wanders in wide loops across its plain. Floods renew the soil of that plain "
    "each spring, which is why so many old cities stand beside rivers: the water brought food, trade and "
    "travel, and it carried away what the city did not want.\n\n"
    "def word_counts(text):\n    counts = {}\n    for word in text.lower().split():\n"
    "        word = word.strip('.,;:!?')\n        if word:\n            counts[word] = counts.get(word, 0) + 1\n"
    "    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))\n\n"
    "Q: Why does a metal spoon feel colder than a wooden one at the same temperature?\n"
    "A: Metal conducts heat much better than wood, so it draws heat away from your hand faster. Your skin "
    "senses the rate at which it loses heat, not the temperature of the object itself.\n\n"
    "The committee met on Tuesday to review the budget for the coming year. Most of the discussion concerned "
    "the library, whose roof needs repair before winter, and the school buses, two of which are older than "
    "the drivers who operate them. The members agreed to delay the new park until the spring, to ask the "
    "county for a loan at a lower rate, and to meet again in three weeks once the engineers have finished "
    "their report.\n\n"
    "class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, item):\n"
    "        self._items.append(item)\n\n    def pop(self):\n        if not self._items:\n"
    "            raise IndexError('pop from an empty stack')\n        return self._items.pop()\n\n"
    "To bake a simple loaf, mix flour, water, salt and a little yeast into a rough dough, cover it, and let it "
    "rest overnight. In the morning fold it a few times, shape it into a ball, and let it rise again until it "
    "has nearly doubled. Bake it in a very hot covered pot for half an hour, then uncover it so the crust can "
    "brown. Let it cool before cutting, or the inside will be gummy.\n\n"
    "In 1609 Galileo heard of a Dutch instrument that made distant things look near, built his own, and turned "
    "it to the sky. He saw mountains on the Moon, four small bodies circling Jupiter, and countless stars in "
    "the pale band of the Milky Way. The moons of Jupiter mattered most: here was a system in which things "
    "plainly went around a body other than the Earth."
)


def continuations(model, tok, prompts: list[str], n: int) -> list[list[int]]:
    """n greedy tokens per prompt (the decode loop, EOS ignored), at batch 1: one-row products are the
    decode path users run most and have their own kernels (`BlockQuant.gemv`); the many-row ones are
    read by `teacher_forced`."""
    from specjax.decode.generate import GenerateConfig, Generator

    comps, _ = Generator(model, tok).generate(prompts, GenerateConfig(max_new_tokens=n, ignore_eos=True,
                                                                      batch_size=1))
    return [c.tokens for c in comps]


def teacher_forced(model, seqs: list[list[int]], firsts: list[int]) -> list[np.ndarray]:
    """Per sequence, the logits predicting seq[first:] from the same prefix: one uncached forward of the
    right-padded batch (causal, so the padding after a sequence changes none of its logits)."""
    tokens = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    for i, seq in enumerate(seqs):
        tokens[i, :len(seq)] = seq
    lg = np.asarray(full_logits(model, jnp.asarray(tokens)))
    return [lg[i, first - 1:len(seq) - 1] for i, (seq, first) in enumerate(zip(seqs, firsts, strict=True))]


def perplexity(model, ids: list[int]) -> float:
    lg = np.asarray(full_logits(model, jnp.asarray([ids], jnp.int32))[0, :-1], np.float64)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    return float(np.exp(np.mean(lse - lg[np.arange(len(ids) - 1), ids[1:]])))


def compare_formats(load, formats, n_tokens: int, report) -> dict:
    """Per format and prompt: the first token where its greedy continuation leaves float32's, and the
    max |Δlogit| with both models reading float32's continuation (the same inputs); perplexities."""
    ref, tok = load("float32")
    prompts = [tok.encode(p) for p in PROMPTS]
    firsts = [len(p) for p in prompts]
    base = continuations(ref, tok, PROMPTS, n_tokens)
    seqs = [p + b for p, b in zip(prompts, base, strict=True)]
    base_lg = teacher_forced(ref, seqs, firsts)
    ppl_ids = tok.encode(PPL_TEXT)
    results = {"float32": {"ppl": perplexity(ref, ppl_ids)}}
    for fmt in formats:
        model = load(fmt)[0]
        got = continuations(model, tok, PROMPTS, n_tokens)
        div = [next((i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b), None)
               for g, w in zip(got, base, strict=True)]
        err = [float(np.abs(lg - want).max())
               for lg, want in zip(teacher_forced(model, seqs, firsts), base_lg, strict=True)]
        results[fmt] = {"first_divergence": div, "max_abs_dlogit": err, "ppl": perplexity(model, ppl_ids)}
        del model
        jax.clear_caches()  # each format's compiled programs hold their own constants and buffers
        report(f"{fmt}: first divergence {div}, max |dlogit| {[round(e, 3) for e in err]}, "
               f"perplexity {results[fmt]['ppl']:.3f} (float32 {results['float32']['ppl']:.3f})")
    return results


def load_format(model, fmt: str):
    """FORMAT or FORMAT:a8 (`activations=int8`)."""
    weights, _, acts = fmt.partition(":")
    return loading.load_model(model, weights=weights, activations="int8" if acts == "a8" else "float32")


@pytest.mark.slow
@pytest.mark.real_model
def test_gemma_formats_against_float32(capsys):
    def load(fmt):  # a fresh model per format: compare_formats drops each after use (RSS stays ~3 GB)
        if fmt == "int8-from-float":  # the lossy path (HF checkpoints): blocks of 32 from float32
            model, tok = loading.load_model(None)
            wf.pack_model(model, "int8")
            return model, tok
        return load_format(None, fmt)

    with capsys.disabled():
        res = compare_formats(load, ["int8", "q4", "bfloat16", "int8-from-float", "q4:a8"], 64, print)
    # The file's own integers: bit-identical weights, so identical greedy output and logits.
    for fmt in ("int8", "q4"):
        assert res[fmt]["first_divergence"] == [None] * len(PROMPTS)
        assert max(res[fmt]["max_abs_dlogit"]) < 1e-3
    # Lossy formats: most prompts agree for all 64 tokens; perplexity within 2% / 5% of float32.
    for fmt, tol in (("bfloat16", 0.02), ("int8-from-float", 0.05)):
        assert sum(d is None for d in res[fmt]["first_divergence"]) >= len(PROMPTS) // 2, res[fmt]
        assert abs(res[fmt]["ppl"] / res["float32"]["ppl"] - 1) < tol, res[fmt]
    # int8 activations: the base model's greedy path is fragile (max |dlogit| 0.9-2.7 where Gemma's activations
    # have outliers; first divergence at 23-61 tokens with XLA's attention, 2026-12-06; at never / 23 / 6 / 22
    # with the fixed-order reductions, 2026-12-07, whose perplexity over ~1,000 tokens of seven texts matched
    # XLA's within 0.01%: a near-tie moved). Perplexity within 2%; half the prompts agree for 16 tokens or more.
    assert abs(res["q4:a8"]["ppl"] / res["float32"]["ppl"] - 1) < 0.02, res["q4:a8"]
    assert sum(d is None or d >= 16 for d in res["q4:a8"]["first_divergence"]) >= len(PROMPTS) // 2, res["q4:a8"]


@pytest.mark.slow
def test_qwen_formats_against_float32(capsys):
    qwen_gguf = qwen_gguf_or_skip()
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if free < 9e9:
        pytest.skip(f"needs ~9 GB free memory for the float32 reference, {free / 1e9:.1f} GB available")
    with capsys.disabled():
        res = compare_formats(lambda fmt: load_format(str(qwen_gguf), fmt), ["q4", "int8", "q4:a8"], 64, print)
    for fmt in ("int8", "q4"):  # Q4_K and Q6_K blocks kept exactly
        assert res[fmt]["first_divergence"] == [None] * len(PROMPTS), res[fmt]
        assert abs(res[fmt]["ppl"] / res["float32"]["ppl"] - 1) < 1e-4
    # int8 activations (llama.cpp's kind of arithmetic; measured 2026-12-06: all 4 prompts identical for 64
    # tokens, max |dlogit| 0.23-0.31, perplexity -0.14%): most prompts agree, perplexity within 1%.
    assert sum(d is None for d in res["q4:a8"]["first_divergence"]) >= len(PROMPTS) // 2, res["q4:a8"]
    assert abs(res["q4:a8"]["ppl"] / res["float32"]["ppl"] - 1) < 0.01, res["q4:a8"]


def test_a_failed_background_build_loads_what_auto_means_without_the_kernels(tmp_path, monkeypatch):
    """weights=auto and activations=auto count on kernels still building (the conversion runs beside the
    compilers); when the build fails, the model is loaded again as "auto" resolves without them."""
    import time

    from specjax.models import native_kernels

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native_kernels, "_PENDING", {})
    monkeypatch.setattr(native_kernels, "_FAILED", set())
    monkeypatch.setattr(native_kernels, "available", lambda kind="float32": False)
    monkeypatch.setattr(native_kernels, "unavailable_reason", lambda kind="float32": "c++ failed: test")
    monkeypatch.setattr(native_kernels, "_is_built", lambda kind: False)
    monkeypatch.setattr(native_kernels, "_toolchain", lambda kind: ("c++", None))
    monkeypatch.setattr(native_kernels, "_build_side_by_side", lambda kinds: time.sleep(0.2))
    path = write_gguf(tmp_path / "tiny.gguf", tensors=gguf_tensors(tiny_weights()))
    said: list[str] = []
    model, tok = loading.load_model(str(path), weights="auto", activations="auto", progress=said.append)
    assert any("did not build (c++ failed: test); loading again without them" in s for s in said)
    assert any("for weights=q4" in s for s in said)  # the conversion it counted on ran
    assert model.embed is not None and model.embed_packed is None and tok.encode("hello")  # float32, as auto is
    assert not native_kernels.int8_path_pending() and not native_kernels.int8_path_expected()
    assert loading.resolved_weights(str(path), "auto") == "float32"


def test_cli_option_loads_the_format_and_refuses_unknown_ones(tmp_path, monkeypatch, capsys):
    from specjax.decode.cli import DecodeOptions, run

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "tiny.gguf", tensors=gguf_tensors(tiny_weights()))
    assert run(DecodeOptions(model=str(path), weights="int3", prompt="hello", max_new_tokens=2)) == 2
    err = capsys.readouterr().err
    assert "error: weights='int3' is not one of auto, float32, bfloat16, int8, q4" in err and "Traceback" not in err
    from specjax.models import native_kernels

    kernels = all(native_kernels.available(k) for k in ("int8", "attention", "rms_norm"))
    assert run(DecodeOptions(model=str(path), weights="q4", prompt="hello", max_new_tokens=3)) == 0
    # activations=auto (the default): int8 where the kernels take q4, else float32
    assert f"weights=q4, activations={'int8' if kernels else 'float32'}" in capsys.readouterr().err
    assert run(DecodeOptions(model=str(path), weights="float32", prompt="hello", max_new_tokens=3)) == 0
    assert "weights=float32, activations=float32" in capsys.readouterr().err
    for bad, why in (({"activations": "int4"}, "error: activations='int4' is not one of auto, float32, int8"),
                     ({"activations": "int8", "weights": "float32"},
                      "error: activations=int8 needs weights=int8 or q4")):
        assert run(DecodeOptions(model=str(path), prompt="hello", max_new_tokens=2, **bad)) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err
    if kernels:
        opts = DecodeOptions(model=str(path), weights="q4", activations="int8", prompt="hi", max_new_tokens=3)
        assert run(opts) == 0
        assert "weights=q4, activations=int8" in capsys.readouterr().err
