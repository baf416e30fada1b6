"""Mask tables (`tables.mask_rows`) against a per-token Python byte walk on random vocabularies.

The table builder skips the walk for strings that only loop on a state (free text inside JSON strings), and
tells rows apart per group of states; a brute force walk of every token from every state checks both.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from specjax.grammar import _bodies, tables
from specjax.grammar.automaton import DEAD, build_automaton
from specjax.grammar.frontend import load_lark
from specjax.grammar.json_schema import json_schema_to_lark
from specjax.grammar.tables import Vocabulary, mask_rows

GRAMMARS = {
    "json object": json_schema_to_lark({"type": "object", "properties": {"a": {"type": "string"},
                                                                         "b": {"type": "integer"}}}),
    "generic json": json_schema_to_lark({"type": "array", "items": {}}),
    "keys and digits": 'start: "{" PAIR ("," PAIR)* "}"\nPAIR: /"[a-z ]*":[0-9]+/\n',
    "whitespace": 'start: "x" /[ \\t]+/ "y" | "x"\n',
    "bounded strings": json_schema_to_lark({"type": "object", "properties": {
        "s": {"type": "string", "minLength": 2, "maxLength": 9}, "t": {"type": "string", "maxLength": 3}}}),
    "hex runs": 'start: /[0-9a-f]{6}-[0-9a-f]{3}/ | "x"\n',
    "strings not listed": json_schema_to_lark({"type": "array", "maxItems": 3, "items": {
        "type": "string", "not": {"enum": ["ab", "xy"]}}}),  # prefix states that feed a string body
    # chains longer than the longest token, of characters of 1-3 bytes and escapes (steps with helpers)
    "long bounded strings": json_schema_to_lark({"type": "array", "maxItems": 2, "items": {
        "type": "string", "minLength": 1, "maxLength": 12}}),
}
ALPHABET = b'{}[]",:abcdfxy 0123456789\\\t-.e'


def _vocab(rng: random.Random, extra: bytes = b"") -> list[bytes]:
    pieces = [b"", b""] + [bytes([c]) for c in ALPHABET + extra]
    while len(pieces) < 400:  # multi-byte tokens: quotes inside, after and around free text
        pieces.append(bytes(rng.choice(ALPHABET + extra) for _ in range(rng.randint(2, 7))))
    pieces += ["é".encode(), "é\"".encode(), b"\xc3", b"\xa9", "aé".encode(), "日本".encode(), "é\\n".encode(),
               "\"éé".encode(), "é日".encode(), b"\xe6", b"\x97\xa5"]
    return list(dict.fromkeys(pieces))


def _brute(trans: np.ndarray, accept: np.ndarray, pieces: list[bytes], eos: int) -> np.ndarray:
    out = np.zeros((len(trans), len(pieces)), bool)
    for s in range(len(trans)):
        for v, piece in enumerate(pieces):
            if v == eos:
                out[s, v] = bool(accept[s]) and s != DEAD
            elif piece:
                q = s
                for b in piece:
                    q = trans[q, b]
                out[s, v] = q != DEAD
    return out


@pytest.mark.parametrize("name", list(GRAMMARS))
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("how", ["default", "every-group-formed", "colliding-hash"])
def test_mask_rows_equal_a_per_token_walk(name, seed, how, monkeypatch):
    if how == "every-group-formed":  # this vocabulary is too small for run and feeder groups to pay: force them
        monkeypatch.setattr(_bodies, "_MIN_SETTLED", 0)
        monkeypatch.setattr(_bodies, "_MIN_CHAIN_STRINGS", 0)
    if how == "colliding-hash":  # every set of alive strings hashes alike: rows must still be told apart exactly
        monkeypatch.setattr(tables, "_set_digest", lambda row, string, n: np.zeros(n, np.int64))
    auto = build_automaton(load_lark(GRAMMARS[name]), 3, 100_000)
    pieces = _vocab(random.Random(seed))
    vocab = Vocabulary(pieces, (1,))
    rows, row_of_state = mask_rows(auto, vocab)
    bits = np.unpackbits(rows.view(np.uint8), axis=1, bitorder="little")[:, : len(pieces)].astype(bool)
    got = bits[row_of_state]
    want = _brute(auto.trans_sb, auto.accept_s, pieces, eos=1)
    assert got.shape == want.shape
    bad = np.argwhere(got != want)
    assert len(bad) == 0, [(int(s), pieces[v], bool(want[s, v])) for s, v in bad[:5]]
    assert len(rows) == len(np.unique(rows, axis=0))  # rows are deduplicated


@pytest.mark.parametrize("seed", range(6))
def test_coreachable_equals_the_fixpoint(seed):
    from specjax.grammar._dfa import coreachable

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    trans = np.where(rng.random((n, 5)) < 0.6, rng.integers(0, n, (n, 5)), -1)
    accept = rng.random(n) < 0.1
    alive = accept.copy()
    while True:  # the definition: alive states, or one step from one
        step = alive | ((trans >= 0) & alive[np.maximum(trans, 0)]).any(axis=1)
        if (step == alive).all():
            break
        alive = step
    assert (coreachable(trans, accept) == alive).all()


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_classes_from_the_construction_equal_classes_over_the_byte_table(name):
    # mask_rows coarsens the subset construction's classes instead of comparing 256 byte columns: the same
    # classes, numbered the same way (by first byte), and the same table over them.
    from specjax.grammar._dfa import byte_classes

    auto = build_automaton(load_lark(GRAMMARS[name]), 3, 100_000)
    want_b, n = byte_classes(auto.trans_sb)
    got_b, got_sc = tables._classes(auto)
    assert (got_b == want_b).all() and got_sc.shape[1] == n
    assert (got_sc == auto.trans_sb[:, np.unique(want_b, return_index=True)[1]]).all()
