"""Digit-loop states and digit-only tokens (`grammar.digit_guard`): the host side of the decode loop's bound on
runaway digits. The in-graph side is tested in tests/decode/test_grammar_digits.py."""

import numpy as np

from specjax.grammar.digit_guard import digit_loop_states, digit_tokens
from specjax.grammar.tables import pack_bits

# Tokens: 0 EOS, 1..10 the digits, 11 "12", 12 ",", 13 "a", 14 "1a".
PIECES = [b"", *(bytes([d]) for d in b"0123456789"), b"12", b",", b"a", b"1a"]
KIND = np.array([1] + [0] * (len(PIECES) - 1), np.int8)


def _vocab():
    length = np.array([len(p) for p in PIECES], np.int32)
    bytes_vl = np.zeros((len(PIECES), 2), np.uint8)
    for i, p in enumerate(PIECES):
        bytes_vl[i, :len(p)] = list(p)
    return bytes_vl, length


def test_digit_tokens_are_text_tokens_of_digits_only():
    bytes_vl, length = _vocab()
    assert np.flatnonzero(digit_tokens(bytes_vl, length, KIND)).tolist() == list(range(1, 12))


def test_a_digit_loop_state_loops_on_digits_only_and_can_leave():
    """1: digits loop, "," leaves (a loop state). 2: digits go on to 3 (counted, no loop). 3: digits and "a"
    loop (string-like: never bounded). 4: digits loop but every allowed token is digits only (no way out)."""
    trans = np.zeros((5, 256), np.int32)
    digits = list(b"0123456789")
    trans[1, digits], trans[1, ord(",")] = 1, 2
    trans[2, digits] = 3
    trans[3, digits], trans[3, ord("a")] = 3, 3
    trans[4, digits] = 4
    bytes_vl, length = _vocab()
    digit_v = digit_tokens(bytes_vl, length, KIND)
    allowed = np.zeros((5, len(PIECES)), bool)  # what each state's mask row allows
    allowed[1, [*range(1, 13)]] = True
    allowed[2, [0, *range(1, 12)]] = True
    allowed[3, [*range(1, 12), 13, 14]] = True
    allowed[4, [*range(1, 12)]] = True
    loop = digit_loop_states(trans, pack_bits(allowed), np.arange(5), pack_bits(digit_v[None, :])[0])
    assert loop.tolist() == [False, True, False, False, False]
