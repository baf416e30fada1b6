"""Lark terminals (string literals and Python regexes) → deterministic automata over UTF-8 bytes.

Regexes go through interegular (Python regex syntax → FSM over characters). Its character classes
(including "any other character") are expanded to UTF-8 byte sequences with the usual range-splitting
construction (as in RE2 / Rust's utf8-ranges), then determinised over bytes, so that a token holding
half of a multi-byte character simply stops in an inner state.

Constructs whose meaning depends on context outside the terminal (anchors, ``\\b``, lookaround) or that
are not regular (backreferences) are refused: they would make the automaton silently wrong.
"""

from __future__ import annotations

import collections
import re
import re._constants as sre_constants
import re._parser as sre_parse
import threading

import interegular
import numpy as np
from interegular.fsm import anything_else

from specjax.grammar import _deadline
from specjax.grammar._counted import MAX_POSITIONS, MAX_POSITIONS_INTEREGULAR, positions, sequence_dfa, split_counted
from specjax.grammar._dfa import ByteDFA, minimal_dfa
from specjax.grammar.errors import GrammarError

__all__ = ["ByteDFA", "terminal_dfa", "literal_dfa", "regex_dfa", "remember_terminal", "trie_dfa"]

_MAX_CP = 0x10FFFF
_UNSUPPORTED = {sre_constants.AT: "anchor or \\b", sre_constants.ASSERT: "lookaround",
                sre_constants.ASSERT_NOT: "negative lookaround", sre_constants.GROUPREF: "backreference",
                sre_constants.GROUPREF_EXISTS: "conditional group"}
_UNICODE_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")
# Lark terminal text (``/.../`` as written) → a builder of its DFA, from a front-end that knows the terminal's
# structure (the JSON Schema compiler's "any other key": a difference of two automata, milliseconds, where the
# regex it writes takes interegular seconds). The text stays the definition; this is only a faster way to it.
_KNOWN: collections.OrderedDict = collections.OrderedDict()
_KNOWN_MAX = 1024
_KNOWN_LOCK = threading.Lock()  # grammars may be compiled on several threads


def terminal_dfa(name: str, pattern) -> ByteDFA:
    """The byte DFA of a lark ``PatternStr`` / ``PatternRE``.

    Raises:
      GrammarError: naming the terminal and the construct, for unsupported regexes or terminals that match
        the empty string.
    """
    with _KNOWN_LOCK:
        build = _KNOWN.get(getattr(pattern, "raw", None)) if not pattern.flags else None
    if build is not None:
        dfa = build()
    elif type(pattern).__name__ == "PatternStr" and not pattern.flags:
        dfa = literal_dfa(pattern.value.encode("utf-8"))
    else:
        dfa = regex_dfa(pattern.to_regexp(), where=f"terminal {name}")
    if dfa.accept[0]:
        raise GrammarError(f"terminal {name} ({pattern.to_regexp()!r}) matches the empty string; "
                           "make it non-empty and make its use optional in the rule instead")
    return dfa


def remember_terminal(text: str, build) -> None:
    """Registers ``build()`` as the way to the DFA of the Lark terminal written ``text`` (e.g. ``/a|b/``).

    For a front-end that writes a terminal whose automaton it can build directly; ``build`` must give exactly
    the language of ``text`` (a grammar compiled from the text elsewhere gets the same DFA the long way). The
    last 1,024 registrations are kept.
    """
    with _KNOWN_LOCK:
        _KNOWN[text] = build
        _KNOWN.move_to_end(text)
        while len(_KNOWN) > _KNOWN_MAX:
            _KNOWN.popitem(last=False)


def trie_dfa(words) -> ByteDFA:
    """The DFA (a trie, not minimised) accepting exactly the byte strings ``words``."""
    nodes: list[dict[int, int]] = [{}]
    ends = set()
    for word in words:
        q = 0
        for byte in word:
            q = nodes[q].setdefault(byte, len(nodes))
            if q == len(nodes):
                nodes.append({})
        ends.add(q)
    trans = np.full((len(nodes), 256), -1, np.int32)
    for q, kids in enumerate(nodes):
        trans[q, list(kids)] = list(kids.values())
    accept = np.zeros(len(nodes), bool)
    accept[sorted(ends)] = True
    return ByteDFA(trans, accept)


def literal_dfa(data: bytes) -> ByteDFA:
    trans = np.full((len(data) + 1, 256), -1, np.int32)
    trans[np.arange(len(data)), np.frombuffer(data, np.uint8)] = np.arange(1, len(data) + 1)
    accept = np.zeros(len(data) + 1, bool)
    accept[-1] = True
    return ByteDFA(trans, accept)


def regex_dfa(regex: str, where: str = "regex") -> ByteDFA:
    """The byte DFA of a Python regex (full match).

    Raises:
      GrammarError: a syntax error or an unsupported construct, naming ``where`` and the construct.
    """
    size = _check_supported(regex, where)
    _check_size(regex, where, size, MAX_POSITIONS, "")
    regex = _UNICODE_ESCAPE.sub(lambda m: m[1] + re.escape(chr(int(m[2] or m[3], 16))), regex)
    if (pieces := split_counted(regex)) is not None:
        parts = [(d.trans, d.accept, lo, hi) for d, lo, hi in ((regex_dfa(p, where), lo, hi) for p, lo, hi in pieces)]
        return minimal_dfa(*sequence_dfa(parts))
    _check_size(regex, where, size, MAX_POSITIONS_INTEREGULAR, ", with counts inside groups or alternatives")
    try:
        fsm = interegular.parse_pattern(regex).to_fsm()
    except Exception as e:  # interegular raises several unrelated types
        raise GrammarError(f"{where}: cannot compile regex {regex!r}: {e}") from e
    return _bytes_from_chars(fsm)


def _check_size(regex: str, where: str, size: int, limit: int, how: str) -> None:
    if size > limit:
        shown = regex if len(regex) <= 80 else regex[:77] + "..."
        raise GrammarError(f"{where}: {shown!r} is too large: {size:,} character positions once its counted "
                           f"repetitions are unrolled{how} (limit {limit:,}): an automaton needs about one state per "
                           "position; use smaller counts, or an unbounded repetition (*, +) where the exact count "
                           "does not matter")


def _check_supported(regex: str, where: str) -> int:
    """Refuses constructs the automaton cannot express; returns the regex's unrolled size (:func:`positions`)."""
    try:
        tree = sre_parse.parse(regex)
    except re.error as e:
        raise GrammarError(f"{where}: invalid regex {regex!r}: {e}") from e

    def walk(items) -> None:
        for op, arg in items:
            if op in _UNSUPPORTED:
                raise GrammarError(f"{where}: unsupported regex construct ({_UNSUPPORTED[op]}) in {regex!r}; "
                                   "only regular constructs without context conditions are supported")
            for sub in arg if isinstance(arg, (list, tuple)) else ():
                if isinstance(sub, sre_parse.SubPattern):
                    walk(sub)
                elif isinstance(sub, (list, tuple)):
                    for x in sub:
                        if isinstance(x, sre_parse.SubPattern):
                            walk(x)
            if isinstance(arg, sre_parse.SubPattern):
                walk(arg)

    walk(tree)
    return positions(tree)


def _bytes_from_chars(fsm) -> ByteDFA:
    """Determinises interegular's character FSM over UTF-8 bytes."""
    mapping = fsm.alphabet._symbol_mapping
    explicit = sorted(ord(c) for c in mapping if c is not anything_else)
    ranges: dict[int, list[tuple[int, int]]] = {}
    for c, k in mapping.items():
        if c is not anything_else:
            ranges.setdefault(k, []).append((ord(c), ord(c)))
    if anything_else in mapping:
        ranges.setdefault(mapping[anything_else], []).extend(_complement(explicit))
    states = sorted(fsm.states)
    index = {s: i for i, s in enumerate(states)}
    # NFA over bytes: nodes 0..len(states)-1 are the FSM's states, then inner nodes of byte sequences.
    edges: list[dict[int, set[int]]] = [dict() for _ in states]
    inner: dict[tuple, int] = {}

    def node_for(suffix: tuple[tuple[int, int], ...], target: int) -> int:
        if not suffix:
            return target
        key = (suffix, target)
        if key not in inner:
            inner[key] = len(edges)
            edges.append({})
            nxt = node_for(suffix[1:], target)
            lo, hi = suffix[0]
            for b in range(lo, hi + 1):
                edges[inner[key]].setdefault(b, set()).add(nxt)
        return inner[key]

    for s, row in fsm.map.items():
        for k, t in row.items():
            for lo, hi in ranges.get(k, ()):
                for seq in _utf8_sequences(lo, hi):
                    nxt = node_for(tuple(seq[1:]), index[t])
                    for b in range(seq[0][0], seq[0][1] + 1):
                        edges[index[s]].setdefault(b, set()).add(nxt)
    finals = {index[s] for s in fsm.finals}
    return _determinise(edges, index[fsm.initial], finals)


def _determinise(edges: list[dict[int, set[int]]], start: int, finals: set[int]) -> ByteDFA:
    ids = {frozenset([start]): 0}
    order = [frozenset([start])]
    rows: list[list[int]] = []
    while len(rows) < len(order):
        if len(rows) % 64 == 0:
            _deadline.check()
        subset = order[len(rows)]
        row = [-1] * 256
        targets: dict[int, set[int]] = {}
        for n in subset:
            for b, ts in edges[n].items():
                targets.setdefault(b, set()).update(ts)
        for b, ts in targets.items():
            key = frozenset(ts)
            if key not in ids:
                ids[key] = len(order)
                order.append(key)
            row[b] = ids[key]
        rows.append(row)
    accept = np.array([bool(s & finals) for s in order], bool)
    return minimal_dfa(np.array(rows, np.int32).reshape(len(order), 256), accept)


def _complement(points: list[int]) -> list[tuple[int, int]]:
    out, lo = [], 0
    for p in points:
        if p > lo:
            out.append((lo, p - 1))
        lo = max(lo, p + 1)
    if lo <= _MAX_CP:
        out.append((lo, _MAX_CP))
    return out


def _utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Splits code points [lo, hi] into sequences of byte ranges whose product is exactly their UTF-8."""
    out, todo = [], [(lo, hi)]
    while todo:
        lo, hi = todo.pop()
        if lo > hi:
            continue
        if lo <= 0xDFFF and hi >= 0xD800:  # surrogates have no UTF-8 encoding
            todo += [(lo, 0xD7FF), (0xE000, hi)]
            continue
        split = next((m for m in (0x7F, 0x7FF, 0xFFFF) if lo <= m < hi), None)
        if split is not None:  # different encoded lengths
            todo += [(lo, split), (split + 1, hi)]
            continue
        if hi <= 0x7F:
            out.append([(lo, hi)])
            continue
        for i in (1, 2, 3):
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    todo += [(lo, lo | m), ((lo | m) + 1, hi)]
                    break
                if hi & m != m:
                    todo += [(lo, (hi & ~m) - 1), (hi & ~m, hi)]
                    break
        else:
            a, b = chr(lo).encode(), chr(hi).encode()
            out.append(list(zip(a, b, strict=True)))
    return out
