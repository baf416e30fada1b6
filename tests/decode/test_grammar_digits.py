"""Runaway digits (`GrammarSpec.max_digits`, `grammar.digit_guard`, `constrain`'s packed row states).

A tiny random model over a byte vocabulary loves to repeat a digit: unconstrained by a bound it fills a JSON
integer until the token budget, like Qwen2.5-Coder did on a real schema. With a bound every run of digit-only
tokens ends at the bound, every output validates, rows finish on their own, and speculative greedy decoding
still equals plain greedy token for token (draft positions carry the run count too).
"""

import json

import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx
from test_grammar_decode import TOK

from specjax.decode import GenerateConfig, Generator, SamplingConfig, SpecConfig, SpeculativeGenerator, constrain
from specjax.decode.grammar_spec import GrammarSpec, compile_spec
from specjax.models import Transformer

SCHEMA = {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
PROMPTS = ["data: ", "1+2=", "abc,", "x"]
DIGIT_TOKENS = {3 + b for b in b"0123456789"} | {TOK.token_bytes().index(b"12")}


@pytest.fixture(scope="module")
def gens():
    """(plain, speculative) generators of a tiny model that runs on digits (seed 2: every prompt does)."""
    model = Transformer(tiny_config(vocab_size=TOK.vocab), rngs=nnx.Rngs(2))
    return Generator(model, TOK), SpeculativeGenerator(model, TOK)


GREEDY = SamplingConfig()


def config(max_digits, sampling=GREEDY, max_new=24):
    return GenerateConfig(max_new_tokens=max_new, batch_size=4, sampling=sampling,
                          grammar=GrammarSpec("json_schema", json.dumps(SCHEMA), max_digits=max_digits))


def longest_run(tokens) -> int:
    run = best = 0
    for t in tokens:
        run = run + 1 if t in DIGIT_TOKENS else 0
        best = max(best, run)
    return best


def test_a_digit_bound_ends_runaway_numbers(gens):
    free, _ = gens[0].generate(PROMPTS, config(None))
    assert all(longest_run(o.tokens) > 3 for o in free)  # the model runs on digits while nothing bounds them
    assert {o.finish_reason for o in free} == {"closed"}  # only the budget ended them
    bounded, _ = gens[0].generate(PROMPTS, config(3))
    for o in bounded:
        assert o.finish_reason in ("eos", "grammar") and longest_run(o.tokens) <= 3, (o.text, o.finish_reason)
        jsonschema.validate(json.loads(o.text), SCHEMA)
    # Up to the first run the bound cut, the outputs are the same.
    for o, b in zip(free, bounded, strict=True):
        assert o.tokens[:4] == b.tokens[:4]


@pytest.mark.parametrize("spec_cfg", [SpecConfig(k=4, adaptive=False), SpecConfig(k=6, method="lookup")],
                         ids=["chain", "tree"])
def test_speculative_greedy_equals_plain_with_a_digit_bound(gens, spec_cfg):
    ref, _ = gens[0].generate(PROMPTS, config(3))
    out, _ = gens[1].generate(PROMPTS, config(3), spec_cfg)
    assert [o.tokens for o in out] == [o.tokens for o in ref]


def test_sampled_rows_keep_the_bound(gens):
    out, _ = gens[0].generate(PROMPTS, config(2, SamplingConfig(temperature=1.0, seed=3), max_new=40))
    for o in out:
        assert longest_run(o.tokens) <= 2, o.text
        if o.finish_reason != "length":
            jsonschema.validate(json.loads(o.text), SCHEMA)


def test_only_digit_loops_are_bounded_and_a_way_out_always_stays():
    """Packed states: the mask drops digit-only tokens exactly at a digit-loop state whose run reached the
    bound; a bounded integer's counted digits, strings and the tokens after a run are untouched."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"},
                                               "c": {"type": "integer", "minimum": 0, "maximum": 99999}},
              "required": ["n", "s", "c"]}
    tables = compile_spec(GrammarSpec("json_schema", json.dumps(schema)), TOK, TOK.eos_ids)
    grammar = constrain.prepare([tables], [0], 1, close=False, digit_bounds=[2])

    def walk(text):
        state = grammar.state_b
        for b in text.encode():
            state, _ = constrain.step(grammar, state, jnp.array([3 + b]), jnp.array([True]))
        ok = np.isfinite(np.asarray(constrain.mask(grammar, state, jnp.zeros((1, TOK.vocab)))))[0]
        return {t for t in DIGIT_TOKENS if ok[t]}, ok

    assert len(walk('{"n":1')[0]) == 11 and walk('{"n":12')[0] == set()  # the run reached 2
    digits, ok = walk('{"n":12')
    assert ok[3 + ord(",")] and not ok[1]  # the way out: the next member (EOS is not allowed mid-object)
    assert len(walk('{"n":12,"s":"1234')[0]) == 11  # string contents are never cut
    assert len(walk('{"n":1,"s":"","c":1234')[0]) == 10  # a counted integer ("12" would pass its 5 digits)
