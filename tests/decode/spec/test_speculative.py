"""The speculative program end to end on tiny models.

Two models:
  * the random tiny model of conftest: greedy speculative decoding must reproduce the plain
    `Generator` token for token (its continuations repeat tokens, so n-gram drafts get
    accepted, but any new token comes as a correction);
  * a "bigram" model — the same architecture with attention and MLP outputs zeroed and a
    head built so that the next token is PERM[current token]. Its continuations are known
    exactly and cycle through the prompt, so drafts are accepted whole: this is how EOS,
    max_new_tokens and stop strings are made to land strictly inside an accepted block.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer, forward, full_logits, tiny_config
from flax import nnx

from specjax.decode import (
    GenerateConfig,
    GenerationError,
    Generator,
    SamplingConfig,
    SpecConfig,
    SpeculativeGenerator,
    speculative_program,
)
from specjax.decode.spec.drafters.ngram import NgramDrafter, ngram_propose
from specjax.models import Transformer
from specjax.models.params import build_model, model_weights

PROMPTS = ["abcabcabcabc", "hello hello", "xyz", "the cat the cat"]  # one prompt bucket (16)
K = 4


@pytest.fixture(scope="module")
def plain(tiny_model):
    return Generator(tiny_model, ByteTokenizer())


@pytest.fixture(scope="module")
def spec(tiny_model):
    return SpeculativeGenerator(tiny_model, ByteTokenizer())


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_equals_plain_greedy(plain, spec, batch_size):
    cfg = GenerateConfig(max_new_tokens=16, batch_size=batch_size, ignore_eos=True)
    ref, _ = plain.generate(PROMPTS, cfg)
    # In a batch the adaptive policy would stay plain while one row ("xyz") has no draft, so the batch runs
    # without it: every round speculates.
    out, stats = spec.generate(PROMPTS, cfg, SpecConfig(k=K, adaptive=batch_size == 1))
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert all(o.finish_reason == "length" for o in out)
    # Drafts were accepted: fewer target forwards than tokens.
    assert stats.new_tokens == 16 * len(PROMPTS) and stats.tau > 1.5, stats.line()
    assert stats.rounds < 15 * len(PROMPTS)
    assert len(stats.acceptance_by_position) == K and 0 < stats.acceptance_by_position[0] <= 1
    acc = stats.acceptance_by_position
    assert all(acc[i] >= acc[i + 1] for i in range(K - 1))  # a chain: later positions need earlier ones
    assert "tau" in stats.line() and stats.tokens_per_s > 0


def test_no_recompilation_for_same_shapes(spec):
    cfg = GenerateConfig(max_new_tokens=9, batch_size=3, ignore_eos=True)  # same buckets as above
    spec.generate(PROMPTS, cfg, SpecConfig(k=K))
    before = len(spec._programs)
    _, stats = spec.generate(["abab", "q"], cfg, SpecConfig(k=K))
    assert stats.compiled == 0 and len(spec._programs) == before


def test_sampling_top_k_1_is_greedy_and_seeded_sampling_is_deterministic(plain, spec):
    greedy, _ = plain.generate(PROMPTS, GenerateConfig(max_new_tokens=12, batch_size=3, ignore_eos=True))
    top1 = GenerateConfig(max_new_tokens=12, batch_size=3, ignore_eos=True,
                          sampling=SamplingConfig(temperature=1.0, top_k=1, seed=3))
    out, _ = spec.generate(PROMPTS, top1, SpecConfig(k=K))
    assert [o.tokens for o in out] == [g.tokens for g in greedy]
    hot = GenerateConfig(max_new_tokens=12, batch_size=3, ignore_eos=True,
                         sampling=SamplingConfig(temperature=1.5, seed=11))
    a, _ = spec.generate(PROMPTS, hot, SpecConfig(k=K))
    b, _ = spec.generate(PROMPTS, hot, SpecConfig(k=K))
    assert [o.tokens for o in a] == [o.tokens for o in b]
    assert [o.tokens for o in a] != [g.tokens for g in greedy]  # it did sample


# ------------------------------------------------------------------------------------ bigram model
TOK = ByteTokenizer()
CYCLES = ["abcde", "fgh", "ijklmnop"]
BIGRAM_PROMPTS = ["abcdeabcdeab", "fghfghf", "ijklmnopijk"]


def _perm() -> np.ndarray:
    perm = np.arange(64)
    for cycle in CYCLES:
        ids = TOK.encode(cycle, add_bos=False)
        perm[ids] = np.roll(ids, -1)
    return perm


PERM = _perm()


def oracle(prompt: str, n: int) -> list[int]:
    tok, out = TOK.encode(prompt)[-1], []
    for _ in range(n):
        tok = int(PERM[tok])
        out.append(tok)
    return out


def bigram_model(eos: int) -> Transformer:
    """Next token = PERM[token]: zeroed attention/MLP outputs leave hidden = f(token), and head
    row PERM[x] is x's unit hidden state, so the logits peak exactly there (Cauchy-Schwarz)."""
    cfg = tiny_config(tie_embeddings=False, eos_ids=(eos,))
    w = model_weights(Transformer(cfg, rngs=nnx.Rngs(1)))
    for name in w:
        if name.endswith(("attn.o.w", "mlp.down.w")):
            w[name] = np.zeros_like(w[name])
    model = build_model(cfg, w)
    hidden_vd = np.asarray(forward(model, jnp.arange(64)[:, None], jnp.zeros((64, 1), jnp.int32))[0][:, 0])
    head = np.zeros_like(w["head"])
    head[PERM] = hidden_vd / np.linalg.norm(hidden_vd, axis=1, keepdims=True)
    model = build_model(cfg, {**w, "head": head})
    next_v = np.asarray(jnp.argmax(full_logits(model, jnp.arange(64)[:, None]), -1))
    assert (next_v[:, 0] == PERM).all(), "the bigram construction failed"
    return model


EOS = TOK.encode("e", add_bos=False)[0]


@pytest.fixture(scope="module")
def bigram():
    return SpeculativeGenerator(bigram_model(EOS), TOK)


def test_eos_inside_an_accepted_block_truncates_it(bigram):
    # Row 0 continues c | d e a b c | …: the prefill gives c, round 1 accepts all four drafts
    # d e a b plus the bonus c, and EOS (e) is the second token of that block.
    out, stats = bigram.generate(BIGRAM_PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=3),
                                 SpecConfig(k=K, adaptive=False))
    assert out[0].finish_reason == "eos" and out[0].tokens == oracle(BIGRAM_PROMPTS[0], 2)  # EOS itself dropped
    for p, o in zip(BIGRAM_PROMPTS[1:], out[1:], strict=True):  # rows without EOS run to the limit
        assert o.finish_reason == "length" and o.tokens == oracle(p, 16)
    # Every draft accepted: 2 + 15 + 15 decode tokens in 1 + 3 + 3 rounds (row 0's round cut by EOS).
    assert stats.acceptance_by_position == (1.0,) * K
    assert stats.rounds == 7 and stats.tau == pytest.approx(32 / 7)


@pytest.mark.parametrize("max_new", [1, 3, 7])
def test_max_new_tokens_cuts_inside_a_block(bigram, max_new):
    # Blocks of rows 1 and 2 are [1, 5, 5, …] tokens long: 3 and 7 end mid-block, 1 at the prefill.
    out, _ = bigram.generate(BIGRAM_PROMPTS[1:], GenerateConfig(max_new_tokens=max_new, batch_size=3),
                             SpecConfig(k=K))
    for p, o in zip(BIGRAM_PROMPTS[1:], out, strict=True):
        assert o.tokens == oracle(p, max_new) and o.finish_reason == "length"


def test_stop_string_inside_a_block(bigram):
    ref = oracle(BIGRAM_PROMPTS[2], 12)  # l m n o p | i j k l m | …
    text = TOK.decode(ref)
    stop = text[2:4]  # the 3rd and 4th tokens, both accepted drafts of round 1
    cfg = GenerateConfig(max_new_tokens=12, batch_size=3, stop=(stop,), ignore_eos=True)
    out, _ = bigram.generate(BIGRAM_PROMPTS, cfg, SpecConfig(k=K))
    assert out[2].finish_reason == "stop" and out[2].tokens == ref[:4] and out[2].text == text[:2]
    for p, o in zip(BIGRAM_PROMPTS[:2], out[:2], strict=True):
        full = TOK.decode(oracle(p, 12))
        assert (o.finish_reason == "stop") == (stop in full)


def test_bad_spec_configs():
    with pytest.raises(GenerationError, match="k must be"):
        SpecConfig(k=0)
    with pytest.raises(GenerationError, match="min_ngram"):
        SpecConfig(max_ngram=1, min_ngram=2)


# ------------------------------------------------------------------------------------ adaptive drafting
@pytest.mark.parametrize("batch_size", [1, 3])
def test_adaptive_greedy_equals_plain_greedy(plain, spec, batch_size):
    cfg = GenerateConfig(max_new_tokens=16, batch_size=batch_size, ignore_eos=True)
    ref, _ = plain.generate(PROMPTS, cfg)
    rates = []
    for sc in [SpecConfig(k=K, min_expected_accept=1.0), SpecConfig(k=K), SpecConfig(k=K, ema_weight=1.0)]:
        out, stats = spec.generate(PROMPTS, cfg, sc)
        assert [o.tokens for o in out] == [r.tokens for r in ref], sc
        assert 0 <= stats.plain_rate <= 1 and 0 <= stats.mean_draft_len <= K
        rates.append(stats.plain_rate)
    assert max(rates) > 0, rates  # some configuration backed off to plain rounds (mixed rounds checked)


def test_always_speculating_reports_no_plain_rounds(spec):
    cfg = GenerateConfig(max_new_tokens=16, batch_size=3, ignore_eos=True)
    _, stats = spec.generate(PROMPTS, cfg, SpecConfig(k=K, adaptive=False))
    assert stats.plain_rate == 0 and stats.mean_draft_len == pytest.approx(stats.draft_rate * K)
    assert "plain rounds 0%" in stats.line()


@pytest.fixture(scope="module")
def novel():
    """A bigram model whose next token is never a repeat within 60 tokens (a 64-cycle), so the n-gram
    drafter never matches on these prompts (ids 39-41, 17-20, 59-60): every round must be plain."""
    global PERM
    saved = PERM
    PERM = np.arange(64)
    PERM[3:] = np.roll(np.arange(3, 64), -1)  # id -> id + 1 over the 61 byte ids
    try:
        return SpeculativeGenerator(bigram_model(-1), TOK), PERM.copy()
    finally:
        PERM = saved


@pytest.mark.parametrize("batch_size", [1, 3])
def test_no_match_takes_only_plain_rounds(novel, batch_size):
    gen, perm = novel
    prompts = ["abc", "KLMN", "uv"]
    out, stats = gen.generate(prompts, GenerateConfig(max_new_tokens=20, batch_size=batch_size, ignore_eos=True),
                              SpecConfig(k=K))
    for p, o in zip(prompts, out, strict=True):
        tok, want = TOK.encode(p)[-1], []
        for _ in range(20):
            tok = int(perm[tok])
            want.append(tok)
        assert o.tokens == want
    assert stats.plain_rate == 1.0 and stats.mean_draft_len == 0 and stats.tau == 1.0, stats.line()
    assert stats.rounds == 19 * len(prompts)


def test_backs_off_and_reprobes(bigram):
    # The bigram rows are perfectly repetitive: a high threshold still lets the always-accepted
    # drafts through (EMA reaches k), so adaptive drafting keeps speculating once the first shadow
    # (no blind first round in a batch) has matched: 4 plain rounds, then rounds of 5, 5 and 1 tokens.
    out, stats = bigram.generate(BIGRAM_PROMPTS[1:], GenerateConfig(max_new_tokens=16, batch_size=3, ignore_eos=True),
                                 SpecConfig(k=K, min_expected_accept=K))
    for p, o in zip(BIGRAM_PROMPTS[1:], out, strict=True):
        assert o.tokens == oracle(p, 16)
    assert stats.plain_rate == pytest.approx(4 / 7) and stats.mean_draft_len == pytest.approx(K * 3 / 7)


class EchoDrafter(NgramDrafter):
    """A stateful drafter for testing the interface: it rebuilds the history from `init` and
    `observe` alone (draft_state = (history, length, mismatches)) and drafts by n-gram lookup over
    that copy. It also checks that every observed hidden state predicts (argmax) the token it
    is reported with — true for greedy decoding — and counts violations."""

    def init(self, model, draft_params, prefill):
        b, t = prefill.tokens_bt.shape
        hist_bl = jnp.zeros((b, prefill.num_slots), jnp.int32).at[:, :t].set(prefill.tokens_bt)
        hist_bl = hist_bl.at[jnp.arange(b), prefill.len_b].set(prefill.first_b)  # the prefill's token
        return hist_bl, prefill.len_b.astype(jnp.int32) + 1, jnp.zeros((), jnp.int32)

    def propose(self, model, draft_params, state, k):
        hist_bl, len_b, _ = state.draft_state
        return ngram_propose(hist_bl, len_b, k, self.max_ngram, self.min_ngram), state.draft_state

    def observe(self, model, draft_params, draft_state, obs):
        hist_bl, len_b, bad = draft_state
        b, t = obs.tokens_bt.shape
        i_t = jnp.arange(t)[None, :]
        valid_bt = i_t < obs.n_b[:, None]
        col_bt = jnp.where(valid_bt, len_b[:, None] + i_t, hist_bl.shape[1])
        hist_bl = hist_bl.at[jnp.arange(b)[:, None], col_bt].set(obs.tokens_bt, mode="drop")
        pred_bt = jnp.argmax(model.logits(obs.hidden_btd), axis=-1)
        bad = bad + jnp.sum(valid_bt & (pred_bt != obs.tokens_bt)).astype(jnp.int32)
        # Positions must chain: this round's first hidden state is at the previous last position.
        bad = bad + jnp.sum((obs.n_b > 0) & (obs.pos_b != len_b - 1)).astype(jnp.int32)
        return hist_bl, len_b + obs.n_b, bad


@pytest.mark.parametrize("adaptive", [False, True])
def test_stateful_drafter_sees_exactly_the_committed_text(tiny_model, plain, adaptive):
    prompts = [p for p in PROMPTS if p != "xyz"]  # rows with n-gram drafts (the worst row decides, below)
    cfg = GenerateConfig(max_new_tokens=16, batch_size=4, ignore_eos=True)
    ref, _ = plain.generate(prompts, cfg)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=EchoDrafter())
    out, stats = gen.generate(prompts, cfg, SpecConfig(k=K, adaptive=adaptive))
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    # Adaptive: the batch speculates only while its worst row's drafts pay, so plain and speculative
    # rounds mix; without a policy every round speculates.
    assert stats.tau > (1.2 if adaptive else 1.5), stats.line()
    assert (0 < stats.plain_rate < 1) if adaptive else stats.plain_rate == 0, stats.line()
    # Re-run the compiled program directly to read its final draft state.
    key, args, static = gen._batch_inputs([gen.encode([p], False)[0] for p in prompts], cfg, None, 0,
                                          extra_slots=K)
    state = speculative_program(gen.graphdef, *args, (), **static, k=K, drafter=EchoDrafter(),
                                adapt=SpecConfig(k=K, adaptive=adaptive).policy())
    hist_bl, len_b, bad = state.draft
    assert int(bad) == 0
    n_rows = len(prompts)  # the batch's fourth row is padding
    np.testing.assert_array_equal(np.asarray(len_b)[:n_rows], np.asarray(state.row.pos_b)[:n_rows] + 1)
    for b in range(n_rows):
        n = int(len_b[b])
        np.testing.assert_array_equal(np.asarray(hist_bl[b, :n]), np.asarray(state.row.hist_bl[b, :n]))
