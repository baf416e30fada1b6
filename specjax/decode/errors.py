"""The error every decode layer raises for a bad request, in a leaf module.

The host driver (`generate.py`), the speculative rounds (`spec/rounds.py`, traced) and the drafter
factory (`spec/drafters/registry.py`) all raise it; keeping it here lets the inner layers raise it
without importing the driver. The CLI turns it into one `error: ...` line and exit code 2.
"""

from __future__ import annotations


class GenerationError(ValueError):
    """Invalid generation request (prompt too long, bad option)."""
