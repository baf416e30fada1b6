"""Left recursion → iteration: direct, indirect (through other rules) and hidden (behind nullable prefixes).

A top-down expansion of a left-recursive rule never consumes input, so the automaton builder
(:mod:`specjax.grammar.automaton`) needs a grammar without it. Grammars written for Earley parsers have all
three kinds: HeimdaLLM's SQL grammar reaches ``value`` again from ``value`` through ``value_expr`` and
``arith_expr``. Every rewrite here keeps the language (not the parse trees, which the automaton does not
need):

1. **Hidden** left recursion, ``A: N B x`` with ``N`` nullable and ``B`` leading back to ``A``, is split by the
   first symbol that derives something: ``A: N' B x | B x``, where ``N'`` is ``N`` without the empty string
   (:func:`_non_empty`, linear in the size of ``N``'s alternatives).
2. **Indirect** left recursion is turned into direct left recursion by Paull's substitution, one strongly
   connected component of the "starts with" graph at a time: members are ordered, and an alternative of the
   i-th member that starts with an earlier member gets that member's alternatives substituted.
3. **Direct** left recursion ``A: A a | b`` becomes ``A: b A__rest``, ``A__rest: a A__rest | ε``: right recursion
   in tail position, which costs no stack.

Substitution can multiply alternatives; past :data:`MAX_ALTERNATIVES` the grammar is refused, naming the rules.
"""

from __future__ import annotations

from specjax.grammar import _deadline
from specjax.grammar.errors import GrammarError

__all__ = ["MAX_ALTERNATIVES", "check_no_left_recursion", "nullable_rules", "remove_left_recursion"]

Rules = dict[str, list[tuple[str, ...]]]

MAX_ALTERNATIVES = 50_000  # per rewritten grammar: Paull's substitution is exponential in the worst case


def nullable_rules(rules: Rules) -> set[str]:
    """The rules that derive the empty string."""
    done: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, alts in rules.items():
            if name not in done and any(all(s in done for s in a) for a in alts):
                done.add(name)
                changed = True
    return done


def remove_left_recursion(rules: Rules) -> Rules:
    """Rewrites every kind of left recursion as iteration (same language); see the module docstring.

    Raises:
      GrammarError: substitution would make the grammar larger than :data:`MAX_ALTERNATIVES` alternatives.
    """
    rules = _split_hidden(rules)
    rules = _substitute_indirect(rules)
    return _remove_direct(rules)


def check_no_left_recursion(rules: Rules) -> None:
    """Refuses a grammar in which a rule can still reach itself without consuming input.

    :func:`remove_left_recursion` leaves none, so this only guards the rewrite: a top-down expansion of such a
    rule would stop at the nesting bound, silently cutting the language.
    """
    graph = _starts_with(_left_corners(rules, nullable_rules(rules)))
    comp = _components(graph)
    for name in sorted(graph):
        if back := sorted(m for m in graph[name] if comp[m] == comp[name]):
            raise GrammarError(f"left recursion through rules {name} and {back[0]} survived the rewrite into "
                               "iteration; rewrite it as repetition")


def _starts_with(corners: dict[str, list[tuple[str, int, int]]]) -> dict[str, set[str]]:
    """The "starts with" graph of :func:`_left_corners`: rule → the rules an alternative of it may start with."""
    return {n: {b for b, _, _ in cs} for n, cs in corners.items()}


def _left_corners(rules: Rules, nullable: set[str]) -> dict[str, list[tuple[str, int, int]]]:
    """Per rule, ``(B, alt index, position)`` for each rule ``B`` an alternative may start with."""
    out: dict[str, list[tuple[str, int, int]]] = {n: [] for n in rules}
    for name, alts in rules.items():
        for k, a in enumerate(alts):
            for i, s in enumerate(a):
                if s in rules:
                    out[name].append((s, k, i))
                if s not in nullable:
                    break
    return out


def _components(graph: dict[str, set[str]]) -> dict[str, int]:
    """Tarjan's strongly connected components (iterative): the component id of every node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, int] = {}
    stack: list[str] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child not in comp:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    comp[member] = index[node]
                    if member == node:
                        break
    return comp


def _non_empty(rules: Rules, name: str, nullable: set[str], out: Rules) -> str:
    """Adds ``name__ne``, the rule ``name`` without the empty string, to ``out`` (with what it needs)."""
    ne = f"{name}__ne"
    if ne in out:
        return ne
    out[ne] = []  # claimed first: a rule may need itself
    alts: list[tuple[str, ...]] = []
    for a in rules[name]:
        for i, s in enumerate(a):  # s is the first symbol of the alternative that derives something
            first = _non_empty(rules, s, nullable, out) if s in nullable else s
            alts.append((first,) + a[i + 1:])
            if s not in nullable:
                break
    out[ne] = list(dict.fromkeys(alts))
    return ne


def _split_hidden(rules: Rules) -> Rules:
    """Step 1: no left-recursive path passes a nullable prefix (``A: N B x`` → ``A: N' B x | B x``)."""
    nullable = nullable_rules(rules)
    corners = _left_corners(rules, nullable)
    comp = _components(_starts_with(corners))
    hidden = {(n, k) for n, cs in corners.items() for b, k, i in cs if i > 0 and comp[b] == comp[n]}
    if not hidden:
        return rules
    out: Rules = {n: list(a) for n, a in rules.items()}
    extra: Rules = {}
    for name, k in sorted(hidden):
        a = rules[name][k]
        split = []
        for i, s in enumerate(a):
            if s not in nullable:
                split.append(a[i:])
                break
            split.append((_non_empty(rules, s, nullable, extra),) + a[i + 1:])
        else:
            split.append(())
        out[name] = [x for x in out[name] if x != a] + split
    out.update({n: a for n, a in extra.items() if n not in out})
    return {n: list(dict.fromkeys(a)) for n, a in out.items()}


def _substitute_indirect(rules: Rules) -> Rules:
    """Step 2: Paull's substitution inside each cycle of the "starts with" graph."""
    comp = _components(_starts_with(_left_corners(rules, set())))  # step 1 left no nullable prefix on a cycle
    members: dict[int, list[str]] = {}
    for n in sorted(rules):
        members.setdefault(comp[n], []).append(n)
    out: Rules = {n: list(a) for n, a in rules.items()}
    total = sum(len(a) for a in out.values())
    for group in members.values():
        if len(group) < 2:
            continue
        done: list[str] = []
        for name in group:
            _deadline.check()
            changed = True
            while changed:
                changed = False
                alts: list[tuple[str, ...]] = []
                for a in out[name]:
                    if a[:1] and a[0] in done:
                        alts.extend(b + a[1:] for b in out[a[0]])
                        changed = True
                    else:
                        alts.append(a)
                total += len(set(alts)) - len(out[name])
                out[name] = list(dict.fromkeys(alts))
                if total > MAX_ALTERNATIVES:
                    raise GrammarError(
                        f"left recursion through rules {', '.join(group)} makes the grammar too large to rewrite "
                        f"(more than {MAX_ALTERNATIVES:,} alternatives); rewrite the recursion as repetition")
            out.update(_remove_direct({name: out[name]}))  # so later members never start with it again
            done.append(name)
    return out


def _remove_direct(rules: Rules) -> Rules:
    """Step 3: ``A: A a | b`` → ``A: b A__rest``, ``A__rest: a A__rest | ε`` (same language).

    Lark expands ``x*`` and ``x+`` into left-recursive helper rules, and arithmetic grammars are written
    left-recursively; as right recursion in tail position they cost no stack (see automaton.py).
    """
    out: Rules = {}
    for name, alts in rules.items():
        alts = [a for a in alts if a != (name,)]  # A: A adds nothing
        recursive = [a[1:] for a in alts if a[:1] == (name,)]
        if not recursive:
            out[name] = alts
            continue
        tail = f"{name}__rest"
        out[name] = [a + (tail,) for a in alts if a[:1] != (name,)]
        out[tail] = [a + (tail,) for a in recursive] + [()]
    return out
