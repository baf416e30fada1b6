"""Splitting the selected tests into N shards of similar run time (`--shard I/N`, see tests/conftest.py).

`.ci/slow 1/2` runs one shard of the slow tier (a quicker local check; CI runs the whole tier).

Whole files are packed (their module fixtures, e.g. a loaded real model, are paid once per shard): longest
first, each into the shard with the least time so far, from the durations measured last
(`.ci/slow_durations.json`, seconds per file). A file missing from the table counts `DEFAULT_SECONDS`.
The packing depends only on the table and the file names, so every machine computes the same shards.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["DEFAULT_SECONDS", "DURATIONS", "assign", "longest_first", "parse_shard"]

DURATIONS = Path(__file__).resolve().parents[1] / ".ci" / "slow_durations.json"
DEFAULT_SECONDS = 60.0


class ShardError(ValueError):
    """A malformed --shard value."""


def parse_shard(text: str) -> tuple[int, int]:
    """"I/N" (1 <= I <= N) -> (I, N)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ShardError(f"--shard must be I/N with 1 <= I <= N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def assign(files: list[str], n: int, seconds: dict[str, float]) -> dict[str, int]:
    """file -> shard (1..n): longest-processing-time-first packing; ties broken by file name."""
    load = [0.0] * n
    out = {}
    for f in longest_first(files, seconds):
        i = min(range(n), key=lambda j: (load[j], j))
        out[f] = i + 1
        load[i] += seconds.get(f, DEFAULT_SECONDS)
    return out


def longest_first(files: list[str], seconds: dict[str, float]) -> list[str]:
    """The files in the order `.ci/slow` starts them when it runs several at once: longest first, so that
    the last to start are short (ties broken by file name)."""
    return sorted(set(files), key=lambda f: (-seconds.get(f, DEFAULT_SECONDS), f))


def measured() -> dict[str, float]:
    """The durations table (empty when the file is missing)."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
