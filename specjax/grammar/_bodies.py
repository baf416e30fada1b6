"""Which class strings a state keeps alive without a walk: its self-loops, and excursions that come back.

Inside a free-text JSON string most tokens never leave the string: ASCII characters loop on the state, and a
multi-byte UTF-8 character or an escape goes through a few helper states and comes back. Such a token is alive
from the state whatever the state's context (the automaton is trimmed: every state but the dead one can still
accept), so the mask tables need not walk it from every string state of every context. The states of a
grammar's string values differ only in where their closing quote leads, so they share one *local body*: the
state, its helpers (states reached from it whose live transitions all stay among the helpers or come back to
it), and the transitions among them. States with the same local body form a group; the strings that stay in
the body are found by one walk of that small automaton per group, and only the others are walked per state.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.grammar._vocab_trie import ClassTrie
from specjax.grammar.automaton import DEAD

__all__ = ["Group", "local_body", "loop_groups", "run_chain", "strings_in_body"]

_EXCURSION = 6  # helper states at most this many bytes from the state: a \uXXXX escape is 6 bytes
# A run group of its own costs a sub-trie and a token index (~10 ms, the walk of ~200k live pairs); it pays
# when its members' run strings (each at least one live pair from each member) add up to more than that.
_MIN_SETTLED = 1 << 18


def local_body(trans_sc: np.ndarray, state: int, succ: dict[int, set[int]] | None = None) -> np.ndarray:
    """The state's local body as a table int32 [n, classes]: body state (0 = the state itself) or -1 (leaves).

    Body states are numbered in breadth-first order over classes from the state, so two states whose bodies
    are the same automaton get equal tables. A state without self-loops has the 1-row table of -1s (it keeps
    nothing alive without a walk), and so has the dead state. ``succ`` caches each state's live successors
    across calls.
    """
    succ = {} if succ is None else succ

    def live_successors(q: int) -> set[int]:
        if (out := succ.get(q)) is None:
            out = succ[q] = set(trans_sc[q].tolist()) - {DEAD}
        return out

    row = trans_sc[state]
    if state == DEAD or not (row == state).any():
        return np.full((1, trans_sc.shape[1]), -1, np.int32)
    helpers, frontier = set(), {state}
    for _ in range(_EXCURSION):  # candidates: near the state, reached without passing it again
        frontier = set().union(*(live_successors(q) for q in frontier)) - {state} - helpers
        helpers |= frontier
    changed = True
    while changed:  # keep the candidates whose live transitions all stay among them or come back
        changed = False
        for u in list(helpers):
            if not live_successors(u) - {state} <= helpers:
                helpers.discard(u)
                changed = True
    order, index = [state], {state: 0}
    for q in order:  # breadth-first, classes in order: a canonical numbering
        for t in trans_sc[q].tolist():
            if t in helpers and t not in index:
                index[t] = len(order)
                order.append(t)
    table = np.full((len(order), trans_sc.shape[1]), -1, np.int32)
    for i, q in enumerate(order):
        table[i] = [index.get(t, -1) for t in trans_sc[q].tolist()]
    return table


def strings_in_body(table: np.ndarray, trie: ClassTrie) -> np.ndarray:
    """bool [n_strings]: the strings whose walk from body state 0 never leaves the body."""
    if len(table) == 1:  # self-loops only: one vectorised pass
        return trie.strings_within(table[0] == 0)
    # The trie's walk with body state i as state i + 1 and leaving the body as its dead state 0.
    trans = np.concatenate([np.zeros((1, table.shape[1]), np.int64), table.astype(np.int64) + 1])
    alive = np.zeros((1, trie.n_strings), bool)
    trie.walk(trans, np.ones(1, np.int64), alive)
    return alive[0]


def run_chain(trans_sc: np.ndarray, state: int, horizon: int) -> tuple[np.ndarray, int] | None:
    """A bounded run from a state without self-loops: (run classes bool [C], m), or None.

    The run classes all lead from the state to one next state, from there all to one next, and so on for m
    steps, after which they all lead to the dead state (a string value with ``maxLength``: one state per
    character left). So a string made only of run classes is alive iff its length is at most m. m is
    ``horizon`` (no token is longer) when the run goes on that far or comes back to a state it passed.
    """
    row = trans_sc[state]
    live = row[row != DEAD]
    if len(live) < 2:
        return None
    targets, counts = np.unique(live, return_counts=True)
    if counts.max() < 2:
        return None
    run = row == targets[counts.argmax()]
    seen, q = {state}, state
    for m in range(horizon):
        t = trans_sc[q][run]
        if t[0] == DEAD:
            return (run, m) if (t == DEAD).all() else None
        if not (t == t[0]).all():
            return None
        q = int(t[0])
        if q in seen:
            return run, horizon
        seen.add(q)
    return run, horizon


@dataclasses.dataclass(frozen=True, eq=False)
class Group:
    """States whose rows are built alike.

    Attributes:
      members: indices into the representatives.
      stays: bool [U] strings alive from every member without a walk.
      walk: the strings walked from each member (sorted ids), and ``trie`` those strings' trie.
      run_length: for run groups, int64 [U]: the length of each string made only of run classes, else -1;
        such a string is alive from member i iff its length is at most ``run_m[i]``.
    """

    members: np.ndarray
    stays: np.ndarray
    walk: np.ndarray
    trie: ClassTrie
    run_length: np.ndarray | None = None
    run_m: np.ndarray | None = None


def _key(table: np.ndarray) -> bytes:
    return table.tobytes()  # every table has the grammar's class count as its width: the bytes fix its shape


def loop_groups(trans_sc: np.ndarray, reps: np.ndarray, trie: ClassTrie, horizon: int):
    """Representatives grouped by local body or bounded run: yields :class:`Group` s.

    Only the strings a group cannot settle without a walk are walked per member; groups where most strings
    need a walk walk the shared full trie.
    """
    nothing = np.full((1, trans_sc.shape[1]), -1, np.int32)  # the body of a state without self-loops
    groups: dict[bytes, list[int]] = {}
    tables: dict[bytes, np.ndarray] = {_key(nothing): nothing}
    runs: dict[bytes, tuple[np.ndarray, list[int], list[int]]] = {}
    succ: dict[int, set[int]] = {}
    for i, s in enumerate(reps.tolist()):
        table = local_body(trans_sc, s, succ)
        if len(table) == 1 and not (table >= 0).any() and (chain := run_chain(trans_sc, s, horizon)) is not None:
            entry = runs.setdefault(chain[0].tobytes(), (chain[0], [], []))
            entry[1].append(i)
            entry[2].append(chain[1])
        else:
            groups.setdefault(_key(table), []).append(i)
            tables.setdefault(_key(table), table)
    lengths = trie.lengths() if runs else None
    run_groups = []
    for run, members, ms in runs.values():
        inside = trie.strings_within(run)
        if inside.sum() * len(members) < _MIN_SETTLED:  # spares less walking than its own sub-trie costs
            groups.setdefault(_key(nothing), []).extend(members)
            continue
        sub = np.nonzero(~inside)[0]
        run_groups.append(Group(np.asarray(members), np.zeros(trie.n_strings, bool), sub, trie.restricted(sub),
                                np.where(inside, lengths, -1), np.asarray(ms)))
    everything = np.arange(trie.n_strings)
    for key, members in groups.items():
        table = tables[key]
        stays = strings_in_body(table, trie) if (table >= 0).any() else np.zeros(trie.n_strings, bool)
        sub = np.nonzero(~stays)[0]
        if len(sub) > trie.n_strings // 2:
            yield Group(np.sort(np.asarray(members)), np.zeros(trie.n_strings, bool), everything, trie)
        else:
            yield Group(np.asarray(members), stays, sub, trie.restricted(sub))
    yield from run_groups
