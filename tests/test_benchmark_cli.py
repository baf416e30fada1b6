"""Benchmark scripts refuse bad options with one `error:` line and exit code 2 (before loading a model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROUNDS_LIMITS = "error: --k must be ≥ 1, --tokens ≥ 2 and --reps ≥ 2 (the first rep is dropped)"


@pytest.mark.parametrize(("script", "args", "message"), [
    ("packed_matmul.py", ["--model", "gemma3-270m", "--formats", "float32,nosuch"],
     "error: --formats: unknown 'nosuch' (known: float32, bfloat16, int8, q4)"),
    ("packed_matmul.py", ["--model", "gemma3-270m", "--rows", "1"], "error: --rows must be ≥ 2 and --reps ≥ 1"),
    ("packed_matmul.py", ["--model", "gemma3-270m", "--reps", "0"], "error: --rows must be ≥ 2 and --reps ≥ 1"),
    ("plain_rounds.py", ["--weights", "q3"], "error: --weights: unknown 'q3' (known: float32, bfloat16, int8, q4)"),
    ("plain_rounds.py", ["--k", "0"], ROUNDS_LIMITS),
    ("plain_rounds.py", ["--reps", "1"], ROUNDS_LIMITS),
    ("eagle_depth_acc.py", ["/nonexistent/run"], "error: no saved best checkpoint under /nonexistent/run"),
    ("eagle_depth_acc.py", ["/nonexistent/run", "--depth", "0"], "error: --depth must be in [1, 16]"),
    ("cli_start.py", ["--reps", "0"], "error: --reps and --new-tokens must be ≥ 1, --lcpp ≥ 0"),
    ("cli_start.py", ["--trees", "/nonexistent"], "error: --trees: /nonexistent is not a specjax source tree"),
])
def test_bad_options_are_one_error_line(script, args, message):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == message, r.stderr


# --------------------------------------------------------------------------- benchmarks/accelerator.py
def test_accelerator_benchmark_refuses_missing_assets_and_bad_sizes(tmp_path):
    script = str(ROOT / "benchmarks" / "accelerator.py")
    r = subprocess.run([sys.executable, script, "--assets", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "error: --assets must name a folder written by --prepare"
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "a"}\n')
    r = subprocess.run([sys.executable, script, "--assets", str(tmp_path), "--targets", "nosuch"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == f"error: --targets: no config.json under {tmp_path} for nosuch"
    r = subprocess.run([sys.executable, script, "--assets", str(tmp_path), "--profile", "min_product_rows=eight"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --profile 'min_product_rows=eight': the value must be JSON (e.g. min_product_rows=8)")


@pytest.mark.slow
def test_accelerator_benchmark_runs_every_setup_on_a_random_copy(tmp_path):
    """What a GPU session runs, on a random copy of the tiny model (float32 on CPU: greedy rounds equal
    plain decoding's tokens), so the script cannot rot between the sessions that are lent a GPU."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accelerator
    from tiny_hf import write_tiny_hf_model

    from specjax.models import load_model

    model, tok = load_model(str(write_tiny_hf_model(tmp_path / "hf")))
    accelerator.write_target(tmp_path / "assets" / "tiny", model.cfg, tok)
    prompts = [{"prompt": p} for p in ("abcabcabc", "hello hello")]
    (tmp_path / "assets" / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    out = tmp_path / "rows.jsonl"
    script = str(ROOT / "benchmarks" / "accelerator.py")
    r = subprocess.run([sys.executable, script, "--assets", str(tmp_path / "assets"), "--targets", "tiny",
                        "--setups", "ngram:4,lookup:6,recycle:4,eagle3:4", "--batch", "1,2",
                        "--tokens", "8", "--reps", "1", "--dtype", "float32", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()][1:]  # the first line: the config
    assert [(row["batch"], row["setup"]) for row in rows] == [
        (b, s) for b in (1, 2) for s in ("plain", "ngram:4", "lookup:6", "recycle:4", "eagle3:4")]
    for row in rows:
        assert row["ms"] > 0 and row["cost"] > 0 and row["tau"] >= 1.0
        if row["setup"] != "plain":
            assert row["same"] is True and row["first_diff"] == [None] * row["batch"], row
    assert "| tiny | 0 | 2 | eagle3:4 |" in r.stdout


@pytest.mark.slow
def test_cli_start_benchmark_times_the_default_model(tmp_path):
    """One repetition on the embedded model: every phase is timed, in order."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cli_start.py"), "--reps", "1", "--new-tokens",
                        "2"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("| gemma3-270m |")]
    first, ready, answer, end = map(float, row.strip(" |").split(" | ")[2:])
    assert 0 < first <= ready <= answer <= end
