"""The on-device loop against a Python oracle on a tiny random model."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from specjax.decode import GenerationError, SamplingConfig, generate_program
from specjax.decode.generate import GenerateConfig, Generator, bucket, prompt_bucket
from specjax.models.params import build_model, model_weights

PROMPTS = ["hello world", "a", "the quick brown fox jumps over", "xyz"]


def greedy_oracle(model, prompt_ids, n, width=64):
    """Plain Python loop over tokens, uncached full forward each time: the reference.

    The sequence is right-padded to a fixed width so the jitted forward compiles once;
    causal attention makes the padding irrelevant to the position read.
    """
    forward = _jitted_forward(model)
    seq = list(prompt_ids)
    for _ in range(n):
        padded = jnp.array([seq + [0] * (width - len(seq))])
        seq.append(int(forward(padded)[0, len(seq) - 1]))
    return seq[len(prompt_ids):]


_FORWARDS = {}


def _jitted_forward(model):
    if id(model) not in _FORWARDS:
        graphdef, state = nnx.split(model)

        @jax.jit
        def argmax_all(tokens_bt):
            m = nnx.merge(graphdef, state)
            h, _ = m(tokens_bt, jnp.arange(tokens_bt.shape[1])[None])
            return jnp.argmax(m.logits(h), -1)

        _FORWARDS[id(model)] = argmax_all
    return _FORWARDS[id(model)]


@pytest.fixture(scope="module")
def gen(tiny_model):
    from conftest import ByteTokenizer

    return Generator(tiny_model, ByteTokenizer())


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_matches_oracle_with_ragged_batches(gen, tiny_model, byte_tokenizer, batch_size):
    outs, stats = gen.generate(PROMPTS, GenerateConfig(max_new_tokens=12, batch_size=batch_size, ignore_eos=True))
    assert stats.new_tokens == 12 * len(PROMPTS)
    for p, o in zip(PROMPTS, outs, strict=True):
        assert o.tokens == greedy_oracle(tiny_model, byte_tokenizer.encode(p), 12)
        assert o.finish_reason == "length"


def test_eos_ends_each_row_on_its_own(tiny_model, byte_tokenizer):
    refs = [greedy_oracle(tiny_model, byte_tokenizer.encode(p), 6) for p in PROMPTS]
    # A token that some row first reaches after a step or more, so EOS lands mid-batch.
    eos = next(t for r in refs for i, t in enumerate(r) if i > 0 and t not in r[:i])
    model = build_model(tiny_model.cfg.replace(eos_ids=(eos,)), model_weights(tiny_model))
    outs, _ = Generator(model, byte_tokenizer).generate(PROMPTS, GenerateConfig(max_new_tokens=6, batch_size=4))
    assert any(o.finish_reason == "eos" for o in outs)
    for full, o in zip(refs, outs, strict=True):
        cut = full.index(eos) if eos in full else 6
        assert o.tokens == full[:cut]
        assert o.finish_reason == ("eos" if eos in full else "length")


def test_stop_string_ends_generation_and_is_cut(gen, tiny_model, byte_tokenizer):
    ref = greedy_oracle(tiny_model, byte_tokenizer.encode(PROMPTS[2]), 10)
    text = byte_tokenizer.decode(ref)
    stop = text[4:6]  # spans tokens 4 and 5
    first = text.find(stop)
    outs, _ = gen.generate([PROMPTS[2]], GenerateConfig(max_new_tokens=10, stop=(stop,)))
    assert outs[0].finish_reason == "stop"
    assert outs[0].text == text[:first]
    assert len(outs[0].tokens) == first + 2  # generation ended on the token completing the stop


def test_no_stop_strings_never_walk_the_vocabulary(tiny_model):
    """Without stop strings the tokenizer's per-token bytes are never computed (a Python walk over 262k ids: 0.5 s of
    every Gemma start); an empty stop string counts as none."""
    from conftest import ByteTokenizer

    calls = []

    class Counting(ByteTokenizer):
        def token_bytes(self):
            calls.append(1)
            return super().token_bytes()

        def decode(self, ids):  # the byte tokenizer's own decode reads its table: not the walk counted here
            return b"".join(ByteTokenizer.token_bytes(self)[i] for i in ids).decode()

    g = Generator(tiny_model, Counting())
    g.generate([PROMPTS[0]], GenerateConfig(max_new_tokens=2))
    g.generate([PROMPTS[0]], GenerateConfig(max_new_tokens=2, stop=("",)))
    assert calls == []
    g.generate([PROMPTS[0]], GenerateConfig(max_new_tokens=2, stop=("zz",)))
    assert calls == [1]


def test_no_recompilation_for_same_shapes(gen):
    cfg = GenerateConfig(max_new_tokens=5, batch_size=2)
    gen.generate(["ab", "cd"], cfg)
    before = len(gen._programs)
    jit_before = generate_program.jit(gen.profile)._cache_size()
    _, stats = gen.generate(["efg", "h", "ijk"], cfg)  # same buckets, partial last batch
    assert len(gen._programs) == before and stats.compiled == 0
    assert generate_program.jit(gen.profile)._cache_size() == jit_before


def test_sampling_is_seeded_and_respects_top_k(gen):
    s = SamplingConfig(temperature=1.0, top_k=1, seed=5)
    greedy, _ = gen.generate(PROMPTS[:2], GenerateConfig(max_new_tokens=8, batch_size=2, ignore_eos=True))
    topk1, _ = gen.generate(PROMPTS[:2], GenerateConfig(max_new_tokens=8, batch_size=2, sampling=s,
                                                        ignore_eos=True))
    assert [o.tokens for o in topk1] == [o.tokens for o in greedy]  # top_k=1 is greedy
    hot = SamplingConfig(temperature=2.0, seed=7)
    a, _ = gen.generate(PROMPTS[:2], GenerateConfig(max_new_tokens=8, batch_size=2, sampling=hot))
    b, _ = gen.generate(PROMPTS[:2], GenerateConfig(max_new_tokens=8, batch_size=2, sampling=hot))
    assert [o.tokens for o in a] == [o.tokens for o in b]


def test_stats_are_filled(gen):
    _, stats = gen.generate(PROMPTS[:2], GenerateConfig(max_new_tokens=8, batch_size=2, ignore_eos=True))
    assert stats.new_tokens == 16 and stats.tokens_per_s > 0 and stats.ms_per_token > 0
    assert 0 < stats.prefill_ms <= stats.ttft_ms
    assert "tok/s" in stats.line()


def test_bad_requests_have_clear_messages(gen):
    with pytest.raises(GenerationError, match="no prompts"):
        gen.generate([], GenerateConfig())
    with pytest.raises(GenerationError, match="exceeds the model's context of 512"):
        gen.generate(["x" * 600], GenerateConfig(max_new_tokens=4))
    with pytest.raises(GenerationError, match="max_new_tokens"):
        GenerateConfig(max_new_tokens=0)
    with pytest.raises(GenerationError, match="batch_size"):
        GenerateConfig(batch_size=0)


def test_bucket():
    assert [bucket(n) for n in (1, 16, 17, 100, 128, 129)] == [16, 16, 32, 128, 128, 256]
    assert [prompt_bucket(n) for n in (1, 16, 17, 24, 25, 33, 48, 49, 67, 97, 129)] == [
        16, 16, 24, 24, 32, 48, 48, 64, 96, 128, 192]
