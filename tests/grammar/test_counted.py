"""Large counted repetitions (JSON strings with maxLength) are built without interegular's copies."""

from __future__ import annotations

from collections import deque

import pytest

from specjax.grammar import _counted
from specjax.grammar.automaton import build_automaton
from specjax.grammar.frontend import load_lark
from specjax.grammar.json_schema import json_schema_to_lark
from specjax.grammar.terminals import ByteDFA, regex_dfa

JSON_CHAR = r'(?:[^\x00-\x1f\x22\\]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f]))'


def first_difference(a: ByteDFA, b: ByteDFA) -> bytes | None:
    """The shortest string on which two byte DFAs disagree, or None (product breadth-first search)."""
    seen, todo = {(0, 0)}, deque([(0, 0, b"")])
    while todo:
        x, y, text = todo.popleft()
        if (x >= 0 and a.accept[x]) != (y >= 0 and b.accept[y]):
            return text
        for c in range(256):
            nxt = (int(a.trans[x, c]) if x >= 0 else -1, int(b.trans[y, c]) if y >= 0 else -1)
            if nxt != (-1, -1) and nxt not in seen:
                seen.add(nxt)
                todo.append((*nxt, text + bytes([c])))
    return None


@pytest.mark.parametrize("regex", [rf"\x22{JSON_CHAR}{{0,30}}\x22", r"[a-zé]{3,30}x", r"ab{0,30}c",
                                   r"(?:a(?:b){2}){0,25}", r"\d{2,30}", r"(?:ab?){0,26}b", r"x?(?:a|ab){1,25}(?:b)?"])
def test_counted_construction_equals_interegular(regex, monkeypatch):
    assert _counted.split_counted(regex) is not None
    ours = regex_dfa(regex)
    monkeypatch.setattr(_counted, "MIN_COUNT", 10**9)  # interegular's own construction
    assert first_difference(ours, regex_dfa(regex)) is None


@pytest.mark.parametrize("regex", [r"a|b{0,50}", r"(?i:a){0,50}", r"a{0,5}", r"(?:a{0,50})", r"a{30,}"])
def test_regexes_whose_meaning_splitting_could_change_are_left_whole(regex):
    assert _counted.split_counted(regex) is None


def test_max_length_string_is_linear_in_the_bound():
    # maxLength 200: the string terminal has one state per (length, escape position) and the grammar
    # automaton a few per length; before, interegular's 200 product constructions took minutes.
    lark_text = json_schema_to_lark({"type": "object", "properties": {"a": {"type": "string", "maxLength": 200}},
                                     "required": ["a"]})
    cfg = load_lark(lark_text)
    sizes = sorted(len(t.accept) for t in cfg.terminals)
    assert 200 * 5 < sizes[-1] < 200 * 20
    auto = build_automaton(cfg, max_depth=2, max_states=100_000)
    assert len(auto.accept_s) < 200 * 20
