"""Character sets as sorted code-point intervals, and their rendering as regex text.

Shared by the regex front-end and the JSON Schema front-end. Sets never contain surrogates
(U+D800..U+DFFF): they cannot occur in UTF-8 text, so a grammar over bytes could not use them.

Rendering targets two readers at once: Python `re` (which lark uses) and `interegular` (which a
compiler may use to build automata). interegular rejects `\\uXXXX` escapes, so non-ASCII
characters are written raw and only ASCII controls are written as `\\xNN`.
"""

from __future__ import annotations

import functools
import re

MAX_CP = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

Intervals = tuple[tuple[int, int], ...]


# Set algebra and rendering are pure functions of (hashable) interval tuples, called with the same few sets
# thousands of times per schema (key tries, classes of every pattern): memoized per process.
_memo = functools.lru_cache(maxsize=1 << 16)


def normalize(pairs) -> Intervals:
    """Sort, merge and strip surrogates from (lo, hi) inclusive intervals."""
    out: list[list[int]] = []
    for lo, hi in sorted(pairs):
        for a, b in ((lo, min(hi, SURROGATES[0] - 1)), (max(lo, SURROGATES[1] + 1), hi)):
            if a > b:
                continue
            if out and a <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
    return tuple((a, b) for a, b in out)


def of_chars(chars: str) -> Intervals:
    return normalize((ord(c), ord(c)) for c in chars)


def union(*sets: Intervals) -> Intervals:
    return normalize(p for s in sets for p in s)


@_memo
def complement(s: Intervals) -> Intervals:
    out, nxt = [], 0
    for lo, hi in s:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return normalize(out)


@_memo
def intersect(a: Intervals, b: Intervals) -> Intervals:
    return complement(union(complement(a), complement(b)))


@_memo
def difference(a: Intervals, b: Intervals) -> Intervals:
    return intersect(a, complement(b))


def contains(s: Intervals, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in s)


def size(s: Intervals) -> int:
    return sum(hi - lo + 1 for lo, hi in s)


ANY = normalize([(0, MAX_CP)])
DIGIT = of_chars("0123456789")
WORD = normalize([(48, 57), (65, 90), (95, 95), (97, 122)])
# ECMA-262 \s is WhiteSpace + LineTerminator; Python's \s is str.isspace(). We use the intersection
# so that a string we generate matches under both engines (U+FEFF is ECMA-only, \x1c-\x1f and U+0085
# are Python-only).
SPACE = normalize([(9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
                   (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)])
# ECMA-262 `.` (no s flag) excludes the four line terminators; Python's excludes only \n.
DOT = complement(of_chars("\n\r\u2028\u2029"))


@functools.cache
def _python_class(pattern: str) -> Intervals:
    """All code points that Python's `re` matches with a one-character `pattern` (computed once)."""
    rx = re.compile(pattern)
    pairs, start = [], None
    for cp in range(MAX_CP + 2):
        hit = cp <= MAX_CP and not (SURROGATES[0] <= cp <= SURROGATES[1]) and rx.match(chr(cp)) is not None
        if hit and start is None:
            start = cp
        elif not hit and start is not None:
            pairs.append((start, cp - 1))
            start = None
    return normalize(pairs)


def not_digit() -> Intervals:
    """\\D: outside every Unicode decimal digit (Python's \\d is a superset of ECMA's [0-9])."""
    return complement(_python_class(r"\d"))


def not_word() -> Intervals:
    return complement(_python_class(r"\w"))


def not_space() -> Intervals:
    ecma_only = of_chars("\ufeff")
    return complement(union(_python_class(r"\s"), ecma_only))


QUOTE = "\\x22"  # '"' in regex text: lark mangles a backslash followed by a raw quote inside /.../


def _char(cp: int) -> str:
    """One character inside a regex character class, readable by `re` and interegular."""
    c = chr(cp)
    if cp < 0x20 or cp == 0x7F or c == '"':
        return f"\\x{cp:02x}"
    if c in "\\]-[^/":
        return "\\" + c
    return c


@_memo
def class_text(s: Intervals) -> str:
    """A regex matching exactly one character of the non-empty set `s` (and no other non-surrogate).

    A set larger than its complement is written negated (`[^"\\\x00-\x1f]`): interegular, which
    automaton builders use, enumerates the characters of a positive class one by one but keeps a
    negated class as a single "anything else" symbol. (A negated class also admits surrogates,
    which valid text never contains.)
    """
    if not s:
        raise ValueError("empty character set")
    if len(s) == 1 and s[0][0] == s[0][1]:
        return escape_text(chr(s[0][0]))
    rest = complement(s)
    if not rest:
        return "(?:[^\\x00]|\\x00)"
    if size(rest) < size(s):
        return "[^" + _ranges(rest) + "]"
    return "[" + _ranges(s) + "]"


def _ranges(s: Intervals) -> str:
    parts = []
    for lo, hi in s:
        if lo == hi:
            parts.append(_char(lo))
        elif hi == lo + 1:
            parts.append(_char(lo) + _char(hi))
        else:
            parts.append(f"{_char(lo)}-{_char(hi)}")
    return "".join(parts)


_SPECIAL = set("\\.^$*+?{}[]|()/")


def escape_text(text: str) -> str:
    """A regex matching exactly `text` (slashes escaped for lark's /.../ terminals)."""
    out = []
    for c in text:
        cp = ord(c)
        if cp < 0x20 or cp == 0x7F or c == '"':
            out.append(f"\\x{cp:02x}")
        elif c in _SPECIAL:
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


# JSON text: the canonical encoding of one string character, as json.dumps(ensure_ascii=False) writes it.
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
JSON_RAW = difference(ANY, union(of_chars('"\\'), normalize([(0, 0x1F)])))


def json_encode_char(c: str) -> str:
    """Canonical JSON encoding of one character (inside a string literal)."""
    if c in _SHORT:
        return _SHORT[c]
    if ord(c) < 0x20:
        return f"\\u{ord(c):04x}"
    return c


@_memo
def json_class_text(s: Intervals) -> str:
    """Regex over JSON text matching the canonical encoding of any one character of `s`."""
    raw = intersect(s, JSON_RAW)
    alts = [class_text(raw)] if raw else []
    escaped = difference(s, JSON_RAW)
    if escaped == normalize([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]):  # all of them: a compact form
        return "(?:" + "|".join(alts + [r'\\["\\bfnrt]', r"\\u00(?:0[0-7bef]|1[0-9a-f])"]) + ")"
    for lo, hi in escaped:
        alts.extend(escape_text(json_encode_char(chr(cp))) for cp in range(lo, hi + 1))
    if not alts:
        raise ValueError("empty character set")
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
