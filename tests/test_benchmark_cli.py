"""Benchmark scripts refuse bad options with one `error:` line and exit code 2 (before loading a model)."""

from __future__ import annotations

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
])
def test_bad_options_are_one_error_line(script, args, message):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == message, r.stderr
