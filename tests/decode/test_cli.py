"""`python -m specjax.decode`: options, messages for bad input, an end-to-end run."""

import json
import re
import subprocess
import sys

import pytest
from tiny_hf import write_tiny_hf_model

from specjax.decode.cli import DecodeOptions, run


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "specjax.decode", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_the_options():
    r = run_cli("--help")
    assert r.returncode == 0
    for key in ("model=", "prompts_file=", "prompt_file=", "max_new_tokens=", "temperature=", "top_p=", "batch_size=",
                "Free text"):
        assert key in r.stdout


def test_the_process_ends_with_its_code_after_the_exit_handlers_and_flushed_output():
    """`python -m specjax.decode` skips the interpreter's teardown (0.4-0.6 s) but not what a normal exit does
    first: the exit handlers run, buffered stdout and stderr arrive, the exit code is the command's."""
    code = ("import atexit, sys\n"
            "from specjax.decode.__main__ import exit_now\n"
            "atexit.register(lambda: print('handler ran', flush=True))\n"
            "print('buffered', end='')\n"
            "print('to stderr', end='', file=sys.stderr)\n"
            "exit_now(3)\n"
            "print('not reached')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (3, "bufferedhandler ran\n", "to stderr")


def test_unknown_option_is_named():
    r = run_cli("no_such_option=1")
    assert r.returncode == 2
    assert r.stderr == "error: unknown option 'no_such_option'; `python -m specjax.decode --help` lists them\n"


@pytest.mark.parametrize(("opts", "message"), [
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
    ({"prompt": "x", "prompts_file": "p.jsonl"}, "give one of prompt=, prompt_file= or prompts_file=, not prompt and "
                                                 "prompts_file"),
    ({"prompts_file": "/nonexistent/p.jsonl"}, "no such file"),
    ({"model": "/nonexistent/model.gguf"}, "model file not found: /nonexistent/model.gguf"),
    ({"dtype": "float8"}, "dtype='float8' is not one of"),
    ({"spec": "medusa"}, "the medusa method needs trained heads: set draft_checkpoint="),
    ({"spec": "eagle", "draft_checkpoint": "/nonexistent/run"}, "draft_checkpoint='/nonexistent/run': no such"),
    ({"spec": "bogus"}, "spec='bogus' is unknown"),
    ({"spec": "ngram", "spec_k": 0}, "k must be a positive integer"),
    ({"mesh_data": 2}, "mesh_data=2 mesh_model=1: mesh data=2 x model=1 needs 2 devices, which does not divide "
                       "the 1 available cpu device(s)"),
    ({"mesh_model": 0}, "mesh_data=1 mesh_model=0: mesh model size must be a positive integer, got 0"),
    ({"spec": "draft"}, "the draft method needs a draft model: set draft_model="),
    ({"spec": "draft", "draft_model": "/nonexistent/d.gguf"}, "draft_model='/nonexistent/d.gguf': no such file"),
    ({"spec": "layerskip", "spec_confidence": 1.5}, "confidence must be in [0, 1)"),
    ({"spec": "layerskip", "spec_probe_every": 0}, "probe_every must be a positive integer, got 0"),
    ({"spec": "layerskip", "spec_max_probe_every": 8}, "max_probe_every must be an integer >= probe_every (16), got 8"),
    ({"spec": "ngram", "spec_cheap_max_gap": 0}, "cheap_max_gap must be a positive integer, got 0"),
    ({"spec": "ngram", "spec_min_best_gain": -1.0}, "min_best_gain must be a number >= 0"),
    ({"spec": "ngram", "spec_verify_cost": 0.5}, "verify_cost must be >= 1 (plain rounds per speculative round)"),
    ({"spec": "layerskip", "draft_vocab": 100}, "draft_vocab=100 needs draft_vocab_corpus="),
])
def test_bad_options_give_one_clear_line(capsys, opts, message):
    assert run(DecodeOptions.from_flat(quiet=True, **opts)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_malformed_prompts_file_names_line_and_column(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"prompt": oops}\n')
    assert run(DecodeOptions.from_flat(quiet=True, prompts_file=str(f))) == 2
    assert f"{f}:2:12: invalid JSON" in capsys.readouterr().err
    f.write_text('{"text": "no prompt field"}\n')
    assert run(DecodeOptions.from_flat(quiet=True, prompts_file=str(f))) == 2
    assert 'string field "prompt"' in capsys.readouterr().err


@pytest.mark.real_model
def test_end_to_end_on_the_embedded_model(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["The sky is", "1, 2, 3,", "Hi"]))
    out = tmp_path / "out.jsonl"
    r = run_cli(f"prompts_file={prompts}", "max_new_tokens=8", "batch_size=2", f"output={out}")
    assert r.returncode == 0, r.stderr
    assert "compiling" in r.stderr and "stats:" in r.stderr and "tok/s" in r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows[:3]] == ["The sky is", "1, 2, 3,", "Hi"]
    assert all(0 < len(row["tokens"]) <= 8 for row in rows[:3])
    assert rows[1]["text"] in r.stdout
    assert rows[3]["stats"]["new_tokens"] == sum(len(row["tokens"]) for row in rows[:3])


def test_prompt_longer_than_context_is_refused(capsys, monkeypatch):
    from conftest import ByteTokenizer, tiny_config
    from flax import nnx

    from specjax.models.transformer import Transformer

    model = Transformer(tiny_config(max_seq_len=32), rngs=nnx.Rngs(0))
    monkeypatch.setattr("specjax.models.loading.load_model", lambda *a, **k: (model, ByteTokenizer()))
    assert run(DecodeOptions.from_flat(quiet=True, prompt="x" * 40, max_new_tokens=4)) == 2
    assert "exceeds the model's context of 32 tokens" in capsys.readouterr().err


@pytest.mark.real_model
def test_speculative_run_reports_tau_and_speedup(tmp_path):
    # A tiny model: the report's lines are what this tests (the embedded model's run: test_end_to_end_...).
    tiny = write_tiny_hf_model(tmp_path / "tiny_hf")
    prompt = "Repeat this list exactly: apples, pears, plums. Repeat this list exactly: apples, pears, plums."
    r = run_cli(f"model={tiny}", f'prompt="{prompt}"', "spec=ngram", "spec_k=4",  # quoted, as in a shell
                "max_new_tokens=12")
    assert r.returncode == 0, r.stderr
    assert "tau" in r.stderr and "acceptance by position" in r.stderr
    assert re.search(r"speedup over plain decoding of the same prompts: [0-9.]+x decoding \([0-9.]+x overall", r.stderr)


@pytest.mark.parametrize(("opts", "message"), [
    ({"spec": "layerskip", "spec_layers": 9}, "exceed the target's 3 layers (0 … 2)"),
    ({"spec": "layerskip", "spec_layer_list": [2, 0]}, "strictly increasing"),
    ({"spec": "layerskip", "draft_vocab": 8, "draft_vocab_corpus": "/nonexistent/c.txt"}, "no such file"),
])
def test_bad_drafter_options_on_a_loaded_model(capsys, monkeypatch, opts, message):
    from conftest import ByteTokenizer, tiny_config
    from flax import nnx

    from specjax.models.transformer import Transformer

    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    monkeypatch.setattr("specjax.models.loading.load_model", lambda *a, **k: (model, ByteTokenizer()))
    assert run(DecodeOptions.from_flat(quiet=True, prompt="abc", max_new_tokens=4, **opts)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_layerskip_run_on_a_tiny_model(capsys, monkeypatch):
    from conftest import ByteTokenizer, tiny_config
    from flax import nnx

    from specjax.models.transformer import Transformer

    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    monkeypatch.setattr("specjax.models.loading.load_model", lambda *a, **k: (model, ByteTokenizer()))
    opts = DecodeOptions.from_flat(quiet=True, prompt="abcabc", max_new_tokens=8, spec="layerskip", spec_layers=2,
                         compare_plain=False)
    assert run(opts) == 0
    assert "speculative k=4: tau" in capsys.readouterr().err
