"""Shape buckets: every traced size is rounded up to one of a few values, so few programs compile.

Used for prompt lengths and new-token budgets (`generate.py`) and for the state / mask-row counts of a
batch's stacked grammars (`constrain.prepare`).
"""

from __future__ import annotations

__all__ = ["bucket", "prompt_bucket"]


def bucket(n: int, minimum: int = 16) -> int:
    """Next power of two >= n (and >= minimum): a handful of shapes, so few compilations."""
    return max(minimum, 1 << max(0, (n - 1).bit_length()))


def prompt_bucket(n: int, minimum: int = 16) -> int:
    """Next of 16, 24, 32, 48, 64, 96, … >= n: prefill is compute-bound, so padding is capped at
    1.5x (not 2x) for twice the number of shapes."""
    p = bucket(n, minimum)
    return p * 3 // 4 if p * 3 // 4 >= max(n, minimum) else p
