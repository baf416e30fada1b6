"""Grammar-constrained decoding end to end on a tiny model with a byte-level vocabulary.

Every finished output must be accepted by an independent checker (lark's own parser, the `jsonschema`
package, Python's `re`), for greedy and sampling, for a batch whose rows have different grammars, and
speculative decoding must reproduce plain constrained greedy decoding token for token.
"""

import json
import re

import jax.numpy as jnp
import jsonschema
import lark
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from specjax.decode import (
    GenerateConfig,
    GenerationError,
    Generator,
    SamplingConfig,
    SpecConfig,
    SpeculativeGenerator,
    constrain,
)
from specjax.decode.grammar_spec import GrammarSpec, GrammarSpecError, compile_spec
from specjax.models import Transformer

# Multi-byte tokens, so a token can cross terminal boundaries (and some are refused mid-way).
EXTRA = [b'{"', b'":', b'",', b'"}', b"true", b"false", b"null", b"ab", b"abc", b", ", b"12"]


class JsonByteTokenizer:
    """ids 0 pad, 1 EOS, 2 BOS, 3 + b for byte b, then EXTRA multi-byte tokens."""

    eos_ids = (1,)
    vocab = 259 + len(EXTRA)

    def token_bytes(self) -> list[bytes]:
        return [b"", b"", b""] + [bytes([b]) for b in range(256)] + EXTRA

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([2] if add_bos else []) + [3 + b for b in text.encode()]

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes()[i] for i in ids).decode("utf-8", errors="replace")


TOK = JsonByteTokenizer()
SCHEMA = {"type": "object", "properties": {
    "name": {"enum": ["ann", "bo", "cy"]},
    "ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "maxItems": 2}},
    "required": ["name", "n"], "additionalProperties": False}
ARITH = r"""
start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""
REGEX = r"[a-c]{1,4}(,[0-9]{1,2}){0,3};"
SPECS = {
    "json": GrammarSpec("json_schema", json.dumps(SCHEMA)),
    "arith": GrammarSpec("lark", ARITH, max_depth=2),
    "regex": GrammarSpec("regex", REGEX),
}
PROMPTS = ["data: ", "1+2=", "abc,", "x"]


def accepts(kind: str, text: str) -> bool:
    """The independent checkers: jsonschema, lark itself, re."""
    if kind == "json":
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (json.JSONDecodeError, jsonschema.ValidationError):
            return False
        return True
    if kind == "arith":
        try:
            lark.Lark(ARITH, parser="earley").parse(text)
        except lark.exceptions.LarkError:
            return False
        return True
    return re.fullmatch(REGEX, text) is not None


@pytest.fixture(scope="module")
def model():
    return Transformer(tiny_config(vocab_size=TOK.vocab), rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def plain(model):
    return Generator(model, TOK)


@pytest.fixture(scope="module")
def spec(model):
    return SpeculativeGenerator(model, TOK)


def check_outputs(kinds, completions):
    finished = 0
    for kind, c in zip(kinds, completions, strict=True):
        assert c.finish_reason in ("eos", "grammar", "closed", "length"), c
        if c.finish_reason != "length":
            finished += 1
            assert accepts(kind, c.text), (kind, c.text, c.finish_reason)
    return finished


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=5),
                                      pytest.param(SamplingConfig(temperature=0.8, top_k=5, top_p=0.9, seed=2),
                                                   marks=pytest.mark.slow)])
def test_mixed_grammar_batch_outputs_are_accepted(plain, sampling):
    kinds = ["json", "arith", "regex", "json", "regex", "arith"]
    prompts = (PROMPTS * 2)[:len(kinds)]
    cfg = GenerateConfig(max_new_tokens=64, batch_size=3, sampling=sampling,
                         grammar=tuple(SPECS[k] for k in kinds))
    out, _ = plain.generate(prompts, cfg)
    # Each grammar is finite (bounded lengths, depth 2), so every row finishes within 64 tokens.
    assert check_outputs(kinds, out) == len(kinds), [(o.text, o.finish_reason) for o in out]


def test_one_grammar_for_all_rows_and_sampling_varies(plain):
    cfg = GenerateConfig(max_new_tokens=64, batch_size=4, grammar=SPECS["json"],
                         sampling=SamplingConfig(temperature=1.5, seed=3))
    out, _ = plain.generate(PROMPTS, cfg)
    assert check_outputs(["json"] * 4, out) == 4
    assert len({o.text for o in out}) > 1  # it sampled


# The layer-skip drafter is costly: under the adaptive policy it drafts (and its drafts are cut by the
# grammar) in speculative rounds only, with plain and probe rounds in between.
@pytest.mark.parametrize("spec_cfg", [SpecConfig(k=4, adaptive=False),
                                      pytest.param(SpecConfig(k=4, method="layerskip", layers=2, probe_every=2,
                                                              min_best_gain=0),
                                                   marks=pytest.mark.slow)],
                         ids=["ngram", "layerskip-adaptive"])
@pytest.mark.parametrize("batch_size", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_speculative_greedy_equals_plain_constrained_greedy(plain, spec, batch_size, spec_cfg):
    kinds = ["regex", "arith", "json"]
    cfg = GenerateConfig(max_new_tokens=48, batch_size=batch_size, grammar=tuple(SPECS[k] for k in kinds))
    ref, _ = plain.generate(PROMPTS[:3], cfg)
    out, stats = spec.generate(PROMPTS[:3], cfg, spec_cfg)
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert [o.finish_reason for o in out] == [r.finish_reason for r in ref]
    assert check_outputs(kinds, out) == 3


def test_speculative_sampling_outputs_are_accepted(spec):
    kinds = ["json", "regex", "arith"]
    cfg = GenerateConfig(max_new_tokens=64, batch_size=3, grammar=tuple(SPECS[k] for k in kinds),
                         sampling=SamplingConfig(temperature=1.0, seed=7))
    out, _ = spec.generate(PROMPTS[:3], cfg, SpecConfig(k=4, adaptive=False))
    assert check_outputs(kinds, out) == 3


def test_grammars_of_similar_size_share_one_program(plain):
    cfg = GenerateConfig(max_new_tokens=16, grammar=GrammarSpec("regex", "[a-z]{2,5};"))
    plain.generate(["q"], cfg)
    _, stats = plain.generate(["q"], GenerateConfig(max_new_tokens=16, grammar=GrammarSpec("regex", "[0-9]{1,6}!")))
    assert stats.compiled == 0


# ------------------------------------------------------------------------------------- in-graph pieces
@pytest.fixture(scope="module")
def regex_grammar():
    tables = compile_spec(SPECS["regex"], TOK)
    return constrain.prepare([tables], [0, 0], 2)


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_bos=False)


def test_chain_draft_is_cut_at_the_first_refused_token(regex_grammar):
    g = regex_grammar
    draft_bk = jnp.asarray([ids("ab,1x"), ids("abc,5")], jnp.int32)  # row 0: "x" is refused after "ab,1"
    state_bt, len_b = constrain.draft_states(g, g.state_b, draft_bk, jnp.asarray([5, 3]), None)
    assert len_b.tolist() == [4, 3]  # row 1: its own length 3 is kept
    assert (np.asarray(state_bt[0, :5]) != 0).all() and int(state_bt[0, 5]) == 0
    assert (np.asarray(state_bt[1, 4:]) == 0).all()
    # The masks at each position are those of walking the committed text so far.
    logits = jnp.zeros((2, 6, TOK.vocab))
    masked = np.asarray(constrain.mask_block(g, state_bt, logits))
    assert np.isfinite(masked[0, 0, ids("a")[0]]) and not np.isfinite(masked[0, 0, ids(",")[0]])
    assert np.isfinite(masked[0, 3, ids("1")[0]]) and not np.isfinite(masked[0, 3, ids(";")[0]])
    assert np.isfinite(masked[0, 5]).all()  # a dead position (after the refused token) stays finite


def test_tree_node_states_follow_their_parents(regex_grammar):
    g = regex_grammar
    # Nodes: 0 "a" (root child), 1 "," (child of 0), 2 "!" (child of 0, refused), 3 "7" (child of 1),
    # 4 "8" (child of the refused 2).
    draft_bk = jnp.asarray([ids("a,!78")] * 2, jnp.int32)
    parent_bk = jnp.asarray([[-1, 0, 0, 1, 2]] * 2, jnp.int32)
    state_bt, len_b = constrain.draft_states(g, g.state_b, draft_bk, jnp.asarray([5, 2]), parent_bk)
    chain_bt, _ = constrain.draft_states(g, g.state_b, jnp.asarray([ids("a,7")] * 2, jnp.int32),
                                         jnp.asarray([3, 3]), None)
    assert len_b.tolist() == [5, 2]
    assert state_bt[0, 2] == chain_bt[0, 2] and state_bt[0, 4] == chain_bt[0, 3]
    assert int(state_bt[0, 3]) == 0 and int(state_bt[0, 5]) == 0
    assert int(state_bt[1, 4]) == 0  # node 3 is past row 1's length


def test_complete_states_finish_a_row(plain):
    cfg = GenerateConfig(max_new_tokens=16, grammar=GrammarSpec("regex", "abc"))
    (c,), _ = plain.generate(["z"], cfg)
    assert c.text == "abc" and c.finish_reason == "grammar"


# ----------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("spec", "message"), [
    (GrammarSpec("lark", 'start: "a" b\nb: ( "x"', origin="g.lark"), "g.lark: invalid Lark grammar: Unexpected"),
    (GrammarSpec("lark", 'start: "a" c', origin="g.lark"), "Rule 'c' used but not defined"),
    (GrammarSpec("json_schema", '{"type": "array", "contains": {"type": "integer"}}',
                 origin="s.json"), "s.json: JSON Schema keyword 'contains' at #"),
    (GrammarSpec("json_schema", '{"type": ', origin="s.json"), "s.json:1:10: invalid JSON"),
    (GrammarSpec("regex", "a(?=b)"), "regex: regex 'a(?=b)': lookaround at column 2"),
])
def test_bad_grammars_give_one_line(spec, message):
    with pytest.raises(GrammarSpecError) as e:
        compile_spec(spec, TOK)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_grammar_input(plain):
    assert "line 2, column 9" in str(pytest.raises(GrammarSpecError, compile_spec,
                                                   GrammarSpec("lark", 'start: "a" b\nb: ( "x"'), TOK).value)
    with pytest.raises(GenerationError, match="2 grammars given for 1 prompts"):
        plain.generate(["a"], GenerateConfig(grammar=(SPECS["regex"], SPECS["json"])))
    with pytest.raises(GrammarSpecError, match="max_depth must be a positive integer"):
        GrammarSpec("lark", ARITH, max_depth=0)
    with pytest.raises(GrammarSpecError, match="kind 'yaml' is unknown"):
        GrammarSpec("yaml", "")
    with pytest.raises(GenerationError, match="grammar must be a GrammarSpec"):
        GenerateConfig(grammar="start: 'a'")


# ------------------------------------------------------------------------------- options reach the compiler
OPEN_OBJECT = '{"type": "object", "properties": {"a": {"type": "integer"}}}'


def test_json_options_reach_the_front_end():
    assert "extra" not in GrammarSpec("json_schema", OPEN_OBJECT).lark_text()  # strict by default
    assert "extra" in GrammarSpec("json_schema", OPEN_OBJECT, strict_objects=False).lark_text()
    array = '{"type": "array", "items": {"type": "integer"}}'
    bounded = lark.Lark(GrammarSpec("json_schema", array).lark_text(), parser="earley")
    exact = lark.Lark(GrammarSpec("json_schema", array, max_repeat=None).lark_text(), parser="earley")
    bounded.parse("[" + ",".join(["1"] * 16) + "]")
    with pytest.raises(lark.exceptions.LarkError):
        bounded.parse("[" + ",".join(["1"] * 17) + "]")
    exact.parse("[" + ",".join(["1"] * 40) + "]")
    fmt = '{"type": "string", "format": "json-pointer"}'  # a format a draft defines, with no exact grammar here
    with pytest.raises(GrammarSpecError, match="json_unknown_formats=ignore"):
        GrammarSpec("json_schema", fmt).lark_text()
    assert "start" in GrammarSpec("json_schema", fmt, unknown_formats="ignore").lark_text()


def test_compiler_options_reach_the_compiler():
    options = GrammarSpec("lark", ARITH, max_states=1234, timeout=None, max_ignore=None).options((1,))
    assert (options.max_states, options.timeout, options.max_ignore, options.eos_ids) == (1234, None, None, (1,))
    with pytest.raises(GrammarSpecError, match=r"too large .* max_states=10\b"):
        compile_spec(GrammarSpec("lark", ARITH, max_states=10), TOK)


@pytest.mark.parametrize(("options", "message"), [
    ({"timeout": 0}, "timeout must be a positive number"),
    ({"max_ignore": 0}, "max_ignore must be a positive number"),
    ({"max_states": 1}, "max_states must be at least 2"),
    ({"unknown_formats": "warn"}, "unknown_formats must be 'refuse' or 'ignore'"),
    ({"strict_objects": "yes"}, "strict_objects must be true or false"),
    ({"max_repeat": 0}, "max_repeat must be a positive integer"),
    ({"max_digits": 0}, "max_digits must be an integer within 1..127"),
    ({"max_digits": 128}, "max_digits must be an integer within 1..127"),
])
def test_bad_options_give_one_line(options, message):
    with pytest.raises(GrammarSpecError, match=message):
        GrammarSpec("json_schema", OPEN_OBJECT, **options)


def test_cli_options_make_the_spec(tmp_path):
    from specjax.decode.cli import DecodeOptions, grammar_spec

    path = tmp_path / "s.json"
    path.write_text(OPEN_OBJECT)
    spec = grammar_spec(DecodeOptions(json_schema=str(path), json_strict_objects=False, json_unknown_formats="ignore",
                                      grammar_max_states=999, grammar_timeout=2.5, grammar_max_ignore=4,
                                      json_max_repeat=None, json_max_digits=5))
    assert (spec.strict_objects, spec.unknown_formats, spec.max_states, spec.timeout, spec.max_ignore,
            spec.max_repeat, spec.digit_bound) == (False, "ignore", 999, 2.5, 4, None, 5)
    assert grammar_spec(DecodeOptions(json_schema=str(path))).digit_bound == 20
    assert grammar_spec(DecodeOptions(regex="[0-9]+")).digit_bound is None  # JSON Schema only
    from specjax.decode.cli import generate_config

    assert generate_config(DecodeOptions(json_schema=str(path))).close_grammar
    assert not generate_config(DecodeOptions(json_schema=str(path), grammar_close=False)).close_grammar
