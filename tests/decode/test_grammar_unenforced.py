"""GrammarSpec.unenforced end to end: outputs of a wider grammar are checked, and the check agrees with jsonschema."""

import json

import jsonschema
import pytest
from conftest import tiny_config
from flax import nnx
from test_grammar_decode import TOK

from specjax.decode import GenerateConfig, Generator, SamplingConfig
from specjax.decode.generate import Completion
from specjax.decode.grammar_spec import GrammarSpec, GrammarSpecError
from specjax.decode.output import CompletionWriter
from specjax.models import Transformer

# Two letters drawn for three items: distinct items are not compiled for a pattern's domain, so a sampling
# tiny model writes duplicates about as often as not.
SCHEMA = {"type": "array", "items": {"type": "string", "pattern": "^[ab]$"}, "minItems": 2, "maxItems": 3,
          "uniqueItems": True}


@pytest.fixture(scope="module")
def plain():
    return Generator(Transformer(tiny_config(vocab_size=TOK.vocab), rngs=nnx.Rngs(3)), TOK)


def _valid(text: str) -> bool:
    return jsonschema.Draft202012Validator(SCHEMA).is_valid(json.loads(text))


def test_refused_unless_asked_and_then_said_where():
    with pytest.raises(GrammarSpecError, match=r"json_unenforced=\[uniqueItems\]"):
        GrammarSpec("json_schema", json.dumps(SCHEMA)).lark_text()
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), unenforced=("uniqueItems",))
    assert spec.unenforced_at() == ("uniqueItems at #",)


def test_violation_is_jsonschema_where_keywords_are_dropped_and_never_checked_elsewhere():
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), unenforced=("uniqueItems",))
    assert spec.violation('["a","b"]') is None
    assert "non-unique" in spec.violation('["a","a"]')
    assert spec.violation('["a",').startswith("not JSON")
    exact = GrammarSpec("json_schema", json.dumps({"type": "array", "maxItems": 1}), unenforced=("uniqueItems",))
    assert exact.unenforced_at() == () and exact.violation("[1,2]") is None  # exact grammars are not re-checked


@pytest.mark.parametrize("bad", [("format",), "uniqueItems"])
def test_bad_option_gives_one_line(bad):
    with pytest.raises(GrammarSpecError, match="unenforced"):
        GrammarSpec("json_schema", json.dumps(SCHEMA), unenforced=bad)


def test_generated_outputs_carry_the_check(plain):
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), unenforced=("uniqueItems",))
    seen = set()
    for seed in (1, 2):
        cfg = GenerateConfig(max_new_tokens=16, grammar=spec, batch_size=8,
                             sampling=SamplingConfig(temperature=1.0, seed=seed))
        completions, _ = plain.generate(["x"] * 8, cfg)
        for c in completions:
            assert c.finish_reason in ("eos", "grammar", "closed"), c  # closing ends every row complete
            assert (c.violation is None) == _valid(c.text), c
            seen.add(c.violation is None)
    assert seen == {True, False}  # both kinds occurred, so the agreement above was tested both ways


def test_cli_option_and_warning(tmp_path, capsys):
    from specjax.decode.cli import DecodeOptions, grammar_spec

    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCHEMA))
    assert grammar_spec(DecodeOptions(json_schema=str(path), json_unenforced=["uniqueItems"])).unenforced == \
        ("uniqueItems",)
    with CompletionWriter(None, 2, chat=True) as writer:
        writer.batch([Completion("p", '["a","a"]', [], "grammar", violation="at /: has non-unique elements"),
                      Completion("p", '["a","b"]', [], "grammar")])
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "completion 0 breaks the schema" in err
