"""Counted chains: ``maxLength`` strings whose characters may take several bytes (UTF-8, escapes).

A JSON string with ``maxLength: m`` is a chain of states q_0 → q_1 → … → q_m, one per character read, with no
self-loops. From q_k a one-byte character goes straight to q_{k+1}; a multi-byte one (a UTF-8 lead byte and
its continuation bytes, or an escape such as ``\\u00e9``) goes through a few helper states of its own to
q_{k+1}. Every position has the same *step*: the table of q_k and its helpers with q_{k+1} written as 0, as if
the step came back to where it started. So a class string that never leaves the step is alive from q_k iff it
starts at most m - k characters (its *starts*: the classes it reads at step row 0), and from a helper of q_k
iff it starts at most m - k - 1 more; the other strings (a closing quote and what follows) are walked.

Before, a chain counted bytes: only strings of one-byte characters were settled, so every multi-byte
character and every helper state was walked from every position (JsonSchemaStore's bower schema: 16,700 such
states, 33 M live pairs).
"""

from __future__ import annotations

import numpy as np

from specjax.grammar.automaton import DEAD

__all__ = ["Chains", "counted_strings", "excursions"]

_EXCURSION = 6  # helper states at most this many bytes from the state: a \uXXXX escape is 6 bytes


def excursions(trans_sc: np.ndarray, root: int, home: int, succ: dict[int, set[int]],
               looping: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """The excursions from ``root`` that end at ``home``: a table int32 [n, classes] and its states.

    Row 0 is ``root``; the other rows are its *helpers*: states without self-loops near ``root`` (at most
    ``_EXCURSION`` classes away) whose live transitions all stay among the helpers or go to ``home``. Entries:
    0 for ``home``, j for helper j, -1 for anything else (leaving; and, when ``root`` is not ``home``, going
    back to ``root``). Helpers are numbered breadth-first over classes from ``root``, so equal structures get
    equal tables wherever they are. A string body is the case ``home == root``; a chain step has ``home`` the
    next position. ``succ`` caches live successors per state; ``looping`` marks the states with self-loops.
    """

    def live_successors(q: int) -> set[int]:
        if (out := succ.get(q)) is None:
            out = succ[q] = set(trans_sc[q].tolist()) - {DEAD}
        return out

    # Helpers never loop themselves (UTF-8 and escape steps): leaving other loops out keeps the search from
    # spreading through the grammar around a string (whitespace, other strings), thousands of states in large
    # automata.
    ends = {root, home}
    helpers, frontier = set(), {root}
    for _ in range(_EXCURSION):  # candidates: near the root, reached without passing it or home again
        frontier = {q for q in set().union(*(live_successors(q) for q in frontier)) - ends - helpers
                    if not looping[q]}
        helpers |= frontier
    # Keep the candidates whose live transitions all stay among the kept ones or reach home: drop every
    # candidate that can reach, among candidates, one with a transition out (one backward pass; candidate sets
    # reach into the grammar around a string, thousands of states in large automata, so a repeated scan was
    # quadratic).
    back: dict[int, list[int]] = {}
    leaving = []
    for u in helpers:
        out = live_successors(u) - {home}
        if not out <= helpers:
            leaving.append(u)
        for v in out & helpers:
            back.setdefault(v, []).append(u)
    dropped = set(leaving)
    while leaving:
        for u in back.get(leaving.pop(), ()):
            if u not in dropped:
                dropped.add(u)
                leaving.append(u)
    helpers -= dropped
    order, index = [root], {root: 0}
    for q in order:  # breadth-first, classes in order: a canonical numbering
        for t in trans_sc[q].tolist():
            if t in helpers and t not in index:
                index[t] = len(order)
                order.append(t)
    if len(order) == 1:  # no helpers (most states): no lookup to build
        return np.where(trans_sc[root] == home, 0, -1).astype(np.int32)[None], order
    names = np.asarray([home] + order[1:])  # what each table index stands for as a target
    by_name = np.argsort(names)
    nxt = trans_sc[order]
    pos = np.minimum(np.searchsorted(names[by_name], nxt), len(names) - 1)
    table = np.where(names[by_name][pos] == nxt, by_name[pos], -1).astype(np.int32)
    return table, order


def counted_strings(table: np.ndarray, rows: list[int], trie) -> np.ndarray:
    """int64 [len(rows), n_strings]: each string's starts walked from each given row of a step table (0 the next
    position; see the module docstring), or -1 where it leaves the step.

    One dense pass over the trie's levels for all rows at once (a step has a dozen rows; nearly every string of
    a free-text body stays in it, so carrying only live pairs would save little).
    """
    out = np.full((len(rows), trie.n_strings), -1, np.int64)
    t = table.astype(np.int64)
    cur = np.asarray(rows, np.int64)[:, None]  # [rows, nodes of the level above]: step row, or -1 (left)
    starts = np.zeros_like(cur)
    for symbol, parent, end_string in zip(trie.symbol, trie.parent, trie.end_string, strict=True):
        before = cur[:, parent]
        cur = np.where(before >= 0, t[np.maximum(before, 0), symbol], -1)
        starts = starts[:, parent] + ((before == 0) & (cur >= 0))
        ends = end_string >= 0
        out[:, end_string[ends]] = np.where(cur[:, ends] >= 0, starts[:, ends], -1)
        if not (cur >= 0).any():
            break
    return out


class Chains:
    """Chain steps and bounds of an automaton's states, memoised (chains are followed once, from any member).

    Args:
      trans_sc: int [S, classes] the automaton over its byte classes (0 dead).
      looping: bool [S] the states with self-loops.
      body_key: a looping state's local body as bytes (``_bodies._Bodies.key``), for chains that end in one.
      horizon: the longest string (in classes): a chain at least this long, or coming back on itself, is as good
        as endless.
      succ: live successors per state, shared with the bodies.
    """

    def __init__(self, trans_sc: np.ndarray, looping: np.ndarray, body_key, horizon: int,
                 succ: dict[int, set[int]]):
        self.trans_sc, self.looping, self.body_key, self.horizon, self.succ = trans_sc, looping, body_key, horizon, succ
        self._step: dict[int, tuple[bytes, np.ndarray, list[int], int] | None] = {}
        self._bound: dict[int, tuple[bytes, int] | None] = {}
        self.tables: dict[bytes, np.ndarray] = {}
        self.helpers: dict[int, tuple[bytes, int, int]] = {}  # helper state → (step key, step row, bound)

    def step(self, q: int) -> tuple[bytes, np.ndarray, list[int], int] | None:
        """(key, table, states, next position) of a chain step from ``q``, or None: ``q`` has no self-loop and
        at least two classes lead it to one next state (one-byte characters)."""
        if q in self._step:
            return self._step[q]
        out = None
        row = self.trans_sc[q]
        live = row[row != DEAD]
        if not self.looping[q] and len(live) >= 2:
            targets, counts = np.unique(live, return_counts=True)
            home = int(targets[counts.argmax()])
            after = self.trans_sc[home][row == home]
            # A chain's next position treats its one-byte characters alike too (all to one next state, all dead
            # at the chain's end, all back to it in a body): a cheap test before the search for helpers.
            if counts.max() >= 2 and (after == after[0]).all():
                table, order = excursions(self.trans_sc, q, home, self.succ, self.looping)
                key = table.tobytes()  # every table has the automaton's class count as its width
                self.tables.setdefault(key, table)
                out = (key, table, order, home)
        self._step[q] = out
        return out

    def bound(self, q: int) -> tuple[bytes, int] | None:
        """(step key, m): strings that stay in the step are alive from ``q`` iff they start at most m characters
        (m is ``horizon`` when the chain is that long, comes back on itself or ends in a body of the same step);
        None if ``q`` is not a chain state or its chain does not end cleanly (its starts all dead after it).
        Also records ``q``'s helpers in ``helpers`` with their bound, m - 1."""
        if q in self._bound:
            return self._bound[q]
        first = self.step(q)
        if first is None:
            self._bound[q] = None
            return None
        key, table, _, x = first
        path, on_path = [q], {q}
        while True:
            known = self._bound.get(x)
            if known is not None and known[0] == key:  # the rest of this chain, followed before
                tail = known[1]
                break
            if x in on_path:  # the chain comes back on itself: endless
                tail = self.horizon
                break
            if len(path) > self.horizon:  # the first ones have horizon characters ahead; the others, when met
                for y in path[:len(path) - self.horizon + 1]:
                    self._set(y, key, self.horizon)
                return self._bound[q]
            nxt = self.step(x)
            if nxt is not None and nxt[0] == key:
                if x in self._bound:  # followed before: it does not end cleanly
                    tail = None
                    break
                path.append(x)
                on_path.add(x)
                x = nxt[3]
                continue
            if self.looping[x] and self.body_key(x) == key:  # minLength, then free text of the same characters
                tail = self.horizon
            else:  # the chain's end: no character may start there
                tail = 0 if (self.trans_sc[x][table[0] >= 0] == DEAD).all() else None
            break
        for i, y in enumerate(reversed(path)):
            self._set(y, key, None if tail is None else min(self.horizon, tail + i + 1))
        return self._bound[q]

    def _set(self, q: int, key: bytes, m: int | None) -> None:
        self._bound[q] = None if m is None else (key, m)
        if m is not None:
            for j, h in enumerate(self._step[q][2][1:], start=1):
                self.helpers.setdefault(h, (key, j, m - 1))
