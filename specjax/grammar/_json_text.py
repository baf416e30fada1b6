"""Lark text pieces of the JSON Schema compiler: literals, string terminals, key tries, counted repeats."""

from __future__ import annotations

from specjax.grammar import _charsets as cs
from specjax.grammar._counted import MAX_POSITIONS
from specjax.grammar._json_schema_logic import SchemaError

NUMBER_REGEX = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+\-]?[0-9]+)?"
_MAX_SAFE = 2**53


def lark_literal(text: str) -> str:
    """A Lark string literal matching exactly `text` (JSON text: no raw control characters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def json_string_terminal(content: str) -> str:
    """A /regex/ terminal for a JSON string: quotes around `content` (regex over the escaped text).

    Quotes are written \\x22: lark rewrites a backslash-quote pair inside /.../, which would turn
    an escaped backslash followed by a quote into an escaped quote.
    """
    return f"/{cs.QUOTE}{content}{cs.QUOTE}/"


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _trie(names: list[str]) -> dict:
    """The names as a character trie: nested dicts, "" marks the end of a name."""
    trie: dict = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = True
    return trie


def _check_count(kw: str, path: str, count: int, what: str, at_least: bool = True) -> None:
    """Refuses a length bound that would unroll into more automaton states than the regex limit allows."""
    if count > MAX_POSITIONS:
        bound = "at least" if at_least else "up to"
        raise SchemaError(kw, path, f"{bound} {count:,} {what}: a DFA counts with one state per {what[:-1]} (limit "
                                    f"{MAX_POSITIONS:,} per string or array); lower {kw} in the schema")


def _repeat(char: str, lo: int, hi: int | None) -> str:
    if hi is None:
        return f"{char}*" if lo == 0 else f"{char}+" if lo == 1 else f"{char}{{{lo},}}"
    return "" if hi == 0 else f"{char}{{{lo}}}" if lo == hi else f"{char}{{{lo},{hi}}}"
