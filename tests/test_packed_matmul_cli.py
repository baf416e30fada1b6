"""benchmarks/packed_matmul.py refuses bad options with one `error:` line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("args", "message"), [
    (["--formats", "float32,nosuch"], "error: --formats: unknown 'nosuch' (known: float32, bfloat16, int8, q4)"),
    (["--rows", "1"], "error: --rows must be ≥ 2 and --reps ≥ 1"),
    (["--reps", "0"], "error: --rows must be ≥ 2 and --reps ≥ 1"),
])
def test_bad_options_are_one_error_line(args, message):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "packed_matmul.py"), "--model", "gemma3-270m", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == message, r.stderr
