"""A :class:`~specjax.grammar.frontend.Cfg` → one minimal DFA over bytes (shape "B" of grammar-notes.md).

**Parser part.** A configuration is the sequence of symbols still to be matched (the stack, flattened).
Calls in tail position add nothing, and left recursion was rewritten as tail recursion by the front-end,
so iteration never grows it; only self-embedding recursion (brackets, nested expressions) does. The
nesting bound keeps configurations finite: a terminal may be pending at most ``max_depth`` times, a
nonterminal ``4 * max_depth`` times (or as often as it occurs in one alternative, if more). Expansions past
the bound are dropped, i.e. deeper nesting is masked out; everything within the bound is exact.

**Lexer part (greedy, contextual, no backtracking — llguidance's semantics).** At a lexeme boundary, the
terminals the parser expects (plus the ``%ignore`` ones) start in parallel. A lexeme ends only when the
next byte cannot extend any live terminal; it may then end as any terminal that accepts it. So ``A A``
with ``A: /a+/`` never splits ``aaaa``, as in lark's and llguidance's lexers.

A DFA state is the set of live lexer threads ``(terminal, terminal state, boundary after it)``; subset
construction over byte classes, then trimming (states that cannot reach acceptance become the dead
state) and Moore minimisation with numpy.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import numpy as np

from specjax.grammar.errors import GrammarError
from specjax.grammar.frontend import Cfg

__all__ = ["ByteAutomaton", "build_automaton", "minimize", "byte_classes", "row_ids"]

DEAD, INITIAL = 0, 1
_HELPER = re.compile(r"(__rest|__f\d+)+$")  # rules the front-end added, named after their origin
_FACTORED = re.compile(r"__f\d+$")  # the front-end's factored alternatives


@dataclasses.dataclass(frozen=True, eq=False)
class ByteAutomaton:
    """A minimal, trimmed DFA over bytes. State 0 is the dead state (absorbing), state 1 the initial one.

    Attributes:
      trans_sb: int32 [S, 256] next state per byte.
      accept_s: bool [S] whether the text so far is a complete sentence.
      truncated: whether the nesting bounds cut off part of the language.
      raw_states: states of the subset construction, before minimisation.
    """

    trans_sb: np.ndarray
    accept_s: np.ndarray
    truncated: bool
    raw_states: int


def byte_classes(trans_nb: np.ndarray) -> tuple[np.ndarray, int]:
    """Bytes that behave alike in every state share a class: returns (class per byte [256], n_classes)."""
    _, first, cls = np.unique(trans_nb.T, axis=0, return_index=True, return_inverse=True)
    # Number classes by first byte so the result does not depend on np.unique's row order.
    rank = np.argsort(np.argsort(first))
    return rank[cls.reshape(-1)].astype(np.int32), len(first)


def row_ids(rows_nk: np.ndarray) -> np.ndarray:
    """Dense ids of the distinct rows of an int64 matrix (equal rows, equal ids), exactly.

    Rows are hashed to one int64 each and the hashes sorted (much faster than ``np.unique(axis=0)``, which
    sorts whole rows); a hash collision is detected by comparing every row with its group's first row, and
    only then are whole rows sorted.
    """
    mult = np.random.default_rng(0).integers(1, 2**62, rows_nk.shape[1], dtype=np.int64) | 1
    hashes = (rows_nk * mult).sum(axis=1)  # wraps around: fine for a hash
    _, first, ids = np.unique(hashes, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    if not (rows_nk == rows_nk[first[ids]]).all():
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
    t = t[:, np.unique(t, axis=1, return_index=True)[1]]
    part = np.append(accept.astype(np.int64), 2 if dead is None else 0)
    if dead is not None:
        part[dead] = 2  # the dead state is alone (and equal to the sink)
        part[sink] = 2
    count = len(np.unique(part))
    t_full = np.vstack([t, np.full((1, t.shape[1]), sink)]).astype(np.int64)
    while True:
        part = row_ids(np.concatenate([part[:, None], part[t_full]], axis=1))
        new_count = int(part.max()) + 1
        if new_count == count:
            return part[:n], new_count
        count = new_count


def build_automaton(cfg: Cfg, max_depth: int, max_states: int, name: str = "the grammar") -> ByteAutomaton:
    """Builds the minimal byte DFA of ``cfg`` with nesting bounded by ``max_depth``.

    Args:
      cfg: the grammar.
      max_depth: nesting bound (see the module docstring).
      max_states: refuse once the subset construction reaches this many states, or its parser closures
        this many configurations times 8; checked as they grow, so memory stays bounded by the cap.
      name: how error messages name the grammar.

    Raises:
      GrammarError: the cap was reached (naming the grammar, the count, the recursive rules and the options to
        change), or an empty language under the bounds.
    """
    trans, raw_accept, builder = _Builder(cfg, max_depth, max_states, name).run()  # over byte classes
    alive = _coreachable(trans, raw_accept)
    if not alive[0]:
        why = (f" within nesting depth {max_depth} (max_depth)"
               if builder.truncated else " (no string satisfies both the rules and the greedy lexer)")
        raise GrammarError(f"the grammar's language is empty{why}")
    trans = np.where((trans >= 0) & alive[np.maximum(trans, 0)], trans, -1)
    block, n_blocks = minimize(trans, raw_accept)
    # Renumber: 0 dead, 1 initial, then the blocks of live states in order of first appearance.
    ids_of_block = np.full(n_blocks, -1, np.int64)
    ids_of_block[block[0]] = INITIAL
    n = 2
    for b in block[alive]:
        if ids_of_block[b] < 0:
            ids_of_block[b] = n
            n += 1
    out = np.zeros((n, trans.shape[1]), np.int32)
    acc = np.zeros(n, bool)
    src = np.nonzero(alive)[0]
    ids = ids_of_block[block]
    tgt = trans[src]
    out[ids[src]] = np.where(tgt >= 0, ids[np.maximum(tgt, 0)], DEAD)
    acc[ids[src]] = raw_accept[src]
    return ByteAutomaton(builder.expand(out), acc, builder.truncated, len(raw_accept))


def _coreachable(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    alive = accept.copy()
    while True:
        step = alive | ((trans >= 0) & alive[np.maximum(trans, 0)]).any(axis=1)
        if (step == alive).all():
            return alive
        alive = step


class _Builder:
    """Subset construction over lexer threads; see the module docstring."""

    def __init__(self, cfg: Cfg, max_depth: int, max_states: int, name: str):
        self.cfg, self.max_depth, self.max_states, self.name = cfg, max_depth, max_states, name
        self._work = 0  # parser configurations expanded by _closure, capped at 8 * max_states
        mats = [d.trans for d in cfg.terminals]
        self.byte_cls, self.n_cls = byte_classes(np.vstack(mats))
        first = np.unique(self.byte_cls, return_index=True)[1]
        self.term_trans = [d.trans[:, first].tolist() for d in cfg.terminals]
        self.term_accept = [d.accept.tolist() for d in cfg.terminals]
        self.alts_of = [cfg.alts_of(n) for n in range(len(cfg.rule_names))]
        # A parser configuration is the sequence of symbols still to be matched (the stack, flattened):
        # equal futures then have equal keys however they were reached (a list's first and later elements,
        # "(a+(" and "(("), which keeps the subset construction close to the minimal automaton.
        self.alt_syms = [syms for _, syms in cfg.alts]
        # Nesting bound: a terminal may be pending at most max_depth times (or its count in one alternative,
        # if larger, so that straight-line repeats such as  "a" "a" "a"  are never cut): "]" is pending once
        # per open "[", so max_depth is the nesting depth per bracket kind. Nonterminals get 4x as much room:
        # each bracket level may hold a few expression levels (expr, term, factor), and the bound on them
        # only exists to stop self-embedding without any pending terminal.
        self._must = self._helper_contents()
        per_alt: dict[int, int] = {}
        for syms in self.alt_syms:
            for x, k in self._weight(syms).items():
                per_alt[x] = max(per_alt.get(x, 0), k)
        self.limit = {x: max(max_depth if x >= 0 else 4 * max_depth, k) for x, k in per_alt.items()}
        self.truncated = False
        self._closure_memo: dict = {}
        # A "boundary" is where a lexeme may start. It is interned by its expansion, the set of
        # (terminal, configuration after it) pairs plus whether the input may end there, so that different
        # configurations with the same expansion (e.g. a list's first and later elements) share states.
        self._boundary_ids: dict[tuple[frozenset, bool], int] = {}
        self._boundaries: list[tuple[frozenset, bool]] = []
        self._fresh_memo: dict[int, tuple[tuple[int, int], ...]] = {}
        self._union_memo: dict[frozenset, int] = {}

    def expand(self, raw: np.ndarray) -> np.ndarray:
        return raw[:, self.byte_cls]

    # ---------------------------------------------------------------- parser configurations
    def _closure(self, form: tuple[int, ...]) -> tuple[frozenset, bool]:
        """Expected (terminal, form after it) pairs and whether the input may end, from pending ``form``."""
        if (hit := self._closure_memo.get(form)) is not None:
            return hit
        expects, accept, seen, todo = set(), False, set(), [form]
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            self._work += 1
            if self._work > 8 * self.max_states:  # a closure may blow up before any state is added
                self._too_big(f"{self._work} parser configurations")
            if not f:
                accept = True
                continue
            sym, rest = f[0], f[1:]
            if sym >= 0:
                expects.add((sym, rest))
                continue
            for a in self.alts_of[-sym - 1]:
                new = self.alt_syms[a] + rest
                if rest and any(k > self.limit[x] for x, k in self._weight(new).items()):
                    self.truncated = True  # deeper than max_depth: masked out
                    continue
                todo.append(new)
        out = (frozenset(expects), accept)
        self._closure_memo[form] = out
        return out

    def _helper_contents(self) -> dict[int, Counter]:
        """Per factored helper rule (``x__f3``): the symbols every one of its alternatives holds.

        A helper pending in a form stands for one of several suffixes of an original alternative; counting
        what they all hold (e.g. the closing bracket) keeps the nesting bound as tight as before factoring.
        """
        helper = {-(n + 1) for n, name in enumerate(self.cfg.rule_names) if _FACTORED.search(name)}
        must: dict[int, Counter] = {}

        def contents(h: int) -> Counter:
            if h not in must:
                common = None
                for a in self.alts_of[-h - 1]:
                    c = Counter(self.alt_syms[a])
                    for x in [x for x in c if x in helper]:
                        c.update({y: k * c[x] for y, k in contents(x).items()})
                    common = c if common is None else common & c
                must[h] = common or Counter()
            return must[h]

        for h in helper:  # helpers form a DAG (finite sets of suffixes), so this terminates
            contents(h)
        return must

    def _weight(self, form: tuple[int, ...]) -> Counter:
        """Symbol counts of a pending form, helpers counted with what they must hold."""
        counts = Counter(form)
        for x in [x for x in counts if x in self._must]:
            counts.update({y: k * counts[x] for y, k in self._must[x].items()})
        return counts

    def _intern(self, expects: frozenset, accept: bool) -> int:
        key = (expects, accept)
        if (b := self._boundary_ids.get(key)) is None:
            b = self._boundary_ids[key] = len(self._boundaries)
            self._boundaries.append(key)
        return b

    def _close(self, configs) -> int:
        """The boundary reached when the parser is in any of ``configs``."""
        expects, accept = set(), False
        for config in configs:
            e, a = self._closure(config)
            expects |= e
            accept |= a
        return self._intern(frozenset(expects), accept)

    def _union(self, boundaries: frozenset) -> int:
        if len(boundaries) == 1:
            return next(iter(boundaries))
        if (b := self._union_memo.get(boundaries)) is None:
            parts = [self._boundaries[x] for x in boundaries]
            b = self._union_memo[boundaries] = self._intern(frozenset().union(*(e for e, _ in parts)),
                                                           any(a for _, a in parts))
        return b

    def _fresh(self, boundary: int) -> tuple[tuple[int, int], ...]:
        """Lexer threads starting at ``boundary``: (terminal, boundary after it) pairs."""
        if (hit := self._fresh_memo.get(boundary)) is not None:
            return hit
        by_term: dict[int, set] = {}
        for term, cont in self._boundaries[boundary][0]:
            by_term.setdefault(term, set()).add(cont)
        out = [(t, self._close(c)) for t, c in by_term.items()]
        out += [(t, boundary) for t in self.cfg.ignore]  # an ignored lexeme returns to this very boundary
        # Ignore terminals that the grammar also expects here need both continuations.
        merged: dict[int, set[int]] = {}
        for t, b in out:
            merged.setdefault(t, set()).add(b)
        result = tuple(sorted((t, self._union(frozenset(bs))) for t, bs in merged.items()))
        self._fresh_memo[boundary] = result
        return result

    # ---------------------------------------------------------------- subset construction
    def run(self) -> tuple[np.ndarray, np.ndarray, _Builder]:
        start = self._close([(-(self.cfg.start + 1),)])
        init = (frozenset((t, 0, c) for t, c in self._fresh(start)), True)
        ids, order, rows, accepts = {init: 0}, [init], [], []
        while len(rows) < len(order):
            threads, is_init = order[len(rows)]
            accepts.append(self._boundaries[start][1] if is_init else any(
                self.term_accept[t][q] and self._boundaries[c][1] for t, q, c in threads))
            row = []
            for cls in range(self.n_cls):
                nxt = self._step(threads, cls)
                if nxt is None:
                    row.append(-1)
                    continue
                key = (nxt, False)
                if key not in ids:
                    if len(order) >= self.max_states:
                        self._too_big(f"{len(order)} automaton states")
                    ids[key] = len(order)
                    order.append(key)
                row.append(ids[key])
            rows.append(row)
        return np.array(rows, np.int32).reshape(len(rows), self.n_cls), np.array(accepts, bool), self

    def _step(self, threads: frozenset, cls: int) -> frozenset | None:
        nxt = self._advance(threads, cls)
        if nxt:  # greedy: a lexeme that can grow does not end
            return nxt
        ended = frozenset(c for t, q, c in threads if self.term_accept[t][q])
        if not ended:
            return None
        fresh = self._fresh(self._union(ended))
        return self._advance(((t, 0, c) for t, c in fresh), cls) or None

    def _advance(self, threads, cls: int) -> frozenset:
        merged: dict[tuple[int, int], set] = {}
        for t, q, c in threads:
            q2 = self.term_trans[t][q][cls]
            if q2 >= 0:
                merged.setdefault((t, q2), set()).add(c)
        return frozenset((t, q2, self._union(frozenset(cs))) for (t, q2), cs in merged.items())

    def _too_big(self, reached: str) -> None:
        nested = sorted({_HELPER.sub("", self.cfg.rule_names[-x - 1]) for form in self._closure_memo
                         for x, k in Counter(form).items() if x < 0 and k > 1})
        raise GrammarError(
            f"{self.name} is too large at nesting depth {self.max_depth} (max_depth): the construction stopped at "
            f"{reached} (cap: max_states={self.max_states}); nesting through rules "
            f"{', '.join(nested[:8]) or '(none)'} multiplies the states: lower max_depth or raise max_states")
