"""interegular's ``crawl`` (the subset/product construction behind every FSM operation) with a hash index.

interegular 0.3 finds each new state with ``list.index`` over the states found so far, so building an FSM is
quadratic in its states: the union of a few hundred listed key names (``_regex_fsm._without_names``) took 15 s
of ``list.index`` in one JSONSchemaBench schema. This is the same breadth-first crawl, numbering states in the
same order (so the FSMs are identical), with a dict from a hashable form of each state to its number, and a
check of the compile time limit per state (``_deadline``). It replaces ``interegular.fsm.crawl``, which the
library's own operations look up by name at call time.
"""

from __future__ import annotations

import interegular.fsm as _fsm

from specjax.grammar import _deadline

_original = _fsm.crawl


def _key(state):
    """A hashable form of a crawl state: dicts (parallel) and sets (concatenate, star) of hashable parts."""
    if isinstance(state, dict):
        return ("dict", frozenset(state.items()))
    if isinstance(state, set | frozenset):
        return ("set", frozenset(state))
    return ("other", state)


def crawl(alphabet, initial, final, follow):
    """As ``interegular.fsm.crawl``: the reachable states from ``initial`` under ``follow``, numbered in order."""
    try:
        index = {_key(initial): 0}
    except TypeError:  # a state with unhashable parts: the library's own (slower) crawl
        return _original(alphabet, initial, final, follow)
    states, finals, table = [initial], set(), {}
    i = 0
    while i < len(states):
        state = states[i]
        _deadline.check()  # the compile time limit reaches into interegular's work too
        if final(state):
            finals.add(i)
        table[i] = {}
        for transition in alphabet.by_transition:
            try:
                nxt = follow(state, transition)
            except _fsm.OblivionError:
                continue
            key = _key(nxt)
            j = index.get(key)
            if j is None:
                j = index[key] = len(states)
                states.append(nxt)
            table[i][transition] = j
        i += 1
    return _fsm.FSM(alphabet=alphabet, states=range(len(states)), initial=0, finals=finals, map=table,
                    __no_validation__=True)


def install() -> None:
    """Use the indexed crawl for every interegular FSM operation in this process (idempotent)."""
    _fsm.crawl = crawl
