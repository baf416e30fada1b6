"""`python -m specjax.decode spec=lookup|recycle`: end to end on a tiny model, and bad options."""

import pytest
from conftest import ByteTokenizer, tiny_config
from flax import nnx
from test_cli import run_cli

from specjax.decode.cli import DecodeOptions, run
from specjax.models.transformer import Transformer


@pytest.fixture
def tiny_loaded(monkeypatch):
    """The decode command loads the tiny random model (byte tokenizer) instead of Gemma."""
    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    monkeypatch.setattr("specjax.models.loading.load_model", lambda *a, **k: (model, ByteTokenizer()))


@pytest.mark.parametrize(("opts", "want"), [
    ({"spec": "recycle", "spec_k": 8, "recycle_width": 4}, "speculative k=8: tau"),
    ({"spec": "lookup", "spec_k": 6, "lookup_branches": 2, "lookup_depth": 3}, "speculative k=6: tau"),
])
def test_token_tree_runs_on_a_tiny_model(capsys, tiny_loaded, opts, want):
    options = DecodeOptions.from_flat(quiet=True, prompt="abcabcabc", max_new_tokens=8, compare_plain=False, **opts)
    assert run(options) == 0
    captured = capsys.readouterr()
    assert want in captured.err and "acceptance by position" in captured.err
    assert captured.out.strip()  # the completion


@pytest.mark.parametrize(("opts", "message"), [
    ({"spec": "lookup", "lookup_branches": 0}, "lookup_branches must be a positive integer, got 0"),
    ({"spec": "lookup", "lookup_depth": -2}, "lookup_depth must be a positive integer, got -2"),
    ({"spec": "recycle", "recycle_width": 0}, "recycle_width must be a positive integer, got 0"),
    ({"spec": "recycle", "recycle_width": 65}, "recycle_width must be at most 64, got 65"),
])
def test_bad_token_tree_options_give_one_clear_line(capsys, opts, message):
    assert run(DecodeOptions.from_flat(quiet=True, **opts)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err and err.count("\n") == 1


def test_a_template_larger_than_its_width_allows_is_refused(capsys, tiny_loaded):
    # Width 1 is a chain; 8 levels at most: 9 nodes cannot be placed.
    opts = DecodeOptions.from_flat(quiet=True, prompt="abc", max_new_tokens=4, spec="recycle", spec_k=9,
                                   recycle_width=1)
    assert run(opts) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: recycle: tree size 9 must be in 1..8") and "Traceback" not in err


def test_the_command_line_exits_2_with_one_line():
    r = run_cli("spec=recycle", "recycle_width=abc")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "recycle_width" in r.stderr
    r = run_cli("spec=lookup", "lookup_branches=0")
    assert r.returncode == 2 and r.stderr == "error: lookup_branches must be a positive integer, got 0\n", r.stderr
