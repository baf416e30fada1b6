"""Byte DFAs and the numpy algorithms on them (byte classes, row ids, Moore minimisation).

A leaf module: the terminal compiler (``terminals.py``, ``_counted.py``), the grammar automaton
(``automaton.py``) and the mask tables (``tables.py``) all use it, and it imports none of them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.grammar import _deadline
from specjax.grammar._vocab_trie import ranges

__all__ = ["ByteDFA", "byte_classes", "coreachable", "difference", "minimal_dfa", "minimize", "refine_rounds",
           "row_ids"]


@dataclasses.dataclass(frozen=True, eq=False)
class ByteDFA:
    """A DFA over bytes: ``trans[q, b]`` is the next state or -1 (reject); state 0 is the start."""

    trans: np.ndarray  # int32 [n, 256]
    accept: np.ndarray  # bool [n]


def byte_classes(trans_nb: np.ndarray) -> tuple[np.ndarray, int]:
    """Bytes that behave alike in every state share a class: returns (class per byte [256], n_classes)."""
    cls, first = _column_ids(trans_nb)
    # Number classes by first byte so the result does not depend on the ids' order.
    rank = np.argsort(np.argsort(first))
    return rank[cls].astype(np.int32), len(first)


def _column_ids(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dense id of each column, first column of each id), equal columns equal ids, exactly. ``np.unique(axis=1)``
    compares columns as structured records, 0.8 s on a 108,919-state automaton's table; this hashes them."""
    ids = row_ids(np.ascontiguousarray(table.T).astype(np.int64))
    return ids, np.unique(ids, return_index=True)[1]


def _row_multipliers(k: int) -> np.ndarray:
    """The odd int64 multipliers of ``row_ids``' row hash (fixed: results do not depend on a seed's state)."""
    return np.random.default_rng(0).integers(1, 2**62, k, dtype=np.int64) | 1


def row_ids(rows_nk: np.ndarray, check: bool = True) -> np.ndarray:
    """Dense ids of the distinct rows of an int64 matrix (equal rows, equal ids), exactly.

    Rows are hashed to one int64 each and the hashes sorted (much faster than ``np.unique(axis=0)``, which
    sorts whole rows); a hash collision is detected by comparing every row with its group's first row, and
    only then are whole rows sorted. ``check=False`` skips that comparison: a collision then gives two
    different rows one id (callers that check their final result, as ``minimize`` does).
    """
    mult = _row_multipliers(rows_nk.shape[1])
    hashes = (rows_nk * mult).sum(axis=1)  # wraps around: fine for a hash
    _, first, ids = np.unique(hashes, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    if check and not (rows_nk == rows_nk[first[ids]]).all():
        ids = np.unique(rows_nk, axis=0, return_inverse=True)[1].reshape(-1)
    return ids


def minimize(trans: np.ndarray, accept: np.ndarray, dead: int | None = None) -> tuple[np.ndarray, int]:
    """Moore partition refinement: returns (block per state, n_blocks); ``trans`` uses -1 or ``dead`` for reject.

    Rejecting transitions are mapped to an extra sink so that they compare equal. Only distinct columns are
    compared (bytes that act alike everywhere, e.g. all letters of a class, are one column).
    """
    n = len(accept)
    sink = n
    t = np.where(trans < 0, sink, trans)
    t = t[:, _column_ids(t)[1]]
    part = np.append(accept.astype(np.int64), 2 if dead is None else 0)
    if dead is not None:
        part[dead] = 2  # the dead state is alone (and equal to the sink)
        part[sink] = 2
    t_full = np.vstack([t, np.full((1, t.shape[1]), sink)]).astype(np.int64)
    # Without a dead state the sink is alone in its block and absorbing: the worklist skips the edges into it.
    hashed = _refine(part, t_full, exact=False, absorbing=sink if dead is None else None)
    signature = np.concatenate([part[:, None], hashed[t_full]], axis=1)
    first = np.unique(hashed, return_index=True)[1]
    if (signature == signature[first[hashed]]).all():  # a congruence refining acceptance: the minimal partition
        return hashed[:n], int(hashed.max()) + 1
    part = _refine(part, t_full, exact=True)
    return part[:n], int(part.max()) + 1


def _refine(part: np.ndarray, t_full: np.ndarray, exact: bool, absorbing: int | None = None) -> np.ndarray:
    """Moore rounds until no block splits: the coarsest congruence refining ``part`` (dense ids).

    ``exact=False`` tells rows apart by one 64-bit hash per row, checks nothing per round and only recomputes
    the states whose successors changed block (:func:`_refine_worklist`; ``absorbing`` as in
    :func:`refine_rounds`). A collision can only merge blocks, so the partition is then coarser than or equal
    to the exact one; if the result is a congruence refining the initial partition (every block's members start
    alike and have equal successor blocks, which ``minimize`` checks once), it is no coarser than the minimal
    partition (the coarsest such congruence) and no finer, so it is the minimal one. Only if that check fails
    does ``minimize`` rerun the rounds exactly (``row_ids`` comparing whole rows every round).
    """
    if not exact:
        return _refine_worklist(part, t_full, exact=False, absorbing=absorbing)
    count = len(np.unique(part))
    while True:
        _deadline.check()
        part = row_ids(np.concatenate([part[:, None], part[t_full]], axis=1))
        new_count = int(part.max()) + 1
        if new_count == count:
            return part
        count = new_count


def _predecessors(trans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of "which states move into state x" over the edges ``trans >= 0``: (preds, starts), the predecessors
    of x being ``preds[starts[x]:starts[x + 1]]``."""
    edge = trans >= 0
    src, _ = np.nonzero(edge)
    dst = trans[edge].astype(np.int32)
    starts = np.zeros(len(trans) + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=len(trans)), out=starts[1:])
    return src[np.argsort(dst)].astype(np.int64), starts  # the order within a list does not matter


def _predecessors_of(preds: np.ndarray, starts: np.ndarray, states: np.ndarray) -> np.ndarray:
    """All predecessors of ``states`` (with repeats), gathered from the CSR of :func:`_predecessors`."""
    return preds[ranges(starts[states], starts[states + 1] - starts[states])]


def refine_rounds(part: np.ndarray, t_full: np.ndarray, rounds: int, absorbing: int | None = None) -> np.ndarray:
    """At most ``rounds`` Moore rounds from ``part`` (states alike iff they are alike after every string of at most
    ``rounds`` symbols), exactly: whole successor rows are compared, never hashes. Dense ids.

    ``absorbing``: a state alone in its block whose transitions all lead to itself (a dead state). It never
    changes block, so the edges into it (most edges of a grammar's automaton) are left out of the worklist's
    predecessor lists.
    """
    if absorbing is not None and not ((t_full[absorbing] == absorbing).all() and (part == part[absorbing]).sum() == 1):
        raise ValueError(f"state {absorbing} is not absorbing and alone in its block")
    return _refine_worklist(part, t_full, exact=True, rounds=rounds, absorbing=absorbing)


def _refine_worklist(part: np.ndarray, t_full: np.ndarray, exact: bool, rounds: int | None = None,
                     absorbing: int | None = None) -> np.ndarray:
    """Moore refinement with a worklist: each round recomputes only the predecessors of the states that changed
    block in the round before; round k splits exactly as Moore's round k does.

    Block ids are stable: a block keeps its id and the states whose successor-block row now differs from the
    block's row leave it, grouped by their rows (a whole block whose rows all changed alike only gets its new
    row, and when all of it splits, its largest group keeps the id). So a state's row changes only when a
    successor moved, and on chain-like automata (length counters, long literals) a round costs its few
    changed states, not the whole table: whole-table Moore rounds were most of a large schema's compile.
    ``exact=False`` compares one 64-bit hash per row (see :func:`_refine`), ``exact=True`` whole rows.
    """
    n = len(part)
    mult = _row_multipliers(t_full.shape[1])
    preds, starts = _predecessors(t_full if absorbing is None else np.where(t_full == absorbing, -1, t_full))
    part = np.unique(part, return_inverse=True)[1].reshape(-1).astype(np.int64)
    # A state's signature: its row of successor blocks (exact), or that row's hash; reads the current `part`.
    signature = (lambda states: np.take(part, t_full[states])) if exact else \
        (lambda states: np.take(part, t_full[states]) @ mult)
    everyone = np.arange(n)
    first = np.unique(part, return_index=True)[1]
    block_sig = signature(everyone)[first]  # a block's row: its first member's, the others leave if they differ
    size = np.bincount(part)
    cand = everyone
    while len(cand) and (rounds is None or rounds > 0):
        _deadline.check()
        rounds = None if rounds is None else rounds - 1
        h = signature(cand)
        differs = h != block_sig[part[cand]]
        moved_mask = differs.any(axis=1) if exact else differs
        movers, h = cand[moved_mask], h[moved_mask]
        if not len(movers):
            break
        key = row_ids(h) if exact else h  # equal keys iff equal rows
        order = np.lexsort((key, part[movers]))
        movers, h, key, blk = movers[order], h[order], key[order], part[movers[order]]
        starts_g = np.flatnonzero(np.r_[True, (blk[1:] != blk[:-1]) | (key[1:] != key[:-1])])
        counts = np.diff(np.r_[starts_g, len(movers)])
        g_blk, g_sig = blk[starts_g], h[starts_g]
        # Groups that take all of their block: the block's largest group keeps the id (only its row changes).
        moved_per_block = np.bincount(g_blk, weights=counts, minlength=len(size))
        whole = moved_per_block[g_blk] == size[g_blk]
        keep = np.zeros(len(g_blk), bool)
        if whole.any():
            idx = np.flatnonzero(whole)
            best = idx[np.lexsort((-counts[idx], g_blk[idx]))]  # per block, the largest group first
            first_of_block = best[np.r_[True, g_blk[best][1:] != g_blk[best][:-1]]]
            keep[first_of_block] = True
            block_sig[g_blk[keep]] = g_sig[keep]
        new_ids = len(size) + np.cumsum(~keep) - 1
        group_of = np.repeat(np.arange(len(g_blk)), counts)
        relabel = ~keep[group_of]
        changed = movers[relabel]
        part[changed] = new_ids[group_of[relabel]]
        size = np.concatenate([size, counts[~keep]])
        np.subtract.at(size, g_blk[~keep], counts[~keep])
        block_sig = np.concatenate([block_sig, g_sig[~keep]])
        # Only the predecessors of relabelled states have new rows (a block that only got a new row moved no one).
        cand = np.unique(_predecessors_of(preds, starts, changed))
    return np.unique(part, return_inverse=True)[1].reshape(-1)


def minimal_dfa(trans: np.ndarray, accept: np.ndarray) -> ByteDFA:
    """The minimal equivalent DFA (fewer lexer states → fewer grammar automaton states), start kept at 0."""
    block, n = minimize(trans, accept)
    ids = np.full(n, -1, np.int64)
    ids[block[0]] = 0
    nxt = 1
    for b in block:
        if ids[b] < 0:
            ids[b] = nxt
            nxt += 1
    out = np.full((nxt, 256), -1, np.int32)
    acc = np.zeros(nxt, bool)
    new = ids[block]
    out[new] = np.where(trans >= 0, new[np.maximum(trans, 0)], -1)
    acc[new] = accept
    return ByteDFA(out, acc)


def difference(a: ByteDFA, b: ByteDFA) -> ByteDFA:
    """The minimal DFA of the strings ``a`` accepts and ``b`` does not: the product over the reachable pairs.

    Built breadth first, one level of pairs at a time with whole-level numpy steps; a pair's ``b`` part is
    ``b``'s state + 1, 0 once ``b`` has rejected (from there on the pair only follows ``a``). For ``b`` a trie of
    names (``a`` minus a few hundred keys) the reachable pairs are about the trie's nodes.
    """
    nb = len(b.accept) + 1
    b_next = np.vstack([np.zeros((1, 256), np.int64), b.trans.astype(np.int64) + 1])
    b_accept = np.concatenate([[False], b.accept])
    levels, seen, frontier = [], np.array([1], np.int64), np.array([1], np.int64)  # the start pair (0, b's 0)
    while len(frontier):
        _deadline.check()
        qa = frontier // nb
        step = a.trans[qa].astype(np.int64)
        keys = np.where(step >= 0, step * nb + b_next[frontier % nb], -1)
        levels.append((frontier, keys))
        frontier = np.setdiff1d(keys[keys >= 0], seen)
        seen = np.union1d(seen, frontier)
    order = np.concatenate([f for f, _ in levels])  # pair keys in breadth-first order, the start first
    sorter = np.argsort(order)
    keys = np.concatenate([k for _, k in levels])
    trans = np.where(keys >= 0, sorter[np.searchsorted(order, np.maximum(keys, 0), sorter=sorter)], -1)
    accept = a.accept[order // nb] & ~b_accept[order % nb]
    alive = coreachable(trans, accept)  # e.g. past a name's closing quote: rejecting, as -1 is (minimize keeps
    trans = np.where(trans >= 0, np.where(alive[np.maximum(trans, 0)], trans, -1), -1)  # such states apart)
    return minimal_dfa(trans.astype(np.int32), accept)


def coreachable(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """bool [n]: the states from which an accepting state can be reached (``trans`` uses -1 for reject).

    A breadth-first search backwards from the accepting states over a CSR table of predecessors: each edge is
    looked at once (a whole-table sweep per BFS level took 2.6 of 12 s of one schema's automaton, 9,211 states).
    """
    preds, starts = _predecessors(trans)
    alive = accept.astype(bool).copy()
    frontier = np.nonzero(alive)[0]
    while len(frontier):
        _deadline.check()
        cand = _predecessors_of(preds, starts, frontier)
        frontier = np.unique(cand[~alive[cand]])
        alive[frontier] = True
    return alive
