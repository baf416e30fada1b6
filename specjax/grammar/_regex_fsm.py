"""A regular language intersected with a length range, written as right-linear Lark rules.

Used for a JSON string whose pattern/format is combined with minLength/maxLength: the regex is
turned into a DFA with interegular, the DFA is multiplied by a length counter (states (q, n)),
dead pairs are pruned, and each live pair becomes one rule `r_q_n: CLASS r_q'_n+1 | ...` whose
terminals are single (JSON-encoded) character classes. Exact, and the size is bounded by
`max_pairs` (refused beyond it).
"""

from __future__ import annotations

import interegular
import numpy as np
from interegular.fsm import FSM, anything_else

from specjax.grammar import _charsets as cs
from specjax.grammar._dfa import coreachable, minimize
from specjax.grammar._interegular_crawl import install

install()  # interegular's own crawl is quadratic in states (see _interegular_crawl)


class TooLarge(ValueError):
    """The product automaton would exceed the size limit."""


def _symbol_sets(fsm) -> dict:
    """Characters (as intervals) of each DFA input symbol; `anything_else` is every other character."""
    explicit, out, with_else = [], {}, set()
    for symbol, chars in fsm.alphabet.by_transition.items():
        plain = [c for c in chars if c is not anything_else]
        out[symbol] = cs.of_chars("".join(plain))
        explicit.append(out[symbol])
        if len(plain) < len(chars):
            with_else.add(symbol)
    others = cs.complement(cs.union(*explicit))
    return {k: cs.union(v, others) if k in with_else else v for k, v in out.items()}


def length_bounded_rules(regex: str, lo: int, hi: int | None, name: str, max_pairs: int = 10000) -> dict[str, str]:
    """Rules (name → body) for the strings of `regex` (full match) with lo <= length <= hi.

    `regex` must use only classes/literals/groups/alternation/quantifiers (as `translate` writes).
    Returns {} when the intersection is empty; the start rule is `{name}_s`. The rule bodies use
    JSON-encoded character classes (the strings are JSON string contents).
    """
    return fsm_rules(interegular.parse_pattern(regex).to_fsm().reduce(), lo, hi, name, max_pairs)


def intersection_rules(regexes: list[str], lo: int, hi: int | None, name: str,
                       max_pairs: int = 10000) -> dict[str, str]:
    """Rules for the strings in every regex of ``regexes`` (full match, over decoded characters) with
    lo <= length <= hi, written as JSON string contents in quotes; {} when the intersection is empty.
    Used for a ``pattern`` next to a ``format``: both must hold, as validators check both."""
    fsm = interegular.parse_pattern(regexes[0]).to_fsm()
    for regex in regexes[1:]:
        fsm = fsm & interegular.parse_pattern(regex).to_fsm()
    fsm = _minimal(fsm)
    return fsm_rules(fsm, lo, hi, name, max_pairs) if fsm.finals else {}


def key_region_rules(inside: list[str], names: list[str], name: str, chars=cs.ANY, max_pairs: int = 10000,
                     lo: int = 0, hi: int | None = None) -> dict[str, str]:
    """Rules for the strings in every regex of ``inside`` and not one of ``names``, made of ``chars``, with
    lo <= length <= hi, written as JSON strings (canonical encoding, quotes included); regexes as for
    `key_regions`. {} when empty."""
    fsm = _without_names(interegular.parse_pattern(f"{cs.class_text(chars)}*").to_fsm(), names)
    for regex in inside:
        fsm = fsm & interegular.parse_pattern(regex).to_fsm()
    fsm = _minimal(fsm)
    return fsm_rules(fsm, lo, hi, name, max_pairs) if fsm.finals else {}


def _without_names(fsm, names: list[str]):
    if not names:
        return fsm
    listed = "|".join("".join(cs.class_text(cs.of_chars(ch)) for ch in n) or "(?:)" for n in names)
    return fsm - interegular.parse_pattern(listed).to_fsm()


def key_regions(patterns: list[str], names: list[str], chars, max_regions: int = 64,
                max_states: int = 10000, within: tuple[str, ...] = ()) -> list[tuple[object, frozenset[int]]]:
    """The non-empty key regions of patternProperties: (DFA, indices of the patterns its keys match) for keys
    made of ``chars`` that are not one of ``names``; every key lies in exactly one region. Regexes are over the
    decoded characters (``translate(..., cs.class_text, search=True)``: full match, search semantics written in).

    Built by refinement, one pattern at a time (each region splits into its keys that match the pattern and
    those that do not; empty halves are dropped), so disjoint patterns give n + 1 regions, not 2**n.
    Raises TooLarge past ``max_regions`` regions or ``max_states`` states in one region. Keys outside any regex
    of ``within`` (propertyNames) are in no region.
    """
    fsm = _without_names(interegular.parse_pattern(f"{cs.class_text(chars)}*").to_fsm(), names)
    for regex in within:
        fsm = fsm & interegular.parse_pattern(regex).to_fsm()
    regions = [(_minimal(fsm), frozenset())]
    for i, regex in enumerate(patterns):
        pattern = interegular.parse_pattern(regex).to_fsm()
        split = []
        for region, inside in regions:
            for part, members in ((region & pattern, inside | {i}), (region - pattern, inside)):
                part = _minimal(part)
                if len(part.states) > max_states:
                    raise TooLarge(f"more than {max_states} automaton states")
                if part.finals:
                    split.append((part, members))
        regions = split
        if len(regions) > max_regions:
            raise TooLarge(f"more than {max_regions} key regions")
    return regions


def _minimal(fsm):
    """The trimmed minimal DFA of an interegular FSM (numpy Moore refinement; interegular's own ``reduce`` is a
    double reversal, exponential on the unions of 19 literal patterns of one bench schema). A DFA with an
    empty language comes back with no final state."""
    states = sorted(fsm.states, key=repr)
    index = {q: i for i, q in enumerate(states)}
    symbols = sorted({sym for row in fsm.map.values() for sym in row}, key=repr)
    column = {sym: j for j, sym in enumerate(symbols)}
    trans = np.full((len(states), max(1, len(symbols))), -1, np.int64)
    for q, row in fsm.map.items():
        for sym, t in row.items():
            trans[index[q], column[sym]] = index[t]
    accept = np.array([q in fsm.finals for q in states])
    reach = np.zeros(len(states), bool)  # forward from the start state
    frontier = [index[fsm.initial]]
    reach[frontier] = True
    while frontier:
        nxt = np.unique(trans[frontier][trans[frontier] >= 0])
        frontier = nxt[~reach[nxt]].tolist()
        reach[frontier] = True
    live = reach & coreachable(trans, accept)
    if not live[index[fsm.initial]]:
        return FSM(fsm.alphabet, {0}, 0, set(), {0: {}}, __no_validation__=True)
    trans = np.where((trans >= 0) & live[np.maximum(trans, 0)], trans, -1)
    compact = np.cumsum(live) - 1  # live states renumbered 0..k-1 for minimize
    kept = trans[live]
    block, _ = minimize(np.where(kept >= 0, compact[np.maximum(kept, 0)], -1), accept[live])
    new = np.full(len(states), -1, np.int64)
    new[live] = block
    out: dict = {}
    for q in np.nonzero(live)[0]:
        row = out.setdefault(int(new[q]), {})
        for j in np.nonzero(trans[q] >= 0)[0]:
            row[symbols[j]] = int(new[trans[q, j]])
    finals = {int(new[q]) for q in np.nonzero(live & accept)[0]}
    return FSM(fsm.alphabet, set(out), int(new[index[fsm.initial]]), finals, out, __no_validation__=True)


def raw_minus_rules(regex: str, texts: list[str], name: str, max_pairs: int = 10000) -> dict[str, str]:
    """Rules for the strings of a terminal regex (raw text, e.g. an integer range) other than ``texts``;
    start rule ``{name}_s``, {} when empty."""
    fsm = interegular.parse_pattern(regex).to_fsm()
    if texts:
        fsm = fsm - interegular.parse_pattern("|".join(cs.escape_text(t) for t in texts)).to_fsm()
    fsm = fsm.reduce()
    return {} if fsm.empty() else fsm_rules(fsm, 0, None, name, max_pairs, cs.class_text, quoted=False)


def fsm_rules(fsm, lo: int, hi: int | None, name: str, max_pairs: int = 10000, render=cs.json_class_text,
              quoted: bool = True) -> dict[str, str]:
    """Right-linear rules for the strings of an interegular DFA with lo <= length <= hi (see length_bounded_rules);
    ``render`` writes one symbol's characters (JSON-encoded by default), ``quoted`` puts the text in quotes."""
    symbols = _symbol_sets(fsm)
    cap = hi if hi is not None else lo  # without a maximum the counter saturates at lo
    # alive[(q, n)]: some accepted string continues from state q having read n (capped) characters.
    alive: dict[tuple, bool] = {}
    if hi is None:  # the saturated level loops on itself: plain backward reachability of the finals
        live = set(fsm.finals)
        while True:
            more = {q for q in fsm.states if q not in live and any(t in live for t in fsm.map.get(q, {}).values())}
            if not more:
                break
            live |= more
        alive.update({(q, cap): q in live for q in fsm.states})
    for n in range(cap - (hi is None), -1, -1):
        for q in fsm.states:
            ok = q in fsm.finals and n >= lo
            nxt = n + 1 if n < cap else (None if hi is not None else n)
            if not ok and nxt is not None:
                ok = any(alive.get((t, nxt), False) for t in fsm.map.get(q, {}).values())
            alive[(q, n)] = ok
            if len(alive) > max_pairs * 4:
                raise TooLarge(f"more than {max_pairs} automaton states")
    if not alive.get((fsm.initial, 0)):
        return {}
    rules: dict[str, str] = {}
    todo, seen = [(fsm.initial, 0)], {(fsm.initial, 0)}
    while todo:
        q, n = todo.pop()
        nxt = n + 1 if n < cap else (None if hi is not None else n)
        by_target: dict = {}  # one terminal per target: fewer, larger classes
        if nxt is not None:
            for symbol, target in fsm.map.get(q, {}).items():
                if alive.get((target, nxt)) and symbols[symbol]:
                    by_target[target] = cs.union(by_target.get(target, ()), symbols[symbol])
                    if (target, nxt) not in seen:
                        seen.add((target, nxt))
                        todo.append((target, nxt))
        alts = [f"/{render(chars)}/ {name}_{target}_{nxt}"
                for target, chars in sorted(by_target.items(), key=lambda kv: str(kv[0]))]
        if len(seen) > max_pairs:
            raise TooLarge(f"more than {max_pairs} automaton states")
        body = " | ".join(alts)
        final = q in fsm.finals and n >= lo
        rules[f"{name}_{q}_{n}"] = (f"({body})?" if final else body) if body else ""
    rules[f"{name}_s"] = f'"\\"" {name}_{fsm.initial}_0 "\\""' if quoted else f"{name}_{fsm.initial}_0"
    return rules
