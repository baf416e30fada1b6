"""lark's own python.lark, made loadable by specjax for expressions (start rule ``eval_input``).

Three of its terminals use lookaround, which a byte automaton cannot express: ``DEC_NUMBER``'s ``(?![1-9])``
and the string literals' ``(?!"")`` / ``(?<!\\)`` (with lazy ``.*?``). ``OVERRIDES`` replaces them with
regular definitions of the same lexemes (lark's ``%override``), so the rest of the file is used as it is:

* ``STRING``: a quote, then characters other than the quote, backslash and newline or a backslash escape
  of any non-newline character, then the quote (what the lazy body up to an unescaped quote matches);
* ``LONG_STRING``: triple quotes around a body without an unescaped triple quote that does not end in an
  unescaped quote (the lazy body's first closing triple quote);
* ``DEC_NUMBER``: without the lookahead, ``0`` before a digit would end ``0``; our greedy lexer never ends
  a lexeme that a live terminal (``FLOAT_NUMBER``'s ``_SPECIAL_DEC``) can still extend, so ``01`` is still
  refused.
"""

from __future__ import annotations

from pathlib import Path

import lark

PATH = Path(lark.__file__).parent / "grammars" / "python.lark"

def _short_body(q: str) -> str:
    """A short string's body: any character but the quote, backslash and newline, or an escape (no newline)."""
    return rf"([^{q}\\\n]|\\.)*"


def _long_body(q: str) -> str:
    """A long string's body: runs of at most two quotes, each followed by another character or an escape."""
    return rf"([^{q}\\]|\\.|{q}[^{q}\\]|{q}\\.|{q}{q}[^{q}\\]|{q}{q}\\.)*"


_PREFIX = "([ubf]?r?|r[ubf])"
OVERRIDES = "\n".join([
    "",
    f"%override STRING: /{_PREFIX}(\"{_short_body(chr(34))}\"|'{_short_body(chr(39))}')/i",
    f"%override LONG_STRING: /{_PREFIX}({3 * chr(34)}{_long_body(chr(34))}{3 * chr(34)}"
    f"|{3 * chr(39)}{_long_body(chr(39))}{3 * chr(39)})/is",
    '%override DEC_NUMBER: "1".."9" ("_"? "0".."9")* | "0" ("_"? "0")*',
    "",
])


def python_lark(overrides: bool = True) -> str:
    """python.lark's text, with ``OVERRIDES`` appended unless ``overrides`` is False."""
    return PATH.read_text() + (OVERRIDES if overrides else "")
