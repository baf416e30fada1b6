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

from specjax.grammar import _deadline
from specjax.grammar._dfa import byte_classes, coreachable, minimize, row_ids
from specjax.grammar.errors import GrammarError
from specjax.grammar.frontend import Cfg

__all__ = ["ByteAutomaton", "build_automaton", "minimize", "byte_classes", "row_ids"]

DEAD, INITIAL = 0, 1
IGNORE_RUN = 3  # with max_ignore: at most this many %ignore'd lexemes in a row (whitespace, comment, whitespace)
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
      classes: (class per byte int [256], next state per class [S, classes]) as the construction had them:
        bytes of one class act alike in every state (coarser classes may exist after minimisation); ``trans_sb``
        is this table with its columns expanded to bytes.
    """

    trans_sb: np.ndarray
    accept_s: np.ndarray
    truncated: bool
    raw_states: int
    classes: tuple[np.ndarray, np.ndarray]


def build_automaton(cfg: Cfg, max_depth: int, max_states: int, name: str = "the grammar",
                    max_ignore: int | None = None, leading_ignore: bool = True) -> ByteAutomaton:
    """Builds the minimal byte DFA of ``cfg`` with nesting bounded by ``max_depth``.

    Args:
      cfg: the grammar.
      max_depth: nesting bound (see the module docstring).
      max_states: refuse once the subset construction reaches this many states, or its parser closures
        this many configurations times 8; checked as they grow, so memory stays bounded by the cap.
      name: how error messages name the grammar.
      max_ignore: at most this many bytes per ``%ignore``'d lexeme, and at most ``IGNORE_RUN`` such lexemes
        between two terminals (and at either end); None: unbounded. A model cannot then loop on whitespace.
      leading_ignore: whether ``%ignore``'d text may come before the first terminal (lark accepts it;
        llguidance does not).

    Raises:
      GrammarError: the cap was reached (naming the grammar, the count, the recursive rules and the options to
        change), or an empty language under the bounds.
    """
    builder = _Builder(cfg, max_depth, max_states, name, max_ignore, leading_ignore)
    trans, raw_accept, builder = builder.run()  # over byte classes
    alive = coreachable(trans, raw_accept)
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
    return ByteAutomaton(builder.expand(out), acc, builder.truncated, len(raw_accept), (builder.byte_cls, out))


def _length_bounded(dfa, max_len: int):
    """The DFA of the strings of ``dfa`` of at most ``max_len`` bytes: states (state, bytes read), trimmed."""
    from specjax.grammar._dfa import minimal_dfa

    n = len(dfa.accept)
    trans = np.full(((max_len + 1) * n, 256), -1, np.int32)
    for k in range(max_len):  # (q, k) -> (q', k + 1)
        step = dfa.trans
        trans[k * n:(k + 1) * n] = np.where(step >= 0, step + (k + 1) * n, -1)
    accept = np.tile(dfa.accept, max_len + 1)
    alive = coreachable(trans, accept)  # a lexeme that can no longer end must not keep the lexer greedy
    trans = np.where((trans >= 0) & alive[np.maximum(trans, 0)], trans, -1)
    return minimal_dfa(trans, accept)


def _recursive_rules(cfg: Cfg) -> list[bool]:
    """Per nonterminal: whether it lies on a cycle of the grammar (it can derive a form holding itself).

    Tarjan's strongly connected components, iterative (JSON Schema grammars have thousands of rules).
    """
    n = len(cfg.rule_names)
    uses: list[list[int]] = [[] for _ in range(n)]
    self_loop = [False] * n
    for lhs, syms in cfg.alts:
        for x in syms:
            if x < 0:
                uses[lhs].append(-x - 1)
                self_loop[lhs] |= -x - 1 == lhs
    index, low, on_stack, stack, out, counter = [-1] * n, [0] * n, [False] * n, [], list(self_loop), 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if i < len(uses[v]):
                work.append((v, i + 1))
                w = uses[v][i]
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    for w in component:
                        out[w] = True
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


class _Builder:
    """Subset construction over lexer threads; see the module docstring."""

    def __init__(self, cfg: Cfg, max_depth: int, max_states: int, name: str, max_ignore: int | None = None,
                 leading_ignore: bool = True):
        self.cfg, self.max_depth, self.max_states, self.name = cfg, max_depth, max_states, name
        self.leading_ignore = leading_ignore
        self._work = 0  # parser configurations expanded by _closure, capped at 8 * max_states
        # Ignored lexemes: with max_ignore, each is a length-bounded copy of its terminal (its own terminal id,
        # so the grammar's own uses of the terminal stay unbounded), and a boundary carries how many more
        # ignored lexemes it allows (IGNORE_RUN at most in a row).
        dfas = list(cfg.terminals)
        self.ignore = list(cfg.ignore)
        self.ignore_run = None if max_ignore is None else IGNORE_RUN
        if max_ignore is not None:
            self.ignore = list(range(len(dfas), len(dfas) + len(cfg.ignore)))
            dfas += [_length_bounded(cfg.terminals[t], max_ignore) for t in cfg.ignore]
        # A grammar without terminals (``start:`` with no body) matches only the empty string.
        mats = [d.trans for d in dfas] or [np.full((1, 256), -1, np.int32)]
        self.byte_cls, self.n_cls = byte_classes(np.vstack(mats))
        first = np.unique(self.byte_cls, return_index=True)[1]
        # The same transitions twice: lists for the per-element Python reads of `_advance` (reading numpy
        # scalars one at a time is several times slower), arrays for the column signatures of `_alike_classes`.
        self.term_trans = [d.trans[:, first].tolist() for d in dfas]
        self.term_trans_np = [np.ascontiguousarray(d.trans[:, first], np.int32) for d in dfas]
        self._alike_memo: dict[tuple[frozenset, frozenset], tuple[np.ndarray, np.ndarray]] = {}
        self.term_accept = [d.accept.tolist() for d in dfas]
        self.alts_of: list[list[int]] = [[] for _ in cfg.rule_names]  # per nonterminal, its alternatives
        for i, (lhs, _) in enumerate(cfg.alts):
            self.alts_of[lhs].append(i)
        # A parser configuration is the sequence of symbols still to be matched (the stack, flattened):
        # equal futures then have equal keys however they were reached (a list's first and later elements,
        # "(a+(" and "(("), which keeps the subset construction close to the minimal automaton.
        self.alt_syms = [syms for _, syms in cfg.alts]
        # Only recursion needs a bound: symbols pushed by a rule outside every cycle of the grammar (declared
        # structure, e.g. a JSON Schema's nested objects) are *tagged* (terminal t -> t + n_terms, nonterminal
        # n -> n - n_rules) and not counted, so such nesting is never cut at any depth; it is finite anyway.
        self.n_terms, self.n_rules = len(cfg.terminals), len(cfg.rule_names)
        self.recursive = _recursive_rules(cfg)
        self.push_syms = [syms if self.recursive[lhs] else
                          tuple(x + self.n_terms if x >= 0 else x - self.n_rules for x in syms)
                          for lhs, syms in cfg.alts]
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
            if self._work % 1024 == 0:
                _deadline.check()
            if self._work > 8 * self.max_states:  # a closure may blow up before any state is added
                self._too_big(f"{self._work} parser configurations")
            if not f:
                accept = True
                continue
            sym, rest = self._untag(f[0]), f[1:]
            if sym >= 0:
                expects.add((sym, rest))
                continue
            recursive = self.recursive[-sym - 1]
            for a in self.alts_of[-sym - 1]:
                new = self.push_syms[a] + rest
                if recursive and rest and any(k > self.limit[x] for x, k in self._weight(new).items()):
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

    def _untag(self, sym: int) -> int:
        return sym - self.n_terms if sym >= self.n_terms else sym + self.n_rules if sym < -self.n_rules else sym

    def _weight(self, form: tuple[int, ...]) -> Counter:
        """Counts of the untagged symbols of a pending form, helpers counted with what they must hold."""
        counts = Counter(x for x in form if -self.n_rules <= x < self.n_terms)
        for x in [x for x in counts if x in self._must]:
            counts.update({y: k * counts[x] for y, k in self._must[x].items()})
        return counts

    def _intern(self, expects: frozenset, accept: bool, ignores_left: int | None = None) -> int:
        key = (expects, accept, self.ignore_run if ignores_left is None else ignores_left)
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
            b = self._union_memo[boundaries] = self._intern(frozenset().union(*(e for e, _, _ in parts)),
                                                           any(a for _, a, _ in parts),
                                                           None if self.ignore_run is None else
                                                           max(k for _, _, k in parts))
        return b

    def _fresh(self, boundary: int) -> tuple[tuple[int, int], ...]:
        """Lexer threads starting at ``boundary``: (terminal, boundary after it) pairs."""
        if (hit := self._fresh_memo.get(boundary)) is not None:
            return hit
        by_term: dict[int, set] = {}
        for term, cont in self._boundaries[boundary][0]:
            by_term.setdefault(term, set()).add(cont)
        out = [(t, self._close(c)) for t, c in by_term.items()]
        expects, accept, left = self._boundaries[boundary]
        if left is None:  # an ignored lexeme returns to this very boundary
            out += [(t, boundary) for t in self.ignore]
        elif left > 0:  # ... with one ignored lexeme fewer left
            out += [(t, self._intern(expects, accept, left - 1)) for t in self.ignore]
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
        if not self.leading_ignore:  # the same boundary with no ignored lexeme allowed (left = 0)
            start = self._intern(*self._boundaries[start][:2], 0)
        init = (frozenset((t, 0, c) for t, c in self._fresh(start)), True)
        ids, order, rows, accepts = {init: 0}, [init], [], []
        while len(rows) < len(order):
            if len(rows) % 64 == 0:
                _deadline.check()
            threads, is_init = order[len(rows)]
            accepts.append(self._boundaries[start][1] if is_init else any(
                self.term_accept[t][q] and self._boundaries[c][1] for t, q, c in threads))
            reps, inverse = self._alike_classes(threads)
            row = []
            for cls in reps:  # one step per group of classes that every live thread treats alike
                nxt = self._step(threads, int(cls))
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
            rows.append(np.asarray(row, np.int32)[inverse])
        return np.array(rows, np.int32).reshape(len(rows), self.n_cls), np.array(accepts, bool), self

    def _alike_classes(self, threads: frozenset) -> tuple[np.ndarray, np.ndarray]:
        """Byte classes that ``_step`` maps alike from ``threads``: (one class per group, each class's group).

        ``_step`` reads a class only through the live threads' terminal transitions and, when a lexeme may end,
        the fresh threads' first transitions; classes with equal columns there step alike. A state has a
        handful of such groups out of ~50 classes, and each step is Python work on sets.
        """
        live = frozenset((t, q) for t, q, _ in threads)
        ended = frozenset(c for t, q, c in threads if self.term_accept[t][q])
        fresh = frozenset(t for t, _ in self._fresh(self._union(ended))) if ended else frozenset()
        key = (live, fresh)  # the columns depend on these only, and many states share them
        if (hit := self._alike_memo.get(key)) is not None:
            return hit
        cols = [self.term_trans_np[t][q] for t, q in live] + [self.term_trans_np[t][0] for t in fresh]
        if not cols:
            out = np.zeros(1, np.int64), np.zeros(self.n_cls, np.int64)
        else:
            sig = np.ascontiguousarray(np.stack(cols, axis=1))  # [n_cls, columns]
            _, reps, inverse = np.unique(sig.view(np.dtype((np.void, sig.shape[1] * 4))).reshape(-1),
                                         return_index=True, return_inverse=True)
            out = reps, inverse.reshape(-1)
        self._alike_memo[key] = out
        return out

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
                         for x, k in self._weight(form).items() if x < 0 and k > 1})
        change = "lower max_depth or raise max_states" if self.max_depth > 1 else "raise max_states"
        raise GrammarError(
            f"{self.name} is too large at nesting depth {self.max_depth} (max_depth): the construction stopped at "
            f"{reached} (cap: max_states={self.max_states}); nesting through rules "
            f"{', '.join(nested[:8]) or '(none)'} multiplies the states: {change} (GrammarOptions(max_depth=..., "
            "max_states=...); grammar_max_depth=..., grammar_max_states=... on the command line)")
