"""Closing constrained rows within max_new_tokens (`GenerateConfig.close_grammar`, `constrain.close`).

A budget that would cut a row mid-sentence instead steers it, in its last tokens, onto the shortest
completion: every row ends complete and is accepted by the independent checkers, greedy speculation still
equals plain greedy token for token, and `close_block` (the speculative round) emits exactly what closing
the same tokens one at a time (the plain loop) would.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grammar_decode import PROMPTS, SPECS, TOK, check_outputs

from specjax.decode import GenerateConfig, Generator, SamplingConfig, SpecConfig, SpeculativeGenerator, constrain
from specjax.decode.grammar_spec import compile_spec
from specjax.grammar.runtime import advance, allowed
from specjax.models import Transformer

KINDS = ["json", "arith", "regex", "json", "regex", "arith"]
# The JSON schema's shortest instance, {"name":"bo","n":0}, is 19 bytes: with EOS, 20 single-byte tokens.
SHORTEST_JSON = 20


@pytest.fixture(scope="module")
def gens():
    """(plain, speculative) generators of one tiny model over the byte vocabulary."""
    model = Transformer(tiny_config(vocab_size=TOK.vocab), rngs=nnx.Rngs(1))
    return Generator(model, TOK), SpeculativeGenerator(model, TOK)


GREEDY = SamplingConfig()


def config(max_new, sampling=GREEDY, close=True):
    return GenerateConfig(max_new_tokens=max_new, batch_size=3, sampling=sampling, close_grammar=close,
                          grammar=tuple(SPECS[k] for k in KINDS))


@pytest.mark.parametrize("max_new", [SHORTEST_JSON, SHORTEST_JSON + 3, 31])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=5)],
                         ids=["greedy", "sampling"])
def test_every_row_ends_complete_within_its_budget(gens, max_new, sampling):
    out, _ = gens[0].generate((PROMPTS * 2)[:len(KINDS)], config(max_new, sampling))
    assert check_outputs(KINDS, out) == len(KINDS), [(o.text, o.finish_reason) for o in out]
    assert all(len(o.tokens) <= max_new for o in out)


def test_without_closing_the_same_budget_cuts_rows(gens):
    plain = gens[0]
    out, _ = plain.generate((PROMPTS * 2)[:len(KINDS)], config(SHORTEST_JSON, close=False))
    assert "length" in [o.finish_reason for o in out]  # greedy JSON rows run into the limit (see above)
    closed, _ = plain.generate((PROMPTS * 2)[:len(KINDS)], config(SHORTEST_JSON))
    # Closing changes only the rows that would have been cut, and says so; the others are identical.
    for o, c in zip(out, closed, strict=True):
        if o.finish_reason == "length":
            assert c.finish_reason == "closed" and c.tokens[:5] == o.tokens[:5]
        else:
            assert (c.tokens, c.finish_reason) == (o.tokens, o.finish_reason)


def test_a_budget_below_the_shortest_sentence_is_left_to_the_model(gens):
    # 6 tokens cannot hold the shortest instance by the single-byte bound: nothing is forced (multi-byte
    # tokens might still fit, and forcing single bytes would only cut the row into a shorter prefix).
    (c,), _ = gens[0].generate(["data: "], GenerateConfig(max_new_tokens=6, grammar=SPECS["json"]))
    (free,), _ = gens[0].generate(["data: "], GenerateConfig(max_new_tokens=6, grammar=SPECS["json"],
                                                            close_grammar=False))
    assert c.finish_reason == "length" and len(c.tokens) == 6 and c.text.startswith('{"')
    assert c.tokens == free.tokens


@pytest.mark.parametrize("spec_cfg", [SpecConfig(k=4, adaptive=False), SpecConfig(k=6, method="lookup")],
                         ids=["chain", "tree"])
def test_speculative_greedy_equals_plain_when_closing(gens, spec_cfg):
    cfg = config(SHORTEST_JSON + 1)
    ref, _ = gens[0].generate((PROMPTS * 2)[:len(KINDS)], cfg)
    out, _ = gens[1].generate((PROMPTS * 2)[:len(KINDS)], cfg, spec_cfg)
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert check_outputs(KINDS, out) == len(KINDS)


def test_speculative_sampling_rows_end_complete(gens):
    cfg = config(SHORTEST_JSON + 2, SamplingConfig(temperature=1.0, seed=11))
    out, _ = gens[1].generate((PROMPTS * 2)[:len(KINDS)], cfg, SpecConfig(k=4, adaptive=False))
    assert check_outputs(KINDS, out) == len(KINDS)


@pytest.fixture(scope="module")
def json_grammar():
    return constrain.prepare([compile_spec(SPECS["json"], TOK)], [0], 1)


# Jitted once: the in-graph functions run eagerly op by op otherwise (seconds per hypothesis example).
_allowed, _advance = jax.jit(allowed), jax.jit(advance)
_close = jax.jit(constrain.close, static_argnums=4)
_close_block = jax.jit(constrain.close_block, static_argnums=5)


def walk(grammar, rng, n):
    """n tokens a row could emit from its start: each drawn among those its state allows (no EOS)."""
    state, toks = grammar.state_b, []
    for _ in range(n):
        ok = np.flatnonzero(np.asarray(_allowed(grammar.tables, state))[0])
        ok = ok[ok != TOK.eos_ids[0]]
        if not len(ok):
            break
        toks.append(int(rng.choice(ok)))
        state = _advance(grammar.tables, state, jnp.asarray(toks[-1:], jnp.int32))
    return toks


def close_one_at_a_time(grammar, tokens, accepted, room):
    """What the plain loop emits for these tokens: `close` per token, ending at the first replacement."""
    state, out = grammar.state_b, []
    for i, tok in enumerate(tokens[:accepted + 1]):
        t = jnp.asarray([tok], jnp.int32)
        closed = int(_close(grammar, state, t, jnp.asarray([room - i]), TOK.eos_ids)[0][0])
        out.append(closed)
        if closed != tok:
            break
        state = _advance(grammar.tables, state, t)
    return out


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), accepted=st.integers(0, 5), room=st.integers(0, 30))
def test_close_block_emits_what_closing_token_by_token_emits(json_grammar, seed, accepted, room):
    toks = walk(json_grammar, np.random.default_rng(seed), 6)
    accepted = min(accepted, len(toks) - 1)
    tokens_bt = jnp.asarray([toks + [0] * (6 - len(toks))], jnp.int32)
    new_bt, new_acc, late = _close_block(json_grammar, json_grammar.state_b, tokens_bt, jnp.asarray([accepted]),
                                         jnp.asarray([room]), TOK.eos_ids)
    emitted = np.asarray(new_bt)[0, :int(new_acc[0]) + 1].tolist()
    assert emitted == close_one_at_a_time(json_grammar, toks, accepted, room)
    assert bool(late[0]) == (emitted != toks[:len(emitted)])


def test_close_block_replaces_the_first_late_token(json_grammar):
    toks = TOK.encode('{"name":"ann",', add_bos=False)  # 14 one-byte tokens
    tokens_bt, accepted_b = jnp.asarray([toks], jnp.int32), jnp.asarray([13])
    # The shortest instance is {"name":"bo","n":0}. After {"name":"a it is {"name":"ann","n":0}: 11 more
    # tokens with EOS, so "a" (token 9) fits if 20 tokens follow the first (20 - 9 >= 11), and so does
    # every later token.
    same_bt, same_acc, late = constrain.close_block(json_grammar, json_grammar.state_b, tokens_bt, accepted_b,
                                                    jnp.asarray([20]), TOK.eos_ids)
    assert np.asarray(same_bt)[0].tolist() == toks and int(same_acc[0]) == 13 and not late[0]
    # One token less: "a" falls behind; it is replaced by a shortest way on ("bo" or "cy") and ends the round.
    new_bt, new_acc, late = constrain.close_block(json_grammar, json_grammar.state_b, tokens_bt, accepted_b,
                                                  jnp.asarray([19]), TOK.eos_ids)
    assert late[0] and int(new_acc[0]) == 9 and TOK.decode(np.asarray(new_bt)[0, :10].tolist()) in ('{"name":"b',
                                                                                    '{"name":"c')


def test_per_grammar_closing_tables_stack_like_the_grammars():
    from specjax.grammar.closing import closing_tables
    from specjax.grammar.runtime import stack_grammars

    grammars = [compile_spec(SPECS[k], TOK) for k in ("json", "regex", "arith")]
    stacked, _ = stack_grammars(grammars)
    direct = closing_tables(np.asarray(stacked.trans_sb), np.asarray(stacked.accept_s),
                            constrain.vocab_byte_tokens(stacked))
    batch = constrain.prepare(grammars, [0, 1, 2], 3, closings=[constrain.closing_of(g) for g in grammars])
    n = stacked.n_states
    assert np.asarray(batch.dist_s)[:n].tolist() == direct[0].tolist()
    assert np.asarray(batch.close_s)[:n].tolist() == direct[1].tolist()
