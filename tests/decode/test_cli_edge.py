"""`python -m specjax.decode` as a user runs it (a subprocess): free text on the command line, one-line
errors with exit code 2 for every bad input, output= checked first, Ctrl-C keeping finished rows.

A tiny random Llama written as a Hugging Face directory (tests/tiny_hf.py) stands in for the model.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_hf import write_tiny_hf_model

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, stdin: bytes | None = None, cwd=None, timeout=240):
    """Runs the command like a shell would (argv as given); returns (code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's specjax, whatever the cwd
    r = subprocess.run([sys.executable, "-m", "specjax.decode", *args], input=stdin, capture_output=True,
                       timeout=timeout, cwd=cwd, env=env)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def assert_one_error_line(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_tiny_hf_model(tmp_path_factory.mktemp("tiny_hf")))


@pytest.fixture(scope="module")
def newline_model(tmp_path_factory):
    return str(write_tiny_hf_model(tmp_path_factory.mktemp("newline_hf"), always="\n"))


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------------------------------------- free text
def test_any_prompt_text_passes_without_hydra_quoting(tiny, tmp_path):
    text = "What's 2+2? Hello, world: [a, b] {x: 1} \"quoted\" a=b ${oops} 'c'"
    out = tmp_path / "out.jsonl"
    code, stdout, err = cli(f"model={tiny}", f"prompt={text}", "max_new_tokens=1", f"output={out}", "quiet=true")
    assert code == 0, err
    assert rows(out)[0]["prompt"] == text and stdout.startswith(text)


def test_prompt_file_and_stdin_are_one_prompt_each(tiny, tmp_path):
    text = "Line one, with 'quotes'.\n\nLine three: [x]"
    out = tmp_path / "out.jsonl"
    code, _, err = cli(f"model={tiny}", "prompt_file=-", "max_new_tokens=1", f"output={out}", "quiet=true",
                       stdin=(text + "\n").encode())
    assert code == 0, err
    assert rows(out)[0]["prompt"] == text  # the final newline an editor or echo adds is dropped


def test_stop_escapes_stop_at_a_blank_line(newline_model, tmp_path):
    out = tmp_path / "out.jsonl"
    # As the README writes it: in single quotes, the shell passes a backslash and an n.
    code, _, err = cli(f"model={newline_model}", "prompt=Hi", "max_new_tokens=8", 'stop=["\\n\\n"]',
                       f"output={out}", "quiet=true")
    assert code == 0, err
    row = rows(out)[0]
    assert (row["finish_reason"], len(row["tokens"])) == ("stop", 2), row  # a literal backslash-n never stops


def test_readme_regex_constrains_the_output(tiny, tmp_path):
    out = tmp_path / "out.jsonl"
    code, _, err = cli(f"model={tiny}", "prompt=Date:", "regex=[0-9]{4}-[0-9]{2}-[0-9]{2}", "max_new_tokens=12",
                       f"output={out}", "quiet=true")
    assert code == 0, err
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", rows(out)[0]["text"]), rows(out)[0]


# ----------------------------------------------------------------------------------- one line and exit 2
@pytest.mark.parametrize(("args", "message"), [
    (["temperatur=0.5"], "unknown option 'temperatur' (did you mean 'temperature'?)"),
    (["+foo=1"], "unknown option 'foo'"),
    (["max_new_tokens=many"], "max_new_tokens=many: Value 'many' of type 'str' could not be converted to Integer"),
    (["chat=maybe"], "chat=maybe: Value 'maybe' is not a valid bool"),
    (["spec_layer_list=[0,1"], "cannot parse 'spec_layer_list=[0,1'"),
    (["temperature=inf"], "temperature=inf: must be a finite number"),
    (["temperature=nan"], "temperature=nan: must be a finite number"),
    (["top_p=-inf"], "top_p=-inf: must be a finite number"),
    (["prompts_file=p.jsonl", "limit=0"], "limit=0: must be a positive integer"),
    (["prompts_file=p.jsonl", "limit=-1"], "limit=-1: must be a positive integer"),
    (["prompt=x", "limit=2"], "limit= applies to prompts_file= only"),
    (["regex="], "regex='': the pattern is empty"),
    (["stop=[1, 2]"], "expected one string or a list of quoted strings"),
    (["stop=[a,,b]"], "stop=[a,,b]: an item cannot be empty"),
    (["prompt=x", "prompt_file=-"], "give one of prompt=, prompt_file= or prompts_file=, not prompt and prompt_file"),
    (["prompt_file=missing.txt"], "prompt_file='missing.txt': no such file"),
    (["output=."], "output='.': is a directory"),
    (["output=no/such/dir/out.jsonl"], "output='no/such/dir/out.jsonl': no such directory 'no/such/dir'"),
])
def test_bad_input_is_one_error_line_before_loading(tmp_path, args, message):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    code, _, err = cli("model=/nonexistent/never-loaded.gguf", *args, cwd=tmp_path, timeout=120)
    assert_one_error_line(code, err, message)  # the model path is never reached: checked before loading


@pytest.mark.parametrize(("name", "option"), [("p.jsonl", "prompts_file"), ("p.txt", "prompt_file"),
                                              ("g.lark", "grammar"), ("s.json", "json_schema")])
def test_non_utf8_files_are_one_error_line(tmp_path, name, option):
    (tmp_path / name).write_bytes(b'{"prompt": "caf\xe9"}\n' if name.endswith("jsonl") else b'start: "caf\xe9"\n')
    code, _, err = cli("model=/nonexistent/never-loaded.gguf", f"{option}={name}", cwd=tmp_path, timeout=120)
    assert_one_error_line(code, err, f"{option}={name!r}: {name} is not valid UTF-8 (byte 0xe9 on line 1")


def test_non_utf8_prompt_argument_is_one_error_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "specjax.decode", b"prompt=caf\xe9"], capture_output=True, env=env,
                       timeout=120)
    assert_one_error_line(r.returncode, r.stderr.decode(), "prompt=: not valid UTF-8 (byte 0xe9 at character 3)")


def test_shard_index_pointing_outside_the_model_is_refused(tiny, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (model / f).write_bytes((Path(tiny) / f).read_bytes())
    (tmp_path / "secret.safetensors").write_bytes((Path(tiny) / "model.safetensors").read_bytes())
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "../secret.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    code, _, err = cli(f"model={model}", "quiet=true", timeout=120)
    assert_one_error_line(code, err, "shard '../secret.safetensors' lies outside the model directory")
    index["weight_map"]["model.norm.weight"] = str(tmp_path / "secret.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    code, _, err = cli(f"model={model}", "quiet=true", timeout=120)
    assert_one_error_line(code, err, "lies outside the model directory")


# ------------------------------------------------------------------------------------------------ Ctrl-C
N_INTERRUPTED = 50_000  # at batch 1, far more than a run can finish before the test's Ctrl-C


def test_ctrl_c_keeps_finished_rows_and_exits_130(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    # One prompt per batch and many batches: with its program loaded from the compile cache the tiny model
    # finished 2,000 prompts in big batches (8.5 s) before a loaded test process sent its Ctrl-C.
    prompts.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(N_INTERRUPTED)))
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "specjax.decode", f"model={tiny}", f"prompts_file={prompts}",
               "max_new_tokens=16", "batch_size=1", f"output={out}", "quiet=true"]
    # bufsize=0: a buffered reader's readline reads ahead, and communicate() reads the pipe's descriptor, not
    # that buffer, so whatever the read-ahead took (the rest of row 0, row 1) would be lost to the count below.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0)
    try:
        first = proc.stdout.readline()  # the first batch is printed as soon as it finishes
        assert first.startswith(b"--- [0] 'prompt 0'"), (first, proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.decode()
    assert proc.returncode == 130, err
    m = re.fullmatch(rf"error: interrupted; (\d+) of {N_INTERRUPTED} completion\(s\) written to stdout and \S+\n", err)
    assert m, err
    written = rows(out)
    assert 1 <= len(written) == int(m.group(1)) < N_INTERRUPTED
    assert [r["prompt"] for r in written] == [f"prompt {i}" for i in range(len(written))]
    assert (first + stdout).count(b"\n--- [") + 1 == len(written)


def test_a_first_ctrl_c_is_a_flag_checked_between_batches_and_a_second_one_interrupts():
    from specjax.decode.output import SoftInterrupt

    before = signal.getsignal(signal.SIGINT)
    with SoftInterrupt() as interrupt:
        interrupt.check()  # nothing came yet
        os.kill(os.getpid(), signal.SIGINT)  # handled at once, in this thread: no exception, a flag
        assert interrupt.requested
        with pytest.raises(KeyboardInterrupt):
            interrupt.check([])
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the second one: Python runs the handler right after the call
    assert signal.getsignal(signal.SIGINT) is before
