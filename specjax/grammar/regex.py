"""Regex → Lark grammar front-end (full-match semantics), also used for JSON Schema `pattern`.

Patterns are parsed with Python's own `re` parser (`re._parser`, the parser `re.compile` and the
`jsonschema` package use), so the accepted syntax is exactly Python's. Character-class escapes
follow the intersection of ECMA-262 (JSON Schema's regex dialect) and Python: `\\d` is [0-9],
`\\w` is [A-Za-z0-9_], `.` excludes \\n \\r U+2028 U+2029, `$` means end of string. A string this
front-end generates therefore matches under both engines.

Supported: literals, classes (incl. negated, \\d \\w \\s \\D \\W \\S), `.`, groups (capturing,
non-capturing, named), alternation, greedy and lazy quantifiers (same language), `^` at the start
and `$` at the end (of the pattern or of each alternative, also inside groups: `_regex_anchors`).
Refused with `RegexError` naming the construct and its 1-based column: lookaround, backreferences, conditionals, atomic
groups, possessive quantifiers, inline flags, word boundaries, \\A \\Z, anchors elsewhere, empty
classes and syntax errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from re import _constants as C  # noqa: N812
from re import _parser as sre_parse

from specjax.grammar import _charsets as cs
from specjax.grammar._counted import MAX_POSITIONS, positions
from specjax.grammar._regex_anchors import alternatives

__all__ = ["RegexError", "class_repeat", "regex_to_lark", "translate", "width"]

ClassRender = Callable[[cs.Intervals], str]
_BAD_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE | re.ASCII | re.LOCALE
# Each class escape as (subset, superset) of what ECMA-262 and Python match: a positive class uses
# the subset, a negated class the superset, so the generated characters match under both engines.
_CATEGORIES = {
    C.CATEGORY_DIGIT: (lambda: cs.DIGIT, lambda: cs.complement(cs.not_digit())),
    C.CATEGORY_NOT_DIGIT: (cs.not_digit, lambda: cs.complement(cs.DIGIT)),
    C.CATEGORY_WORD: (lambda: cs.WORD, lambda: cs.complement(cs.not_word())),
    C.CATEGORY_NOT_WORD: (cs.not_word, lambda: cs.complement(cs.WORD)),
    C.CATEGORY_SPACE: (lambda: cs.SPACE, lambda: cs.complement(cs.not_space())),
    C.CATEGORY_NOT_SPACE: (cs.not_space, lambda: cs.complement(cs.SPACE)),
}


class RegexError(ValueError):
    """A regex that cannot be turned into a grammar exactly; the message names construct and column."""


# ------------------------------------------------------------------------------------ locating constructs
_SCAN = [
    ("lookaround", re.compile(r"\(\?<?[=!]")),
    ("conditional group", re.compile(r"\(\?\(")),
    ("atomic group", re.compile(r"\(\?>")),
    ("backreference", re.compile(r"\\[1-9]|\(\?P=|\\k<")),
    ("inline flag", re.compile(r"\(\?[aiLmsux-]+[:)]")),
    ("possessive quantifier", re.compile(r"(?:[*+?}])\+")),
    ("word boundary", re.compile(r"\\[bB]")),
    ("string anchor", re.compile(r"\\[AZ]")),
    ("anchor", re.compile(r"[\^$]")),
]


def _column(pattern: str, kind: str, skip_ends: bool = False) -> int | None:
    """1-based column of the first `kind` construct outside character classes (None if not found)."""
    rx = dict(_SCAN)[kind]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "[":  # skip a class: escapes inside, and a ']' right after '[' or '[^' is literal
            j = i + 1 + (pattern.startswith("^", i + 1))
            j += pattern.startswith("]", j)
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            continue
        m = rx.match(pattern, i)
        at_end = i == 0 or i == n - 1 or pattern[i - 1] in "|(" or pattern[i + 1: i + 2] in ("|", ")")
        if m and not (skip_ends and at_end):
            return i + 1
        i += 2 if c == "\\" else 1
    return None


def _refuse(pattern: str, kind: str, why: str, skip_ends: bool = False) -> RegexError:
    col = _column(pattern, kind, skip_ends)
    where = f" at column {col}" if col else ""
    return RegexError(f"regex {pattern!r}: {kind}{where} is not supported ({why})")


# ------------------------------------------------------------------------------------------------ parsing
def _parse(pattern: str) -> sre_parse.SubPattern:
    if not isinstance(pattern, str):
        raise RegexError(f"regex must be a string, got {type(pattern).__name__}")
    try:
        tree = sre_parse.parse(pattern)
    except re.error as e:
        col = (e.pos or 0) + 1
        raise RegexError(f"regex {pattern!r}: syntax error at column {col}: {e.msg}") from None
    if tree.state.flags & _BAD_FLAGS:
        raise _refuse(pattern, "inline flag", "flags change matching semantics")
    return tree


def _check_size(pattern: str, tree) -> None:
    """Refuses counted repetitions that unroll past ``MAX_POSITIONS`` (one automaton state per position)."""
    if (size := positions(tree)) > MAX_POSITIONS:
        shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
        raise RegexError(f"regex {shown!r}: counted repetitions unroll to {size:,} character positions (limit "
                         f"{MAX_POSITIONS:,}): an automaton counts with one state per position; use smaller counts, "
                         "or an unbounded repetition (*, +) where the exact count does not matter")


# ----------------------------------------------------------------------------------------------- emitting
class _Emitter:
    """Walks the parse tree and writes regex text over the output alphabet given by `render`."""

    def __init__(self, pattern: str, render: ClassRender):
        self.pattern, self.render = pattern, render

    def seq(self, items) -> str:
        return "".join(self.item(op, av) for op, av in items)

    def item(self, op, av) -> str:  # noqa: C901 - one branch per regex construct keeps the mapping readable
        if op is C.LITERAL:
            return self.render(cs.of_chars(chr(av)))
        if op is C.NOT_LITERAL:
            return self._set(cs.complement(cs.of_chars(chr(av))))
        if op is C.ANY:
            return self._set(cs.DOT)
        if op is C.IN:
            return self._set(self._class(av))
        if op is C.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                raise _refuse(self.pattern, "inline flag", "flags change matching semantics")
            return "(?:" + self.seq(sub) + ")"
        if op is C.BRANCH:
            return "(?:" + "|".join(self.seq(alt) for alt in av[1]) + ")"
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            return _quantify(self.seq(sub), lo, hi)
        raise self._unsupported(op)

    def _set(self, s: cs.Intervals) -> str:
        if not s:
            raise RegexError(f"regex {self.pattern!r}: character class matches no character (empty language)")
        return self.render(s)

    def _class(self, av) -> cs.Intervals:
        negate, parts = any(op is C.NEGATE for op, _ in av), []
        for op, arg in av:
            if op is C.NEGATE:
                continue
            elif op is C.LITERAL:
                parts.append(cs.of_chars(chr(arg)))
            elif op is C.RANGE:
                parts.append(cs.normalize([arg]))
            elif op is C.CATEGORY:
                parts.append(_CATEGORIES[arg][negate]())
            else:
                raise self._unsupported(op)
        s = cs.union(*parts)
        return cs.complement(s) if negate else s

    def _unsupported(self, op) -> RegexError:
        kinds = {C.ASSERT: "lookaround", C.ASSERT_NOT: "lookaround", C.GROUPREF: "backreference",
                 C.GROUPREF_EXISTS: "conditional group", C.ATOMIC_GROUP: "atomic group",
                 C.POSSESSIVE_REPEAT: "possessive quantifier"}
        if op is C.AT:
            return self._anchor_error()
        kind = kinds.get(op, str(op).lower())
        if kind not in dict(_SCAN):
            return RegexError(f"regex {self.pattern!r}: {kind} is not supported")
        return _refuse(self.pattern, kind, "not expressible as a regular language without a backtracking engine"
                       if kind != "lookaround" else "lookaround is not expressible in the grammar interface")

    def _anchor_error(self) -> RegexError:
        for kind in ("word boundary", "string anchor"):
            if _column(self.pattern, kind):
                return _refuse(self.pattern, kind, "only ^ at the start and $ at the end are supported")
        return _refuse(self.pattern, "anchor", "only ^ at the start and $ at the end are supported", skip_ends=True)


def _quantify(body: str, lo: int, hi: int) -> str:
    atom = body if _is_atom(body) else f"(?:{body})"
    if hi == C.MAXREPEAT:
        return atom + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return atom + "?"
    if (lo, hi) == (1, 1):
        return body
    return atom + (f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")


def _is_atom(text: str) -> bool:
    """True when `text` is one escaped char, one class, or one group (safe to quantify as is)."""
    if len(text) == 1 or (len(text) == 2 and text[0] == "\\") or re.fullmatch(r"\\x[0-9a-f]{2}", text):
        return True
    if text.startswith("[") and text.endswith("]"):
        return re.fullmatch(r"\[(?:\\.|[^\\\]])*\]", text) is not None
    if text.startswith("(?:") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            if ch == "\\":
                continue
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and i < len(text) - 1:
                return False
        return True
    return False


def _alternatives(pattern: str, tree) -> list[tuple[bool, list, bool]]:
    """Top-level alternatives as (anchored start, body, anchored end) (see `_regex_anchors`)."""
    return alternatives(tree)


def translate(pattern: str, render: ClassRender = cs.class_text, search: bool = False) -> str:
    """Regex text for the language of `pattern`, with every character rendered by `render`.

    Args:
      pattern: the regex (Python `re` syntax).
      render: renders one character set as regex text over the output (raw chars, or JSON-escaped).
      search: JSON Schema semantics (`re.search`): an unanchored side may have any text around it.
        False: full-match semantics, where `^` at the start and `$` at the end are no-ops.

    Returns:
      Regex text using only literals, classes, non-capturing groups, alternation and quantifiers.

    Raises:
      RegexError: unsupported construct or syntax error (the message has the column).
    """
    tree = _parse(pattern)
    _check_size(pattern, tree)
    emitter = _Emitter(pattern, render)
    anything = render(cs.ANY) + "*"
    alts = []
    for start, body, end in _alternatives(pattern, tree):
        text = emitter.seq(body)
        if search:
            text = ("" if start else anything) + text + ("" if end else anything)
        alts.append(text)
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def width(pattern: str, search: bool = False) -> tuple[int, int | None]:
    """(min, max) length in characters of the strings `pattern` matches in full (max None: unbounded)."""
    tree = _parse(pattern)
    lo, hi = tree.getwidth()
    unbounded = hi >= C.MAXREPEAT or (search and any(not (s and e) for s, _, e in _alternatives(pattern, tree)))
    return lo, None if unbounded else hi


def class_repeat(pattern: str) -> tuple[cs.Intervals, int, int | None] | None:
    """(characters, min, max) when `pattern` is exactly ^[class]{min,max}$ (or one char class); else None."""
    tree = _parse(pattern)
    alts = _alternatives(pattern, tree)
    if len(alts) != 1 or not (alts[0][0] and alts[0][2]) or len(alts[0][1]) != 1:
        return None
    op, av = alts[0][1][0]
    lo = hi = 1
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        lo, hi, sub = av
        if len(sub) != 1:
            return None
        op, av = sub[0]
    chars = {C.LITERAL: lambda: cs.of_chars(chr(av)), C.NOT_LITERAL: lambda: cs.complement(cs.of_chars(chr(av))),
             C.ANY: lambda: cs.DOT, C.IN: lambda: _Emitter(pattern, cs.class_text)._class(av)}
    if op not in chars:
        return None
    return chars[op](), lo, None if hi == C.MAXREPEAT else hi


def regex_to_lark(pattern: str, form: str = "rules") -> str:
    """A Lark grammar (start rule `start`) whose language is exactly the strings `pattern` full-matches.

    Args:
      pattern: the regex (Python `re` syntax; `^`/`$` at the ends are no-ops).
      form: "rules" (default): alternation and repetition become grammar rules over literal and
        one-character-class terminals, so lark's Earley parser accepts exactly the language.
        "terminal": one /regex/ terminal per non-nullable part. Same language for a compiler that
        builds automata from terminals, but lark lexes a terminal with Python's first-match
        alternation, so lark itself rejects e.g. "ab" for `a|ab` in this form.

    Raises:
      RegexError: unsupported construct or syntax error (the message has the column).
    """
    if form not in ("rules", "terminal"):
        raise ValueError(f"form must be 'rules' or 'terminal', got {form!r}")
    tree = _parse(pattern)
    _check_size(pattern, tree)
    lower = _Lowering(_Emitter(pattern, cs.class_text), terminal=form == "terminal")
    alts = [lower.seq(body) for _, body, _ in _alternatives(pattern, tree)]
    return "".join(f"{name}: {body}\n" for name, body in [("start", _union(alts)), *lower.rules.items()])


def _union(alts: list[str]) -> str:
    """EBNF alternation where "" (the empty string) is an alternative."""
    nonempty = list(dict.fromkeys(a for a in alts if a))
    if not nonempty:
        return ""
    body = nonempty[0] if len(nonempty) == 1 else "(" + " | ".join(nonempty) + ")"
    # Optional only if "" itself is an alternative (not because duplicates were dropped).
    return f"({body})?" if any(not a for a in alts) else body


def _nullable(items) -> bool:
    return sre_parse.SubPattern(sre_parse.State(), list(items)).getwidth()[0] == 0


class _Lowering:
    """Regex parse tree → Lark EBNF; `terminal`: stop at the first non-nullable part (one /regex/)."""

    def __init__(self, emitter: _Emitter, terminal: bool):
        self.emitter, self.terminal = emitter, terminal
        # Helper rules: each repeated group is its own rule. Inline, lark would expand the group's inner
        # optionals and counts into one alternative per combination, multiplied across nesting levels:
        # (((a{1,2}b?){1,2}c?){1,2}d?){2} was ~10 M alternatives (106 s in lark's loader).
        self.rules: dict[str, str] = {}
        self._count = 0

    def seq(self, items) -> str:
        items = list(items)
        if not items:
            return ""
        if self.terminal and not _nullable(items):
            return f"/{self.emitter.seq(items)}/"
        parts, run = [], []
        for op, av in items:
            if op is C.LITERAL and 0x20 <= av < 0x7F and chr(av) not in '"\\':
                run.append(chr(av))  # printable literals merge into one string terminal
                continue
            if run:
                parts.append('"' + "".join(run) + '"')
                run = []
            parts.append(self.item(op, av))
        if run:
            parts.append('"' + "".join(run) + '"')
        return " ".join(p for p in parts if p)

    def item(self, op, av) -> str:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return f"/{self.emitter.item(op, av)}/"
        if op is C.SUBPATTERN:
            if av[1] or av[2]:
                self.emitter.item(op, av)  # raises the inline-flag refusal
            inner = self.seq(av[3])
            return f"({inner})" if inner else ""
        if op is C.BRANCH:
            return _union([self.seq(alt) for alt in av[1]])
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            return self.repeat(*av)
        raise self.emitter._unsupported(op)

    def repeat(self, lo: int, hi: int, sub) -> str:
        if sre_parse.SubPattern(sre_parse.State(), list(sub)).getwidth()[1] == 0:
            return ""  # (?:){3}: repeating the empty string is the empty string
        if _nullable(sub):  # (a?)* has infinitely many parses of "": lark's Earley does not accept it
            raise RegexError(f"regex {self.emitter.pattern!r}: a repeated sub-pattern that can match the empty "
                             "string is not supported")
        if hi == 0:
            return ""
        atom = self.seq(sub)
        if not re.fullmatch(r'"[^"\\]*"|/[^/]*/|[a-z_0-9]+', atom):  # one terminal or rule stays inline
            atom = self._helper(atom)
        if hi == C.MAXREPEAT:
            return f"{atom}*" if lo == 0 else f"{atom}+" if lo == 1 else f"{atom}~{lo} {atom}*"
        if (lo, hi) == (0, 1):
            return f"{atom}?"
        if lo == hi:
            return f"{atom}~{lo}"
        if hi - lo <= 4:
            return f"{atom}~{lo}..{hi}"
        # lark writes x~lo..hi as one alternative per count (quadratic); a chain of rules is linear:
        # up to k more copies = (x (up to k-1 more))?
        name = self._name()
        for k in range(hi - lo, 0, -1):
            self.rules[f"{name}_{k}"] = f"({atom} {name}_{k - 1})?" if k > 1 else f"{atom}?"
        more = f"{name}_{hi - lo}"
        return f"{atom}~{lo} {more}" if lo else more

    def _name(self) -> str:
        self._count += 1
        return f"_r{self._count}"

    def _helper(self, body: str) -> str:
        name = self._name()
        self.rules[name] = body
        return name
