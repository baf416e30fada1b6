"""`python -m specjax.decode grammar=… | json_schema=… | regex=…`: options, one-line errors, a constrained run."""

import json
import re

import pytest
from conftest import ByteTokenizer, tiny_config
from flax import nnx

from specjax.decode.cli import DecodeOptions, run
from specjax.models import Transformer


@pytest.fixture
def tiny_cli(monkeypatch):
    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    monkeypatch.setattr("specjax.models.loading.load_model", lambda *a, **k: (model, ByteTokenizer()))


@pytest.mark.parametrize(("files", "opts", "message"), [
    ({}, {"grammar": "/nonexistent/g.lark"}, "grammar='/nonexistent/g.lark': no such file"),
    ({"g.lark": 'start: "a" b\nb: ( "x"'}, {"grammar": "g.lark"}, "g.lark: invalid Lark grammar: Unexpected token"),
    ({"g.lark": 'start: "a" c'}, {"grammar": "g.lark"}, "Rule 'c' used but not defined"),
    ({"g.lark": 'start: "a"'}, {"grammar": "g.lark", "grammar_start": "top"}, "no rule named 'top'"),
    ({"s.json": '{"type": "object", "not": {}}'}, {"json_schema": "s.json"}, "s.json: JSON Schema keyword 'not' at #"),
    ({"s.json": '{"type": "object",\n "x": }'}, {"json_schema": "s.json"}, "s.json:2:7: invalid JSON"),
    ({}, {"regex": "(a)\\1"}, "backreference"),
    ({}, {"regex": "a", "json_schema": "s.json"}, "at most one of grammar=, json_schema=, regex="),
    ({}, {"regex": "a", "grammar_max_depth": 0}, "max_depth must be a positive integer"),
    ({}, {"regex": "a", "json_whitespace": "pretty"}, "json whitespace must be 'compact' or 'flexible'"),
])
def test_bad_grammar_options_exit_2_with_one_line(tmp_path, monkeypatch, capsys, tiny_cli, files, opts, message):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert run(DecodeOptions.from_flat(quiet=True, prompt="x", max_new_tokens=4, **opts)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_constrained_run_prints_matching_text(tmp_path, capsys, tiny_cli):
    out = tmp_path / "out.jsonl"
    assert run(DecodeOptions.from_flat(quiet=True, prompt="q", regex="[a-f]{2,4}(z[a-f]{1,3})?", max_new_tokens=12,
                             output=str(out))) == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert row["finish_reason"] in ("eos", "grammar")  # the language is finite: it ends within 12 tokens
    assert re.fullmatch("[a-f]{2,4}(z[a-f]{1,3})?", row["text"]), row
    lark_file = tmp_path / "g.lark"
    lark_file.write_text('start: WORD ("x" WORD)~1..2\nWORD: /[a-c]{1,3}/\n')  # ByteTokenizer: letters only
    assert run(DecodeOptions.from_flat(quiet=True, prompt="q", grammar=str(lark_file), max_new_tokens=12, spec="ngram",
                             compare_plain=False, output=str(out))) == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert re.fullmatch("[a-c]{1,3}(x[a-c]{1,3}){1,2}", row["text"]), row
