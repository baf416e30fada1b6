"""interegular's crawl with a hash index (`_interegular_crawl`): the same FSMs, bounded by the compile time
limit; the JSON Schema front-end checks the limit too (issue 16)."""

from __future__ import annotations

import json
import time

import interegular
import interegular.fsm as fsm
import pytest

from specjax.grammar import _interegular_crawl
from specjax.grammar._deadline import deadline
from specjax.grammar.errors import GrammarError
from specjax.grammar.json_schema import json_schema_to_lark

PATTERNS = [r"[a-z]+@[a-z]+\.(com|org)", r"(ab|cd)*e?f{2,5}", r"\d{3}-\d{2}", r"(a|b)*abb(a|b){3}",
            "|".join(f"name{i}x" for i in range(40))]


def _shape(machine):
    return (sorted(machine.states), machine.initial, sorted(machine.finals),
            sorted((q, sorted((repr(s), t) for s, t in row.items())) for q, row in machine.map.items()))


def _build(pattern: str):
    m = interegular.parse_pattern(pattern).to_fsm()
    return [_shape(x) for x in (m, m & interegular.parse_pattern("[a-z0-9]*").to_fsm(),
                                m - interegular.parse_pattern("a.*").to_fsm(), m.star())]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_indexed_crawl_builds_the_same_fsms(pattern, monkeypatch):
    _interegular_crawl.install()
    fast = _build(pattern)
    monkeypatch.setattr(fsm, "crawl", _interegular_crawl._original)
    assert _build(pattern) == fast


def test_indexed_crawl_obeys_the_time_limit():
    _interegular_crawl.install()
    # Parsing and the alphabet (interegular's own passes, ~1 s here) come before the crawl and are not timed.
    pattern = interegular.parse_pattern("|".join(f"other{i:04d}" for i in range(3000)))
    alphabet = pattern.get_alphabet(interegular.patterns.REFlags(0))
    t0 = time.thread_time()
    with deadline(0.05), pytest.raises(GrammarError, match="time limit"):
        pattern.to_fsm(alphabet)
    assert time.thread_time() - t0 < 2.0  # the crawl stopped within a fraction of a second of the limit


def test_json_schema_front_end_checks_the_time_limit():
    schema = {"anyOf": [{"type": "object", "properties": {f"p{i}": {"const": i}}, "required": [f"p{i}"]}
                        for i in range(4000)]}
    with deadline(0.05), pytest.raises(GrammarError, match="time limit"):
        json_schema_to_lark(schema)
    from specjax.decode.grammar_spec import GrammarSpec, GrammarSpecError

    with pytest.raises(GrammarSpecError, match="time limit"):
        GrammarSpec("json_schema", json.dumps(schema), timeout=0.05).lark_text()
