"""Lark grammar text → a plain context-free grammar over byte-level terminals.

Lark itself parses the grammar (EBNF, ``%import``, templates, ``?``/``!``/``_`` prefixes, aliases) and
expands it to BNF rules; this module reads those rules and terminals, turns every terminal into a byte
DFA (:mod:`specjax.grammar.terminals`), removes left recursion (so that it becomes iteration, see
:mod:`specjax.grammar._left_recursion`) and checks that the start rule derives some string.

The start rule is an option, as in lark (python.lark has no ``start`` rule: its entry rules are ``file_input``,
``single_input`` and ``eval_input``); when it is missing, the message names the grammar's top-level rules. A
``%declare``'d terminal (a postlexer's, such as Python's ``_INDENT``/``_DEDENT``) is refused only when the start
rule reaches it.

Tree-shaping features (aliases, ``?``/``!``/``_`` prefixes, rule priorities) do not change the language
and are ignored; terminal priorities only decide which terminal *name* a lexeme gets when several match
it, which does not change the set of accepted strings either (see docs/grammar.md).
"""

from __future__ import annotations

import dataclasses
import difflib
import re

import lark
import lark.exceptions
import lark.lexer
from lark import load_grammar as lark_load_grammar

from specjax.grammar import _deadline
from specjax.grammar._dfa import ByteDFA
from specjax.grammar._left_recursion import check_no_left_recursion, nullable_rules, remove_left_recursion
from specjax.grammar.errors import GrammarError
from specjax.grammar.terminals import terminal_dfa

__all__ = ["Cfg", "load_lark"]


@dataclasses.dataclass(frozen=True)
class Cfg:
    """A context-free grammar whose terminals are byte DFAs.

    Symbols in ``alts`` are ints: a terminal ``t`` is ``t >= 0`` (index into ``terminals``), a
    nonterminal ``n`` is ``-(n + 1)``.

    Attributes:
      rule_names: nonterminal names (index = nonterminal id).
      start: the start nonterminal id.
      alts: ``(lhs, symbols)`` per alternative.
      terminal_names: terminal names (index = terminal id).
      terminals: a byte DFA per terminal.
      ignore: ids of the ``%ignore`` terminals (allowed between any two terminals, and at both ends).
      nullable: per nonterminal, whether it derives the empty string.
    """

    rule_names: tuple[str, ...]
    start: int
    alts: tuple[tuple[int, tuple[int, ...]], ...]
    terminal_names: tuple[str, ...]
    terminals: tuple[ByteDFA, ...]
    ignore: tuple[int, ...]
    nullable: tuple[bool, ...]


def _build_lark_meta_parser() -> None:
    """Builds lark's parser of its own grammar language (once per process) without its regex-collision check.

    lark checks the terminals of its fixed meta-grammar for collisions with interegular when it first builds that
    parser: 0.25 s of the first compile in every process, for warnings about a grammar no user writes. The
    check only runs while ``lark.lexer.has_interegular`` is set, so it is unset for that one build.
    """
    if hasattr(lark_load_grammar._get_parser, "cache"):
        return
    had = lark.lexer.has_interegular
    lark.lexer.has_interegular = False
    try:
        lark_load_grammar._get_parser()
    finally:
        lark.lexer.has_interegular = had


def load_lark(text: str, start: str = "start") -> Cfg:
    """Loads Lark grammar text with lark and converts it to a :class:`Cfg`.

    Args:
      text: Lark grammar source.
      start: the start rule, as lark's own ``start=`` (python.lark, for one, has no ``start`` rule: its entry
        rules are ``file_input``, ``single_input`` and ``eval_input``).

    Raises:
      GrammarError: a syntax error (with line and column), an undefined rule or terminal, no such start rule
        (naming the rules that could be the start), a ``%declare``'d terminal reachable from the start (it
        needs a postlexer), an unsupported regex construct, left recursion too large to rewrite, or a start rule that
        derives no string.
    """
    _build_lark_meta_parser()
    try:
        # lark's own loader and EBNF → BNF compiler, without building a parser (lark.Lark would also build an
        # Earley parser and check regex collisions, minutes on large grammars that we do not need). Every rule
        # is kept (all are passed as starts), so that a missing start rule can be answered with the entry rules.
        grammar, _ = lark_load_grammar.load_grammar(text, "<grammar>", None, False)
        entry_names = [str(name) for name, params, _, _ in grammar.rule_defs if not params]
        terminal_list, rule_list, ignore_names = grammar.compile(entry_names or [start], set())
    except lark.exceptions.LarkError as e:
        raise GrammarError(f"invalid Lark grammar: {e}".rstrip()) from e
    rules: dict[str, list[tuple[str, ...]]] = {}
    for rule in rule_list:
        rules.setdefault(rule.origin.name, []).append(tuple(s.name for s in rule.expansion))
    if start not in rules:
        raise GrammarError(_no_start_message(start, rules, entry_names, grammar))
    term_defs = {t.name: t for t in terminal_list}
    used = _reachable(rules, start)
    term_names = sorted({s for n in used for alt in rules[n] for s in alt if s not in rules}
                        | set(ignore_names))
    if missing := [t for t in term_names if t not in term_defs]:
        raise GrammarError(_postlexer_message(missing, start, rules, entry_names))
    terminals = tuple(_terminal(name, term_defs[name].pattern, start, rules) for name in term_names)
    rules = {n: rules[n] for n in used}
    rules = _merge_optional_repeats(remove_left_recursion(rules))
    productive = _productive(rules, set(term_names))
    if start not in productive:
        raise GrammarError(f"the grammar's language is empty: rule {start!r} derives no finite string "
                           "(every alternative recurses without end)")
    rules = {n: [a for a in alts if all(s in productive or s not in rules for s in a)]
             for n, alts in rules.items() if n in productive}
    rules = {n: rules[n] for n in _reachable(rules, start)}
    check_no_left_recursion(rules)
    rules = _factor_alternatives(rules)
    nullable = nullable_rules(rules)
    names = sorted(rules, key=lambda n: (n != start, n))
    rule_id = {n: i for i, n in enumerate(names)}
    term_id = {t: i for i, t in enumerate(term_names)}
    code = lambda s: -(rule_id[s] + 1) if s in rule_id else term_id[s]
    alts = tuple((rule_id[n], tuple(code(s) for s in a)) for n in names for a in rules[n])
    return Cfg(rule_names=tuple(names), start=0, alts=alts, terminal_names=tuple(term_names),
               terminals=terminals, ignore=tuple(term_id[t] for t in ignore_names),
               nullable=tuple(n in nullable for n in names))


def _terminal(name: str, pattern, start: str, rules: dict[str, list[tuple[str, ...]]]) -> ByteDFA:
    """:func:`terminal_dfa`; a refusal also says where the terminal is used and how to replace it."""
    _deadline.check()
    try:
        return terminal_dfa(name, pattern)
    except GrammarError as e:
        users = sorted({_owner(n) for n in _reachable(rules, start) for alt in rules[n] if name in alt})
        used = f"used by rule{'s' if len(users) > 1 else ''} {', '.join(users)}" if users else "%ignore'd"
        raise GrammarError(f"{e} ({name} is {used}, reachable from start rule {start!r}; lark's "
                           f"'%override {name}: ...' at the end of the grammar replaces its definition)") from None


_OPTION = "GrammarOptions(start=...), or grammar_start=... on the command line"


def _owner(name: str) -> str:
    """The user rule a lark helper rule was made for (``__atom_star_3`` → ``atom``); other names unchanged."""
    return m[1] if (m := re.fullmatch(r"__(.+)_[a-z]+_[0-9]+", name)) else name


def _entry_rules(rules: dict[str, list[tuple[str, ...]]], names: list[str]) -> list[str]:
    """The grammar's top-level rules, the likely start rules: among ``names`` (in order), one rule per group of
    mutually recursive rules that no rule outside the group uses (``expr`` with ``term: "(" expr ")"``)."""
    edges: dict[str, set[str]] = {}
    for n, alts in rules.items():
        edges.setdefault(_owner(n), set()).update(_owner(s) for alt in alts for s in alt if s in rules)
    graph = {n: [tuple(sorted(to))] for n, to in edges.items()}  # _reachable's shape: one "alternative"
    reach = {n: set(_reachable(graph, n)) for n in graph}
    out: list[str] = []
    for n in (n for n in names if n in graph):
        top = all(m in reach[n] for m in graph if n in reach[m])  # whoever reaches n is in n's recursion
        if top and not any(n in reach[m] for m in out):  # one rule per recursive group
            out.append(n)
    return out


def _no_start_message(start: str, rules: dict[str, list[tuple[str, ...]]], names: list[str], grammar) -> str:
    templates = {str(n) for n, params, _, _ in grammar.rule_defs if params}
    if start in templates:
        problem = f"start rule {start!r} is a template (a rule with parameters), which cannot be the start"
    else:
        problem = f"the grammar has no rule named {start!r} (the start rule)"
        if close := difflib.get_close_matches(start, [n for n in names if n in rules], n=1, cutoff=0.8):
            problem += f" (did you mean {close[0]!r}?)"
    entries = _entry_rules(rules, names)
    where = f"top-level rules (used by no rule outside their own recursion): {', '.join(entries) or '(none)'}"
    return f"{problem}; {where} — pass the start rule as {_OPTION}"


def _postlexer_message(missing: list[str], start: str, rules: dict[str, list[tuple[str, ...]]],
                       names: list[str]) -> str:
    """Names %declare'd terminals reachable from the start, the rules using them and the starts that avoid them."""
    plural = len(missing) > 1
    users = sorted({_owner(n) for n in _reachable(rules, start) for alt in rules[n] if set(alt) & set(missing)})
    others = [n for n in _entry_rules(rules, names) if n != start
              and not {s for r in _reachable(rules, n) for alt in rules[r] for s in alt} & set(missing)]
    hint = f"; start rules that do not reach them: {', '.join(others)} ({_OPTION})" if others else ""
    return (f"terminal{'s' * plural} {', '.join(missing)} (used by rule{'s' * (len(users) > 1)} {', '.join(users)})"
            f" {'are' if plural else 'is'} %declare'd without a definition and reachable from start rule {start!r}:"
            " such terminals come from a postlexer (e.g. lark's Indenter, which turns Python's indentation into"
            f" _INDENT/_DEDENT), and a finite automaton over bytes cannot count indentation{hint}")


def _reachable(rules: dict[str, list[tuple[str, ...]]], start: str) -> list[str]:
    seen, todo = {start}, [start]
    while todo:
        for alt in rules[todo.pop()]:
            for s in alt:
                if s in rules and s not in seen:
                    seen.add(s)
                    todo.append(s)
    return sorted(seen)


def _merge_optional_repeats(rules: dict[str, list[tuple[str, ...]]]) -> dict[str, list[tuple[str, ...]]]:
    """Merges ``P Q | P S Q`` into ``P S* Q`` where ``S`` is a repetition ``a+`` (``S: a S*``, ``S*: a S* | ε``).

    Lark spells ``[x ("," x)*]`` as separate alternatives with and without the repetition; merged, the
    parser configuration after a list's first element equals the one after a later element, so the
    automaton does not carry that distinction through every nesting level (same language).
    """
    star = {}
    for name, alts in rules.items():
        rest = f"{name}__rest"
        if len(alts) == 1 and alts[0][-1:] == (rest,) and sorted(rules.get(rest, [])) == sorted([alts[0], ()]):
            star[name] = rest
    out = {}
    for name, alts in rules.items():
        alts = list(dict.fromkeys(alts))
        changed = True
        while changed:
            changed = False
            present = set(alts)
            for a in alts:
                i = next((i for i, x in enumerate(a) if x in star and a[:i] + a[i + 1:] in present), None)
                if i is not None:
                    merged = a[:i] + (star[a[i]],) + a[i + 1:]
                    alts = [x for x in alts if x not in (a, a[:i] + a[i + 1:])] + [merged]
                    changed = True
                    break
        out[name] = alts
    return out


def _factor_alternatives(rules: dict[str, list[tuple[str, ...]]]) -> dict[str, list[tuple[str, ...]]]:
    """Shares common prefixes and suffixes of a rule's alternatives (same language).

    Lark spells bounded repetition and inline groups as one alternative per combination: ``term (("+" | "-")
    term)~0..3`` is 15 alternatives, ``x?`` doubles them. Expanded as they are, each nesting level multiplies
    the parser configurations by that count (the arithmetic grammar of docs/grammar.md reached millions at
    depth 3). Factored, the alternatives form a minimal acyclic automaton whose states are helper rules
    (``expr__f1: ε | "+" term expr__f2 | "-" term expr__f2``), so a configuration only records how far the
    repetition has come.
    """
    out: dict[str, list[tuple[str, ...]]] = {}
    helpers: dict[frozenset, str] = {}

    def group(name: str, suffixes) -> list[tuple[str, ...]]:
        by_first: dict[str, set[tuple[str, ...]]] = {}
        alts = [()] if () in suffixes else []
        for s in suffixes:
            if s:
                by_first.setdefault(s[0], set()).add(s[1:])
        for first, tails in sorted(by_first.items()):
            alts.append((first,) + (next(iter(tails)) if len(tails) == 1 else (helper(name, frozenset(tails)),)))
        return alts

    def helper(name: str, tails: frozenset) -> str:
        if (h := helpers.get(tails)) is None:  # equal suffix sets share one rule: suffixes are merged too
            base, k = re.sub(r"(__rest|__f[0-9]+)+$", "", name), len(helpers)
            while f"{base}__f{k}" in rules or f"{base}__f{k}" in out:  # never a name the grammar uses
                k += 1
            h = helpers[tails] = f"{base}__f{k}"
            out[h] = group(name, tails)
        return h

    for name, alts in rules.items():
        out[name] = group(name, set(alts))
    return out


def _productive(rules: dict[str, list[tuple[str, ...]]], terminals: set[str]) -> set[str]:
    done: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, alts in rules.items():
            if name not in done and any(all(s in terminals or s in done for s in a) for a in alts):
                done.add(name)
                changed = True
    return done
