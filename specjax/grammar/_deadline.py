"""The compile time limit (``GrammarOptions.timeout``): a deadline that the compiler's loops check.

Every phase that can run long (terminal automata, the subset construction, minimisation, the vocabulary walk)
calls :func:`check` once per unit of work, so a grammar that would take minutes stops within a fraction of a
second of its limit with one :class:`GrammarError`. Inputs that would spend their time inside third-party code
that cannot be interrupted (lark's EBNF expansion, interegular) are bounded before they get there (see
``regex.py``'s and ``terminals.py``'s repetition limits).
"""

from __future__ import annotations

import contextlib
import contextvars
import time

from specjax.grammar.errors import GrammarError

__all__ = ["check", "deadline", "phase"]

# (thread CPU-time deadline, limit in seconds, phase name, start time); None: no limit (a phase run on its own).
_DEADLINE: contextvars.ContextVar[tuple[float, float, list[str], float] | None] = contextvars.ContextVar(
    "specjax_grammar_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Limits the compile work inside the block to ``seconds`` of CPU time (None: no limit).

    CPU time of the compiling thread, not wall time: on a loaded machine (other processes, a busy CI runner) the
    same grammar passes or fails alike, and a test never becomes flaky because its neighbour was busy.
    """
    if seconds is None:
        yield
        return
    now = time.thread_time()
    token = _DEADLINE.set((now + seconds, seconds, ["loading"], now))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def phase(name: str) -> None:
    """Names the phase now running, for the message of a timeout."""
    if (d := _DEADLINE.get()) is not None:
        d[2][0] = name


def check() -> None:
    """Raises :class:`GrammarError` once the current deadline has passed (cheap: one clock read)."""
    d = _DEADLINE.get()
    if d is not None and time.thread_time() > d[0]:
        raise GrammarError(
            f"compiling the grammar took longer than its time limit of {d[1]:g} s of CPU time (stopped in the "
            f"{d[2][0]} phase after {time.thread_time() - d[3]:.1f} s): simplify it (smaller repetition counts, lower "
            "max_depth), or raise the limit: GrammarOptions(timeout=...), grammar_timeout=... on the command line")
