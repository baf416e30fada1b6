"""Random strings from a Lark grammar: a test oracle for the front-ends (and for compiled tables).

`LarkSampler(text).sample(rng)` expands rules at random, switching to each symbol's shallowest
expansion past `max_depth` so that recursive grammars terminate, and draws regex terminals from
their parse tree (Python's `re` parser), biased towards printable ASCII so outputs stay readable
while still covering the other characters of a class.
"""

from __future__ import annotations

import random
import re
from re import _constants as C  # noqa: N812
from re import _parser as sre_parse

from lark.load_grammar import load_grammar

__all__ = ["LarkSampler"]

_PRINTABLE = (0x20, 0x7E)


class LarkSampler:
    """Samples strings of a Lark grammar's language (start rule `start`)."""

    def __init__(self, text: str, max_depth: int = 12, max_repeat: int = 4):
        # lark's grammar loader gives the BNF rules and terminals without building a parser (fast).
        grammar, _ = load_grammar(text, "<sampled>", [], False)
        terminals, rules, _ = grammar.compile(["start"], set())
        self.max_depth, self.max_repeat = max_depth, max_repeat
        self.rules: dict[str, list[list]] = {}
        for rule in rules:
            self.rules.setdefault(rule.origin.name, []).append(list(rule.expansion))
        self.terminals = {t.name: t.pattern for t in terminals}
        self.trees = {name: sre_parse.parse(p.value) for name, p in self.terminals.items() if p.type == "re"}
        self.height = self._heights()

    def _heights(self) -> dict[str, int]:
        """Least derivation height of each rule name (fixpoint), to finish derivations quickly."""
        height: dict[str, int] = {}
        changed = True
        while changed:
            changed = False
            for name, expansions in self.rules.items():
                for exp in expansions:
                    hs = [height.get(s.name) for s in exp if not s.is_term]
                    if None not in hs:
                        h = 1 + max(hs, default=0)
                        if h < height.get(name, 1 << 30):
                            height[name], changed = h, True
        return height

    def sample(self, rng: random.Random, start: str = "start") -> str:
        """One random string derived from rule `start`."""
        out: list[str] = []
        self._expand(start, rng, 0, out)
        return "".join(out)

    def _expand(self, name: str, rng: random.Random, depth: int, out: list[str]) -> None:
        # only expansions that can finish (a grammar may hold unproductive parts: dead alternatives)
        expansions = [e for e in self.rules[name] if self._exp_height(e) < 1 << 30]
        if depth >= self.max_depth:
            best = min(self._exp_height(e) for e in expansions)
            expansions = [e for e in expansions if self._exp_height(e) == best]
        for sym in rng.choice(expansions):
            if sym.is_term:
                out.append(self._terminal(sym.name, rng))
            else:
                self._expand(sym.name, rng, depth + 1, out)

    def _exp_height(self, exp) -> int:
        return max((self.height.get(s.name, 1 << 30) for s in exp if not s.is_term), default=0)

    def _terminal(self, name: str, rng: random.Random) -> str:
        pattern = self.terminals[name]
        if pattern.type == "str":
            return pattern.value
        out: list[str] = []
        self._regex(self.trees[name], rng, out)
        return "".join(out)

    def _regex(self, items, rng: random.Random, out: list[str]) -> None:
        for op, av in items:
            if op is C.LITERAL:
                out.append(chr(av))
            elif op in (C.IN, C.NOT_LITERAL, C.ANY):
                out.append(self._char(op, av, rng))
            elif op is C.SUBPATTERN:
                self._regex(av[3], rng, out)
            elif op is C.BRANCH:
                self._regex(rng.choice(av[1]), rng, out)
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
                lo, hi, sub = av
                for _ in range(rng.randint(lo, min(hi, lo + self.max_repeat))):
                    self._regex(sub, rng, out)
            else:
                raise ValueError(f"sampler: regex construct {op} is outside the grammar interface")

    def _char(self, op, av, rng: random.Random) -> str:
        """A random character of a one-character regex item, found by rejection from a biased pool."""
        if op is C.IN and all(kind in (C.LITERAL, C.RANGE) for kind, _ in av):  # explicit set: pick directly
            ranges = [(arg, arg) if kind is C.LITERAL else arg for kind, arg in av]
            printable = [(max(a, 0x20), min(b, 0x7E)) for a, b in ranges if a <= 0x7E and b >= 0x20]
            a, b = rng.choice(printable if printable and rng.random() < 0.8 else ranges)
            return chr(rng.randint(a, b))
        rx = re.compile(_item_text(op, av))
        for _ in range(2000):
            roll = rng.random()
            cp = (rng.randint(*_PRINTABLE) if roll < 0.8 else rng.randint(0, 0x7F) if roll < 0.9
                  else rng.randint(0x80, 0xD7FF) if roll < 0.97 else rng.randint(0xE000, 0x10FFFF))
            if rx.fullmatch(chr(cp)):
                return chr(cp)
        raise ValueError(f"sampler: no character found for {_item_text(op, av)!r}")


def _item_text(op, av) -> str:
    """Regex text for one class item (rebuilt from the parse tree)."""
    if op is C.ANY:
        return "."
    if op is C.NOT_LITERAL:
        return "[^" + re.escape(chr(av)) + "]"
    parts, neg = [], ""
    for kind, arg in av:
        if kind is C.NEGATE:
            neg = "^"
        elif kind is C.LITERAL:
            parts.append(re.escape(chr(arg)))
        elif kind is C.RANGE:
            parts.append(re.escape(chr(arg[0])) + "-" + re.escape(chr(arg[1])))
        elif kind is C.CATEGORY:
            parts.append({C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_WORD: r"\w",
                          C.CATEGORY_NOT_WORD: r"\W", C.CATEGORY_SPACE: r"\s", C.CATEGORY_NOT_SPACE: r"\S"}[arg])
    return "[" + neg + "".join(parts) + "]"
