"""Which class strings a state keeps alive without a walk: its self-loops, and excursions that come back.

Inside a free-text JSON string most tokens never leave the string: ASCII characters loop on the state, and a
multi-byte UTF-8 character or an escape goes through a few helper states and comes back. Such a token is alive
from the state whatever the state's context (the automaton is trimmed: every state but the dead one can still
accept), so the mask tables need not walk it from every string state of every context. The states of a
grammar's string values differ only in where their closing quote leads, so they share one *local body*: the
state, its helpers (states reached from it whose live transitions all stay among the helpers or come back to
it), and the transitions among them. States with the same local body form a group; the strings that stay in
the body are found by one walk of that small automaton per group, and only the others are walked per state.

A state just before a body (no self-loop of its own, some of its classes entering a body: the prefix states of
a string that must differ from a listed one, copied once per item when ``max_repeat`` unrolls an array) is a
*feeder*: a string whose first class enters a body and which then stays in it is alive from it. Feeders with
the same entries form a group, settled by one walk from an entry state that stands for them.

A ``maxLength`` string is a chain of states without self-loops, one per character; its groups (a chain step's
states and their helpers) are in ``_chains``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.grammar._chains import Chains, counted_strings, excursions
from specjax.grammar._vocab_trie import ClassTrie
from specjax.grammar.automaton import DEAD

__all__ = ["Group", "local_body", "loop_groups", "strings_in_body"]

# A chain or feeder group of its own costs a sub-trie and a token index (~10 ms, the walk of ~200k live pairs); it
# pays when its members' settled strings (each at least one live pair from each member) add up to more than that.
_MIN_SETTLED = 1 << 18
# A state is searched as a chain position only if the strings whose first class is live from it could pay for the
# search (~80 µs, the walk of ~2,700 live pairs): UTF-8 and escape helpers, digits of a number are not.
_MIN_CHAIN_STRINGS = 1 << 12


def local_body(trans_sc: np.ndarray, state: int, succ: dict[int, set[int]] | None = None) -> np.ndarray:
    """The state's local body as a table int32 [n, classes]: body state (0 = the state itself) or -1 (leaves).

    Body states are numbered in breadth-first order over classes from the state, so two states whose bodies
    are the same automaton get equal tables. A state without self-loops has the 1-row table of -1s (it keeps
    nothing alive without a walk), and so has the dead state. ``succ`` caches each state's live successors
    across calls.
    """
    return _local_body(trans_sc, state, {} if succ is None else succ, _looping(trans_sc))[0]


def _looping(trans_sc: np.ndarray) -> np.ndarray:
    """bool [S]: the states with a self-loop (the dead state's is not one)."""
    out = (trans_sc == np.arange(len(trans_sc))[:, None]).any(axis=1)
    out[DEAD] = False
    return out


def _local_body(trans_sc: np.ndarray, state: int, succ: dict[int, set[int]],
                looping: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """:func:`local_body` and the automaton's state of each body state (``[]`` when it has no body); ``looping``
    is :func:`_looping` of the automaton."""
    if not looping[state]:
        return np.full((1, trans_sc.shape[1]), -1, np.int32), []
    return excursions(trans_sc, state, state, succ, looping)


def strings_in_body(table: np.ndarray, trie: ClassTrie) -> np.ndarray:
    """bool [n_strings]: the strings whose walk from body state 0 never leaves the body."""
    if len(table) == 1:  # self-loops only: one vectorised pass
        return trie.strings_within(table[0] == 0)
    # The trie's walk with body state i as state i + 1 and leaving the body as its dead state 0.
    trans = np.concatenate([np.zeros((1, table.shape[1]), np.int64), table.astype(np.int64) + 1])
    alive = np.zeros((1, trie.n_strings), bool)
    trie.walk(trans, np.ones(1, np.int64), alive)
    return alive[0]


@dataclasses.dataclass(frozen=True, eq=False)
class Group:
    """States whose rows are built alike.

    Attributes:
      members: indices into the representatives.
      stays: bool [U] strings alive from every member without a walk.
      walk: the strings walked from each member (sorted ids), and ``trie`` those strings' trie.
      run_length: for chain groups (``_chains``), int64 [U]: each string's starts (characters it begins) if it
        stays in the chain's step, else -1; such a string is alive from member i iff that is at most ``run_m[i]``.
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
    """Representatives grouped by local body, chain step or the bodies they feed: yields :class:`Group` s.

    Only the strings a group cannot settle without a walk are walked per member; groups where most strings
    need a walk walk the shared full trie. A *feeder* is a state without self-loops whose transitions enter
    bodies (the prefix states of a string that must differ from a listed one, one per copy of an array's item
    when ``max_repeat`` unrolls it): a string whose first class enters a body (its state or a helper) and then
    stays in it is alive, which settles most of the vocabulary for such states.
    """
    nothing = np.full((1, trans_sc.shape[1]), -1, np.int32)  # the body of a state without self-loops
    bodies = _Bodies(trans_sc)
    groups: dict[bytes, list[int]] = {_key(nothing): []}
    feeders: dict[bytes, tuple[np.ndarray, list[int]]] = {}
    looping = bodies.looping  # the states with a body
    chains = Chains(trans_sc, looping, bodies.key, horizon, bodies.succ)
    # Cheap tests first, for all representatives at once (most states of a large automaton are neither):
    rows = trans_sc[reps]
    may_feed = looping[rows].any(axis=1)
    ordered = np.sort(rows, axis=1)
    may_run = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] != DEAD)).any(axis=1)  # 2 classes, 1 target
    plain = ~(looping[reps] | may_feed | may_run)
    rest = np.flatnonzero(plain).tolist()  # most states of a large automaton: no Python step each
    for i in np.flatnonzero(~plain).tolist():
        s = int(reps[i])
        if looping[s]:
            groups.setdefault(bodies.key(s), []).append(i)
        elif may_feed[i] and (feeds := bodies.feeds(trans_sc[s])) is not None:
            # before chains: a chain into a body settles only its own characters, not the body's
            feeders.setdefault(feeds.tobytes(), (feeds, []))[1].append(i)
        else:
            rest.append(i)
    per_first = _per_first(trie, trans_sc.shape[1]) if may_run.any() or feeders else None
    runs, others = _chain_members(chains, reps, rows, ordered, may_run, rest, per_first)
    groups[_key(nothing)] += others
    settled_groups, unpaid = _run_groups(runs, chains, trie)
    settled_groups += _feeder_groups(feeders, bodies, trie, per_first, unpaid)
    groups[_key(nothing)] += unpaid  # too few strings settled to pay for a sub-trie: these members walk every one
    everything = np.arange(trie.n_strings)
    for key, members in groups.items():
        if not members:
            continue
        table = bodies.tables.get(key, nothing)
        stays = strings_in_body(table, trie) if (table >= 0).any() else np.zeros(trie.n_strings, bool)
        sub = np.nonzero(~stays)[0]
        if len(sub) > trie.n_strings // 2:
            yield Group(np.sort(np.asarray(members)), np.zeros(trie.n_strings, bool), everything, trie)
        else:
            yield Group(np.asarray(members), stays, sub, trie.restricted(sub))
    yield from settled_groups


class _Bodies:
    """The local bodies met so far, by key, and each body state's place in one table of them all (``place``,
    for feeders: a global index ``offset[body] + body state``)."""

    def __init__(self, trans_sc: np.ndarray):
        self.trans_sc = trans_sc
        self.succ: dict[int, set[int]] = {}
        self.looping = _looping(trans_sc)
        self.tables: dict[bytes, np.ndarray] = {}
        self.key_of: dict[int, bytes] = {}  # a looping state → its body's key
        self.offset: dict[bytes, int] = {}  # a body's key → where its states start in the table of all bodies
        self.size = 0
        self.place: dict[tuple[int, int], int] = {}  # (looping state, state of its body) → global index

    def key(self, q: int) -> bytes:
        """The key of a looping state's body (computed once per state)."""
        if (key := self.key_of.get(q)) is None:
            table, order = _local_body(self.trans_sc, q, self.succ, self.looping)
            key = self.key_of[q] = _key(table)
            if key not in self.tables:
                self.tables[key], self.offset[key] = table, self.size
                self.size += len(table)
            for j, h in enumerate(order):
                self.place[q, h] = self.offset[key] + j
        return key

    def feeds(self, row: np.ndarray) -> np.ndarray | None:
        """int32 [classes]: the global index of the body state each class enters from a state without self-loops
        (``row`` its transitions: the body of a looping successor, at its state or one of its helpers), -1 where
        it enters none; None if no class enters a body."""
        roots = np.unique(row[self.looping[row]]).tolist()
        if not roots:
            return None
        for r in roots:
            self.key(r)  # places r's body states
        feeds = np.full(len(row), -1, np.int32)
        for q in np.unique(row[row != DEAD]).tolist():
            feeds[row == q] = next((self.place[r, q] for r in roots if (r, q) in self.place), -1)
        return feeds

    def walk_table(self) -> np.ndarray:
        """int64 [1 + size, classes]: the trie walk's table over every body: 0 dead (leaving a body), then the
        bodies' states (global index i at row 1 + i)."""
        out = np.zeros((1 + self.size, self.trans_sc.shape[1]), np.int64)
        for key, table in self.tables.items():
            lo = 1 + self.offset[key]
            out[lo:lo + len(table)] = np.where(table >= 0, table.astype(np.int64) + lo, 0)
        return out


def _chain_members(chains: Chains, reps: np.ndarray, rows: np.ndarray, ordered: np.ndarray, may_run: np.ndarray,
                   candidates: list[int], per_first: np.ndarray | None):
    """Chain positions and their helpers among ``candidates`` (indices into ``reps``; ``rows`` their transitions,
    ``ordered`` sorted): ({(step key, step row): (members, bounds)}, the other candidates).

    A state is searched as a position only if the strings whose first class is live from it could pay for the
    search. Positions are searched first from the states with the most targets (a position: its next one,
    helpers, a closing quote), which records their helpers (one target: the next position), so that no helper is
    searched as a position.
    """
    if may_run.any():
        may_run = may_run & ((rows != DEAD).astype(np.int64) @ per_first >= _MIN_CHAIN_STRINGS)
    targets = 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(axis=1)
    for i in sorted((i for i in candidates if may_run[i]), key=lambda i: -targets[i]):
        if int(reps[i]) not in chains.helpers:
            chains.bound(int(reps[i]))
    runs: dict[tuple[bytes, int], tuple[list[int], list[int]]] = {}
    others = []
    for i in candidates:
        s = int(reps[i])
        at = chains.helpers.get(s)
        if at is None and may_run[i] and (b := chains.bound(s)) is not None:
            at = (b[0], 0, b[1])
        if at is None:
            others.append(i)
        else:
            entry = runs.setdefault(at[:2], ([], []))
            entry[0].append(i)
            entry[1].append(at[2])
    return runs, others


def _per_first(trie: ClassTrie, n_cls: int) -> np.ndarray:
    """int64 [classes]: how many strings start with each class."""
    return np.bincount(trie.first_symbols(), minlength=n_cls)


def _pays(settled: int, members: int) -> bool:
    return settled * members >= _MIN_SETTLED


def _run_groups(runs, chains: Chains, trie: ClassTrie) -> tuple[list[Group], list[int]]:
    """The chain groups that pay for their sub-trie, and the members of those that would not.

    A group is the members at one row of one chain step (row 0: the chain's states; others: their helpers).
    """
    by_step: dict[bytes, list[tuple[int, list[int], list[int]]]] = {}
    for (key, row), (members, bounds) in runs.items():
        by_step.setdefault(key, []).append((row, members, bounds))
    out, unpaid = [], []
    lengths = trie.lengths() if by_step else None
    for key, parts in by_step.items():
        table = chains.tables[key]
        # One-byte characters alone, a cheap lower bound of what row 0 settles: skip steps that cannot pay.
        within = trie.strings_within(table[0] == 0)
        if not _pays(int(within.sum()), sum(len(m) for _, m, _ in parts)):
            unpaid += [i for _, members, _ in parts for i in members]
            continue
        # Without helpers a string's starts are its length (and it stays iff made of one-byte characters).
        starts = np.where(within, lengths, -1)[None] if len(table) == 1 else \
            counted_strings(table, [row for row, _, _ in parts], trie)
        for (_, members, bounds), starts_u in zip(parts, starts, strict=True):
            inside = starts_u >= 0
            if not _pays(int(inside.sum()), len(members)):
                unpaid += members
                continue
            sub = np.nonzero(~inside)[0]
            out.append(Group(np.asarray(members), np.zeros(trie.n_strings, bool), sub, trie.restricted(sub),
                             starts_u, np.asarray(bounds)))
    return out, unpaid


def _feeder_groups(feeders, bodies: _Bodies, trie: ClassTrie, per_first: np.ndarray | None,
                   unpaid: list[int]) -> list[Group]:
    """The feeder groups that pay for their sub-trie; the members of the others are appended to ``unpaid``.

    A feeder's settled strings come from a walk from an entry state whose classes lead where the feeder's do;
    the feeders that could pay (counting every string whose first class enters a body as settled, from
    ``per_first``: :func:`_per_first`) are walked together, each from its own entry state.
    """
    if not feeders:
        return []
    maybe = []
    for feeds, members in feeders.values():
        if _pays(int(per_first[feeds >= 0].sum()), len(members)):
            maybe.append((feeds, members))
        else:
            unpaid += members
    if not maybe:
        return []
    table = bodies.walk_table()  # row 0 dead, then the bodies' states from row 1
    entries = np.stack([np.where(feeds >= 0, feeds.astype(np.int64) + 1, 0) for feeds, _ in maybe])
    entry_states = len(table) + np.arange(len(maybe))
    row, string = trie.hits(np.concatenate([table, entries]), entry_states)
    out = []
    for k, (_, members) in enumerate(maybe):
        settled = np.zeros(trie.n_strings, bool)
        settled[string[row == k]] = True
        if not _pays(int(settled.sum()), len(members)):
            unpaid += members
            continue
        sub = np.nonzero(~settled)[0]
        out.append(Group(np.asarray(members), settled, sub, trie.restricted(sub)))
    return out
