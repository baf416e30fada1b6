"""Nothing runs away: the compile time limit, bounded repetition counts, the empty language of "" (issue 16).

Every test here is bounded in time by construction: the inputs that used to run for minutes (a 31-character
regex, ``a{100000}``, ``minLength: 100000``) must now be refused or compiled within seconds.
"""

from __future__ import annotations

import itertools
import random
import re
import time

import numpy as np
import pytest
from test_automaton_scaling import ARITH_BOUNDED

from specjax.grammar import GrammarError, GrammarOptions, compile_grammar
from specjax.grammar.json_schema import SchemaError, json_schema_to_lark
from specjax.grammar.regex import RegexError, regex_to_lark
from specjax.grammar.sample import LarkSampler


class Tok:
    """Every printable ASCII byte is a token; ids 0 and 1 are special / EOS."""

    eos_ids = (1,)

    def token_bytes(self) -> list[bytes]:
        return [b"", b""] + [bytes([b]) for b in range(32, 127)]


def compile_(text: str, **options):
    return compile_grammar(text, Tok(), GrammarOptions(cache=False, **options))


def accepts(tables, text: str) -> bool:
    trans, state = np.asarray(tables.trans_sb), tables.initial_state
    for b in text.encode():
        state = int(trans[state, b])
    return bool(np.asarray(tables.accept_s)[state])


def allowed_ids(tables, state: int) -> list[int]:
    row = np.asarray(tables.mask_rw)[int(np.asarray(tables.row_s)[state])]
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:tables.vocab_size]
    return np.nonzero(bits)[0].tolist()


@pytest.mark.parametrize("text", [regex_to_lark(""), regex_to_lark("x{0}"), regex_to_lark("(?:){3}"), "start:\n"])
def test_the_empty_string_is_a_language_whose_output_is_just_eos(text):
    tables = compile_(text)
    assert accepts(tables, "") and not accepts(tables, "x")
    assert allowed_ids(tables, tables.initial_state) == [1]  # EOS only


def test_nested_counted_regex_compiles_in_seconds_and_exactly():
    pattern = "(((a{1,2}b?){1,2}c?){1,2}d?){2}"  # 106 s in lark's loader before (~10 M alternatives)
    t0 = time.perf_counter()
    text = regex_to_lark(pattern)
    LarkSampler(text)  # lark's loader expands the grammar: linear now
    tables = compile_(text)
    assert time.perf_counter() - t0 < 20
    for n in range(11):  # every string over the pattern's letters up to 10 characters: 1.4 M; sample them
        strings = ["".join(s) for s in itertools.islice(itertools.product("abcd", repeat=n), 3000)]
        for s in strings:
            assert accepts(tables, s) == bool(re.fullmatch(pattern, s)), s
    rng = random.Random(0)
    sampler = LarkSampler(text)
    for _ in range(200):
        s = sampler.sample(rng)
        assert re.fullmatch(pattern, s) and accepts(tables, s), s


def test_long_count_ranges_are_chains_not_quadratic_alternatives():
    text = regex_to_lark("(ab|c){2,900}")
    assert len(text) < 40_000  # lark's own a~2..900 would be 405,000 copies of the group
    tables = compile_(text, timeout=60)
    assert accepts(tables, "abc" * 300) and not accepts(tables, "c" * 901) and not accepts(tables, "c")


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda: regex_to_lark("a{100000}"), RegexError, "100,000 character positions"),
    (lambda: regex_to_lark("(x(ab){3000}){2}"), RegexError, "12,002 character positions"),
    (lambda: compile_("start: A\nA: /a{100000}/\n"), GrammarError, "terminal A"),
    (lambda: compile_("start: A\nA: /(?:(?:a{10}b){400}|c)/\n"), GrammarError, "counts inside groups"),
    (lambda: json_schema_to_lark({"type": "string", "minLength": 100000}), SchemaError, "'minLength' at #"),
    (lambda: json_schema_to_lark({"type": "object", "properties": {"s": {"type": "string", "maxLength": 65535}}}),
     SchemaError, "'maxLength' at #/properties/s"),
    (lambda: json_schema_to_lark({"type": "array", "minItems": 20000}), SchemaError, "'minItems' at #"),
])
def test_huge_counts_are_refused_at_once(make, error, message):
    t0 = time.perf_counter()
    with pytest.raises(error, match=re.escape(message)):
        make()
    assert time.perf_counter() - t0 < 5


def test_large_max_length_under_a_pattern_that_bounds_it_still_compiles():
    text = json_schema_to_lark({"type": "string", "maxLength": 65535, "pattern": "^[a-z]{2}$"})
    tables = compile_(text)
    assert accepts(tables, '"ab"') and not accepts(tables, '"abc"')


# Bounded repetition in every nesting level: ~113,000 states at max_depth=3 (~30 s of CPU).
ARITH = ARITH_BOUNDED


def test_time_limit_stops_a_long_compile_with_one_message():
    t0 = time.thread_time()
    with pytest.raises(GrammarError, match=r"time limit of 0\.5 s of CPU time \(stopped in the automaton phase"):
        compile_(ARITH, max_depth=3, timeout=0.5)
    assert time.thread_time() - t0 < 5
    with pytest.raises(GrammarError, match="grammar_timeout"):
        compile_(ARITH, max_depth=3, timeout=0.5)


@pytest.mark.parametrize("bad", [0, -1, "3", float("nan")])
def test_time_limit_must_be_positive(bad):
    with pytest.raises(GrammarError, match="timeout"):
        GrammarOptions(timeout=bad)


def test_time_limit_is_not_part_of_the_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    a = compile_grammar('start: "a"+\n', Tok(), GrammarOptions(timeout=5))
    files = sorted(tmp_path.rglob("*.npz"))
    b = compile_grammar('start: "a"+\n', Tok(), GrammarOptions(timeout=None))
    assert len(files) == 1 and sorted(tmp_path.rglob("*.npz")) == files
    assert np.array_equal(np.asarray(a.trans_sb), np.asarray(b.trans_sb))


IGNORED = 'start: "a" ("," "a")*\n%ignore /[ \\n]+/\n%ignore /#[^\\n]*/\n'


def test_ignored_text_is_bounded_per_lexeme_and_per_gap():
    tables = compile_(IGNORED, max_ignore=4, leading_ignore=True)
    assert accepts(tables, "a , a") and accepts(tables, "a #xyz\n,a") and accepts(tables, " " * 12 + "a")
    assert not accepts(tables, " " * 13 + "a")  # three whitespace lexemes of at most 4 bytes
    assert not accepts(tables, "a #x #y\n,a")  # a 5-byte comment
    assert not accepts(tables, "a" + " " * 13)  # at the end too
    unbounded = compile_(IGNORED, max_ignore=None, leading_ignore=True)
    assert accepts(unbounded, " " * 100 + "a #x #y\n,a")


def test_bound_stops_a_whitespace_loop():
    tables = compile_(IGNORED, max_ignore=16)
    trans, state = np.asarray(tables.trans_sb), tables.initial_state
    for b in b"a,a":
        state = int(trans[state, b])
    steps = 0
    while state and steps < 1000:  # a model that only ever wants a space
        state, steps = int(trans[state, ord(" ")]), steps + 1
    assert steps == 3 * 16 + 1  # 48 spaces, then the space token is masked out (dead state)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_max_ignore_must_be_positive(bad):
    with pytest.raises(GrammarError, match="max_ignore"):
        GrammarOptions(max_ignore=bad)


def test_no_leading_ignored_text_by_default():
    """llguidance's semantics: a model cannot open its output with whitespace it loops on (as the real-model
    SQL test did for 96 tokens); between and after terminals it stays allowed."""
    tables = compile_(IGNORED)
    assert accepts(tables, "a , a") and not accepts(tables, " a") and accepts(tables, "a ")
    assert allowed_ids(tables, tables.initial_state) == [ord("a") - 30]  # token id = byte - 32 + 2
    lark_like = compile_(IGNORED, leading_ignore=True)
    assert accepts(lark_like, " a ") and accepts(lark_like, "a , a")


def test_first_compile_skips_larks_meta_grammar_collision_check():
    # lark's check of its own meta-grammar's terminals cost 0.25 s of every process's first compile; with it
    # made to fail, a fresh process must still load a grammar (and leave lark's flag as it found it).
    import subprocess
    import sys

    code = ("import lark.lexer\n"
            "def boom(*a, **k): raise AssertionError('collision check ran')\n"
            "lark.lexer._check_regex_collisions = boom\n"
            "from specjax.grammar.frontend import load_lark\n"
            "load_lark('start: \"a\" B\\nB: /b+/\\n')\n"
            "assert lark.lexer.has_interegular\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
