"""The one exception type of the grammar engine."""

from __future__ import annotations

__all__ = ["GrammarError"]


class GrammarError(ValueError):
    """A grammar that cannot be compiled exactly: a syntax error (with line and column), an undefined
    rule or terminal, an empty language, an unsupported construct, or a grammar past a size limit.

    The message names the cause (rule, terminal, regex construct or option) and, for size limits, the
    option that would change the outcome.
    """
