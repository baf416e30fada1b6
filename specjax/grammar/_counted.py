"""Regexes with a large counted repetition (``(?:X){0,500}``) → byte DFA without interegular's copies.

interegular builds ``X{a,b}`` as b concatenated copies of X's FSM, each concatenation a full product
construction: minutes for a JSON string with ``maxLength`` in the hundreds. Here the regex is split at
top level into pieces ``prefix``, ``X{a,b}``, ``suffix``; each piece is compiled once (small), and one
subset construction over positions ``(piece, copies done, state)`` builds the whole byte DFA, so its cost
is linear in the count.
"""

from __future__ import annotations

import re
from re import _constants as C  # noqa: N812
from re import _parser as sre_parse

import numpy as np

from specjax.grammar import _deadline
from specjax.grammar._dfa import byte_classes

__all__ = ["MAX_POSITIONS", "MAX_POSITIONS_INTEREGULAR", "positions", "split_counted", "sequence_dfa"]

MIN_COUNT = 24  # smaller counts: interegular's own construction is fast enough
# A counted repetition needs one automaton state per copy (a DFA counts with states), so a regex is refused
# when its repetitions unroll to more character positions than this: ``a{100000}`` would be a 100,000-state
# chain (minutes to build and minimise), and no generation that long fits a decode budget anyway.
MAX_POSITIONS = 10_000
# interegular builds nested counts by repeated product constructions (``x(a{10}b){200}``: 2,200 positions,
# 1.6 s) and cannot be interrupted by the compile time limit, so what reaches it is bounded tighter.
MAX_POSITIONS_INTEREGULAR = 3_000
_COUNT = re.compile(r"\{(\d+)(,(\d*))?\}")


def split_counted(regex: str) -> list[tuple[str, int, int]] | None:
    """Top-level pieces ``(regex, lo, hi)`` if ``regex`` has a counted repetition with ``hi >= MIN_COUNT``.

    Returns None when there is none, or when the regex has top-level alternation or flags (then splitting
    would change its meaning).
    """
    pieces, start, i, depth, atom = [], 0, 0, 0, None
    found = False
    while i < len(regex):
        c = regex[i]
        if c in "\\[":
            j = i + 2 if c == "\\" else _class_end(regex, i)
            atom, i = (i if depth == 0 else atom), j
            continue
        if c == "(":
            if regex.startswith("(?", i) and not regex.startswith("(?:", i):
                return None  # flags, lookaround, named groups: keep interegular's reading
            if depth == 0:
                atom = i
            depth += 1
        elif c == ")":
            depth -= 1
            i += 1
            continue
        elif c == "|" and depth == 0:
            return None
        elif c == "{" and depth == 0 and atom is not None and (m := _COUNT.match(regex, i)):
            lo, hi = int(m[1]), (int(m[1]) if m[2] is None else int(m[3]) if m[3] else None)
            if hi is not None and hi >= MIN_COUNT and lo <= hi and not regex.startswith("?", m.end()):
                if atom > start:
                    pieces.append((regex[start:atom], 1, 1))
                pieces.append((regex[atom:i], lo, hi))
                start, found = m.end(), True
            i = m.end()
            atom = None
            continue
        if depth == 0 and c not in "(":
            atom = i
        i += 1
    if not found or depth != 0:
        return None
    if start < len(regex):
        pieces.append((regex[start:], 1, 1))
    return pieces


def positions(tree) -> int:
    """Character positions of a parsed regex (``re._parser``) with every counted repetition unrolled.

    An unbounded repetition counts its body ``max(lo, 1)`` times; alternatives add up. This is about the
    size of the automaton the regex needs, and is computed without building anything.
    """
    total = 0
    for op, av in tree:
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            lo, hi, sub = av
            total += positions(sub) * (max(lo, 1) if hi == C.MAXREPEAT else hi)
        elif op is C.BRANCH:
            total += sum(positions(alt) for alt in av[1])
        else:  # groups, lookaround, conditionals: whatever sub-patterns they hold; a character is 1
            subs = [x for x in (av if isinstance(av, tuple) else (av,)) if isinstance(x, sre_parse.SubPattern)]
            total += sum(positions(x) for x in subs) if subs else 1
    return total


def _class_end(regex: str, i: int) -> int:
    """Index just after the character class that starts at ``regex[i] == "["``."""
    j = i + 1
    if j < len(regex) and regex[j] == "^":
        j += 1
    if j < len(regex) and regex[j] == "]":
        j += 1
    while j < len(regex) and regex[j] != "]":
        j += 2 if regex[j] == "\\" else 1
    return j + 1


def sequence_dfa(parts: list[tuple[np.ndarray, np.ndarray, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The DFA of ``P0{lo0,hi0} P1{lo1,hi1} ...`` from each piece's byte DFA (trans [n, 256] with -1, accept).

    Positions are ``(piece, copies done, state)``; ``state`` -1 marks the boundary before the next copy.
    Returns (trans [m, 256] with -1 for reject, accept [m]); state 0 is the start.
    """
    byte_cls, _ = byte_classes(np.vstack([t for t, _, _, _ in parts]))  # bytes alike in every piece
    byte_first = np.unique(byte_cls, return_index=True)[1]
    trans = [t[:, byte_first].tolist() for t, _, _, _ in parts]
    accept = [a.tolist() for _, a, _, _ in parts]

    def close(positions) -> frozenset:
        out, todo = set(), list(positions)
        while todo:
            p = todo.pop()
            if p in out:
                continue
            out.add(p)
            i, k, q = p
            if i == len(parts):
                continue
            lo, hi = parts[i][2], parts[i][3]
            if q < 0:
                if k < hi:
                    todo.append((i, k, 0))
                if k >= lo:
                    todo.append((i + 1, 0, -1))
            elif accept[i][q]:
                todo.append((i, k + 1, -1))
        return frozenset(out)

    init = close([(0, 0, -1)])
    ids, order, rows = {init: 0}, [init], []
    while len(rows) < len(order):
        if len(rows) % 64 == 0:
            _deadline.check()
        cur = order[len(rows)]
        row = []
        for c in range(len(byte_first)):
            nxt = [(i, k, trans[i][q][c]) for i, k, q in cur if i < len(parts) and q >= 0 and trans[i][q][c] >= 0]
            if not nxt:
                row.append(-1)
                continue
            key = close(nxt)
            if key not in ids:
                ids[key] = len(order)
                order.append(key)
            row.append(ids[key])
        rows.append(row)
    accept_m = np.array([any(i == len(parts) for i, _, _ in s) for s in order], bool)
    return np.array(rows, np.int32).reshape(len(order), -1)[:, byte_cls], accept_m
