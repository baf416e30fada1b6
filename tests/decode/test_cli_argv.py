"""Free text on the decode command line (`specjax.decode.argv`) and the shared CLI edge (`specjax.cli_errors`)."""

import dataclasses

import pytest

from specjax.cli_errors import UsageError, check_finite, did_you_mean, schema_keys
from specjax.decode.__main__ import parse
from specjax.decode.argv import parse_stop, split_free_text, strip_quotes, text_keys, unescape, with_free_text
from specjax.decode.cli import DecodeOptions

NASTY = ["Hello, world", "What's 2+2?", "[a, b]: {c: d}", 'say "hi" = ok', "${not.an.interpolation}", "a\\nb",
         "'", '"', "x=", "=", "日本語 ✓", "  spaced  "]


@pytest.mark.parametrize("text", NASTY)
def test_any_prompt_reaches_the_options_verbatim(text):
    assert parse([f"prompt={text}", "max_new_tokens=3"]).prompt == text
    assert parse([f"regex={text}"]).regex == text


def test_hydra_style_quotes_are_removed_once():
    assert parse(['prompt="Hello, world"']).prompt == "Hello, world"
    assert parse(["prompt='What is 2+2?'"]).prompt == "What is 2+2?"
    assert parse(["prompt=\"'quoted'\""]).prompt == "'quoted'"
    assert strip_quotes('"a"b"') == 'a"b' and strip_quotes('"a') == '"a'


def test_null_leaves_an_option_unset_and_other_types_still_go_through_hydra():
    opts = parse(["model=null", "max_new_tokens=7", "spec_layer_list=[0,2]", "chat=true"])
    assert (opts.model, opts.max_new_tokens, opts.spec.drafter.layer_list, opts.chat) == (None, 7, [0, 2], True)


@pytest.mark.parametrize(("value", "stops"), [
    ('["\\n\\n","###"]', ["\n\n", "###"]),
    ("['\\t', 'END']", ["\t", "END"]),
    ("\\n\\n", ["\n\n"]),
    ("###", ["###"]),
    ('"\\u00e9!"', ["é!"]),
    ("[]", []),
    ("", []),
])
def test_stop_values(value, stops):
    assert parse_stop(value) == stops
    assert parse([f"stop={value}"]).stop == stops


def test_stop_in_hydra_list_syntax_still_parses():
    assert parse(["stop=[END,###]"]).stop == ["END", "###"]


@pytest.mark.parametrize("value", ["[1, 2]", '[""]', '["a", 3]', "[a,,b]", "[a"])
def test_bad_stop_values_are_usage_errors(value):
    with pytest.raises(UsageError, match="stop="):
        parse_stop(value)


def test_unescape_keeps_unknown_escapes():
    assert unescape(r"a\nb\tc\\d\qe\x41\u00e9") == "a\nb\tc\\d\\qeAé"


def test_text_keys_are_the_string_fields():
    strings, lists = text_keys(DecodeOptions)
    assert {"prompt", "prompt_file", "regex", "model", "output", "grammar"} <= strings
    assert lists == {"stop", "json_unenforced"} and "max_new_tokens" not in strings


def test_non_text_keys_are_left_to_hydra():
    overrides, free = split_free_text(["max_new_tokens=3", "prompt=a,b", "+x=1"], DecodeOptions)
    assert overrides == ["max_new_tokens=3", "+x=1"] and free == {"prompt": "a,b"}


def test_free_text_lands_in_nested_frozen_options():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        path: str | None = None

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner = Inner()
        n: int = 1

    assert [k for k, _ in schema_keys(Outer)] == ["inner.path", "n"]
    assert with_free_text(Outer(), {"inner.path": "a, b"}) == Outer(inner=Inner(path="a, b"))


def test_did_you_mean():
    assert did_you_mean("temperatur", ["temperature", "top_p"]) == " (did you mean 'temperature'?)"
    assert did_you_mean("lr", ["optim.lr", "steps"]) == " (did you mean 'optim.lr'?)"
    assert did_you_mean("zzz", ["temperature"]) == ""


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_floats_are_refused(value):
    with pytest.raises(UsageError, match="temperature=.*: must be a finite number"):
        check_finite(DecodeOptions(temperature=value))


def test_prompt_file_is_one_prompt_without_its_final_newline(tmp_path):
    from specjax.decode.prompts import OptionError, collect_prompts

    f = tmp_path / "p.txt"
    f.write_text("first line, with 'quotes'\n\nthird: [x]\r\n", encoding="utf-8")
    assert collect_prompts(None, str(f), None, None) == ["first line, with 'quotes'\n\nthird: [x]"]
    f.write_text("\n")
    with pytest.raises(OptionError, match="the prompt is empty"):
        collect_prompts(None, str(f), None, None)
