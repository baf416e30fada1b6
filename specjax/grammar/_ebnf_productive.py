"""Which rules of the JSON Schema compiler's Lark text derive a finite string, read straight from the rule bodies.

The compiler writes a small subset of Lark's EBNF: string literals, ``/regex/`` terminals, rule and terminal
names, groups ``( )``, alternation ``|`` and the quantifiers ``?``, ``*``, ``+``, ``~n`` and ``~n..m``. Loading
the text with lark only to ask this took 5.7 of 6.2 s of one Kubernetes schema's front-end (a 756 KB grammar
that the grammar compiler loads again anyway); this parser reads each body once into a tree and iterates to
the fixed point.
"""

from __future__ import annotations

import re

__all__ = ["productive"]

_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*"i?)|(/(?:[^/\\]|\\.)*/[imslux]*)|([A-Za-z_][A-Za-z0-9_]*)'
                    r"|(~\s*\d+(?:\s*\.\.\s*\d+)?)|([()|?*+\[\]]))")


def productive(rules: dict[str, str]) -> set[str]:
    """Names of the rules (name → EBNF body) that derive some finite string; names not in ``rules`` are
    terminals (always productive)."""
    trees = {name: _parse(body) for name, body in rules.items()}
    done: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in reversed(list(trees)):  # helper rules are written after their users: children first
            if name not in done and _derives(trees[name], done, rules):
                done.add(name)
                changed = True
    return done


def _parse(body: str):
    tokens, pos = [], 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None:
            if body[pos:].strip():
                raise ValueError(f"unexpected grammar text at {body[pos:pos + 20]!r}")
            break
        pos = m.end()
        lit, rx, name, rep, punct = m.groups()
        tokens.append(("t", None) if lit or rx else ("n", name) if name else ("~", rep) if rep else (punct, None))
    tree, i = _alternation(tokens, 0)
    if i != len(tokens):
        raise ValueError(f"unbalanced grammar text {body[:40]!r}")
    return tree


def _alternation(tokens, i):
    seqs = []
    while True:
        seq, i = _sequence(tokens, i)
        seqs.append(seq)
        if i < len(tokens) and tokens[i][0] == "|":
            i += 1
            continue
        return ("alt", seqs), i


def _sequence(tokens, i):
    items = []
    while i < len(tokens) and tokens[i][0] not in ("|", ")", "]"):
        kind, value = tokens[i]
        if kind in ("(", "["):
            inner, i = _alternation(tokens, i + 1)
            atom = inner if kind == "(" else ("opt", inner)
            i += 1  # the closing bracket
        else:
            atom, i = (("leaf", value) if kind in ("t", "n") else ("leaf", None)), i + 1
        while i < len(tokens) and tokens[i][0] in ("?", "*", "+", "~"):
            kind, value = tokens[i]
            if kind in ("?", "*") or kind == "~" and int(re.findall(r"\d+", value)[0]) == 0:
                atom = ("opt", atom)
            i += 1
        items.append(atom)
    return ("seq", items), i


def _derives(tree, done: set[str], rules: dict[str, str]) -> bool:
    kind, value = tree
    if kind == "leaf":
        return value is None or value not in rules or value in done
    if kind == "opt":
        return True
    if kind == "seq":
        return all(_derives(t, done, rules) for t in value)
    return any(_derives(t, done, rules) for t in value)
