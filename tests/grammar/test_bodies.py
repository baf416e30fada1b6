"""Local bodies and bounded runs (`grammar._bodies`): the strings mask tables settle without a walk.

`test_mask_tables.py` checks whole tables against a brute-force walk; these tests check that the shortcuts are
taken where they should be (a JSON string's body with its UTF-8 and escape helpers, a ``maxLength`` chain), and
that what they settle agrees with walking the automaton byte by byte.
"""

from __future__ import annotations

import numpy as np

from specjax.grammar import _bodies
from specjax.grammar._bodies import _looping, local_body, loop_groups, strings_in_body
from specjax.grammar._chains import Chains, counted_strings
from specjax.grammar._dfa import byte_classes
from specjax.grammar._vocab_trie import ByteTrie, ClassTrie
from specjax.grammar.automaton import DEAD, build_automaton
from specjax.grammar.frontend import load_lark
from specjax.grammar.json_schema import json_schema_to_lark

PIECES = [b"ab", b"a", b"\"", b"\",", "é".encode(), "日本".encode(), b"\\n", b"\\u00e9x", b"\xc3", b"\xa9",
          b"abcdefghijk", b"\"}", b"x\"", b"\\q", "é\"".encode()]


def _setup(schema):
    auto = build_automaton(load_lark(json_schema_to_lark(schema)), 3, 100_000)
    cls_b, n_cls = byte_classes(auto.trans_sb)
    trans_sc = auto.trans_sb[:, np.unique(cls_b, return_index=True)[1]]
    lengths = np.array([len(p) for p in PIECES])
    bytes_tl = np.zeros((len(PIECES), lengths.max()), np.uint8)
    for i, p in enumerate(PIECES):
        bytes_tl[i, :len(p)] = list(p)
    trie, tok_string = ClassTrie.fold(ByteTrie(bytes_tl, lengths), cls_b, n_cls)
    return auto, trans_sc, trie, tok_string.reshape(-1)


def _alive(trans_sb, state, piece):
    for b in piece:
        state = trans_sb[state, b]
    return state != DEAD


def _state_after(auto, text: bytes) -> int:
    s = 1  # INITIAL
    for b in text:
        s = auto.trans_sb[s, b]
    assert s != DEAD
    return s


def test_a_json_string_body_holds_utf8_and_escapes_and_they_stay_alive():
    auto, trans_sc, trie, tok_string = _setup({"type": "object", "properties": {"a": {"type": "string"}}})
    inside = _state_after(auto, b'{"a":"')
    table = local_body(trans_sc, inside)
    assert len(table) > 1, "no helper states: UTF-8 characters and escapes would be walked from every state"
    stays = strings_in_body(table, trie)
    for i, piece in enumerate(PIECES):
        settled, alive = bool(stays[tok_string[i]]), _alive(auto.trans_sb, inside, piece)
        assert not settled or alive, piece  # settled strings are alive
        if b'"' not in piece:
            assert settled == alive, piece  # and every live piece that stays in the string is settled
    assert stays[tok_string[PIECES.index("日本".encode())]] and stays[tok_string[PIECES.index(b"\\n")]]
    assert not stays[tok_string[PIECES.index(b"\\q")]] and not stays[tok_string[PIECES.index(b'"')]]


def test_a_max_length_chain_counts_characters_not_bytes():
    auto, trans_sc, trie, tok_string = _setup({"type": "object", "properties": {
        "a": {"type": "string", "minLength": 1, "maxLength": 5}}})
    first = _state_after(auto, b'{"a":"')
    assert (trans_sc[first] == first).sum() == 0  # no self-loops: the body shortcut does not apply
    looping = _looping(trans_sc)
    chains = Chains(trans_sc, looping, lambda q: local_body(trans_sc, q).tobytes(), 48, {})
    key, m = chains.bound(first)
    assert m == 5
    assert chains.bound(_state_after(auto, b'{"a":"xy')) == (key, 3)
    assert chains.bound(_state_after(auto, '{"a":"é'.encode())) == (key, 4)  # 2 bytes, 1 character
    table = chains.tables[key]
    assert len(table) > 1, "no helpers: UTF-8 characters and escapes would be walked from every position"
    rows = sorted({row for _, row, _ in chains.helpers.values()})
    starts = counted_strings(table, [0] + rows, trie)
    for at, text in [(0, b'{"a":"'), (0, b'{"a":"ab\\n'), (1, '{"a":"x\xc3'.encode("latin-1"))]:
        state = _state_after(auto, text)
        if at:  # a helper: after the UTF-8 lead byte
            key_h, row, bound = chains.helpers[state]
            assert key_h == key and bound == 5 - 1 - 1  # after "x" and a lead byte: 3 more characters
            counts, limit = starts[1 + rows.index(row)], bound
        else:
            counts, limit = starts[0], chains.bound(state)[1]
        for i, piece in enumerate(PIECES):
            n = counts[tok_string[i]]
            if n >= 0:  # it stays in the step: alive iff it starts few enough characters
                assert _alive(auto.trans_sb, state, piece) == (n <= limit), (text, piece)
    assert starts[0][tok_string[PIECES.index("日本".encode())]] == 2  # 6 bytes, 2 characters
    assert starts[0][tok_string[PIECES.index(b"\\n")]] == 1  # an escape is one character
    assert starts[0][tok_string[PIECES.index(b'"')]] == -1  # the closing quote leaves the step


def test_a_chain_longer_than_the_horizon_is_bounded_at_every_position():
    # Followed from its first state, a chain is cut off after ``horizon`` positions: the states past the cut
    # must still get their own bound, not the first ones' (bounds are memoised, so the order of calls matters).
    auto, trans_sc, _, _ = _setup({"type": "object", "properties": {"a": {"type": "string", "maxLength": 12}}})
    chains = Chains(trans_sc, _looping(trans_sc), lambda q: local_body(trans_sc, q).tobytes(), 5, {})
    states = [_state_after(auto, b'{"a":"' + b"x" * k) for k in range(13)]
    assert [chains.bound(q)[1] for q in states[:12]] == [min(5, 12 - k) for k in range(12)]
    assert chains.bound(states[12]) is None  # the last position starts no character


def test_groups_cover_every_representative_once():
    auto, trans_sc, trie, _ = _setup({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 5}, "b": {"type": "string"}, "c": {"type": "integer"}}})
    reps = np.arange(len(trans_sc))
    groups = list(loop_groups(trans_sc, reps, trie, horizon=48))
    members = np.sort(np.concatenate([g.members for g in groups]))
    assert (members == reps).all()
    for g in groups:  # what a group settles and what it walks never overlap
        assert not g.stays[g.walk].any()
        if g.run_length is not None:
            assert (g.run_length[g.walk] == -1).all()


def test_a_body_of_more_than_255_states_is_grouped():
    # State 1 loops on class 0; each other class leads to its own helper state, which comes back on class 0.
    n_cls = 256
    trans = np.zeros((2 + n_cls - 1, n_cls), np.int64)  # DEAD = 0 everywhere else
    trans[1, 0] = 1
    trans[1, 1:] = np.arange(2, 2 + n_cls - 1)
    trans[2:, 0] = 1
    pieces = [bytes([0]), bytes([5, 0]), bytes([5, 5])]
    lengths = np.array([len(p) for p in pieces])
    bytes_tl = np.zeros((len(pieces), 2), np.uint8)
    for i, p in enumerate(pieces):
        bytes_tl[i, :len(p)] = list(p)
    trie, tok_string = ClassTrie.fold(ByteTrie(bytes_tl, lengths), np.arange(256, dtype=np.int32), n_cls)
    assert len(local_body(trans, 1)) == n_cls  # the state and its 255 helpers
    groups = list(loop_groups(trans, np.arange(len(trans)), trie, horizon=2))
    body = next(g for g in groups if 1 in g.members)
    settled = {pieces[i]: bool(body.stays[tok_string[i]]) for i in range(len(pieces))}
    assert settled == {bytes([0]): True, bytes([5, 0]): True, bytes([5, 5]): False}  # a helper dies on class 5


def test_a_state_that_feeds_a_body_settles_what_enters_it_and_stays(monkeypatch):
    # After '"a' in a string that must not be "ab", every class but 'b' and the quote enters the free string's
    # body (at its state, or at a helper: UTF-8 lead bytes, the backslash): strings that then stay in the body
    # need no walk from that state.
    monkeypatch.setattr(_bodies, "_MIN_SETTLED", 0)  # a feeder group pays here whatever the vocabulary's size
    auto, trans_sc, trie, tok_string = _setup({"type": "object", "properties": {
        "k": {"type": "string", "not": {"enum": ["ab"]}}}})
    state = _state_after(auto, b'{"k":"a')
    assert not (trans_sc[state] == state).any()  # no self-loop: no body of its own
    groups = list(loop_groups(trans_sc, np.arange(len(trans_sc)), trie, horizon=48))
    (g,) = [g for g in groups if state in g.members]
    settled = {PIECES[i] for i in range(len(PIECES)) if g.stays[tok_string[i]]}
    assert {b"a", "é".encode(), "日本".encode(), b"\\n", b"abcdefghijk"} <= settled  # (\\u0062 would make "ab")
    assert not settled & {b"\"", b"\",", b"x\"", b"\"}", b"\\q", "é\"".encode(), b"\xa9"}  # leave the body or die
    for i, piece in enumerate(PIECES):  # what it settles is alive
        if g.stays[tok_string[i]]:
            assert _alive(auto.trans_sb, state, piece), piece
