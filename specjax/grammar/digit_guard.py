"""Runaway digits: which states may loop on digits forever, and which tokens are digits only.

A JSON Schema integer without bounds is ``-?(0|[1-9][0-9]*)`` in the grammar, and a model may write
``{"_id":12345678901234567890…`` until the token budget runs out (Qwen2.5-Coder did, for 511 tokens). Bounding
the digit run *in the grammar* (``[0-9]{0,20}``) is exact but costs a state per digit wherever a number
appears: on JSONSchemaBench's number-heavy schemas the automaton doubled (Github_hard o12346: 19,786 → 44,652
states) and one schema passed the state limit. The decode loops bound it at run time instead
(`decode/constrain.py`): each row counts the digit-only tokens it emitted in a row, and once the count reaches
the bound, a *digit-loop state* masks digit-only tokens, so the row has to leave the run. The tables do not
change; the loops carry one small counter per row.

A state is a digit-loop state when every digit byte leads back to it or to the dead state, at least one digit
loops, no other byte loops, and its mask row allows some token that is not digits only (EOS included where it
accepts). Then every
digit-only token either stays in the state or is refused, masking them removes only the tokens that keep the
run going, and at least one allowed token is left: a pure narrowing that never strands a row. States where other
bytes loop too (string contents, where every character loops) are not digit-loop states, so free text is never
cut.
"""

from __future__ import annotations

import numpy as np

__all__ = ["digit_loop_states", "digit_tokens"]

_DIGITS = np.arange(ord("0"), ord("9") + 1)
_OTHERS = np.setdiff1d(np.arange(256), _DIGITS)


def digit_tokens(bytes_vl: np.ndarray, length_v: np.ndarray, kind_v: np.ndarray) -> np.ndarray:
    """bool [V]: text tokens made of ASCII digits only."""
    bytes_vl, length_v = np.asarray(bytes_vl), np.asarray(length_v)
    inside = np.arange(bytes_vl.shape[1])[None, :] < length_v[:, None]
    is_digit = (bytes_vl >= ord("0")) & (bytes_vl <= ord("9"))
    return (np.asarray(kind_v) == 0) & (length_v > 0) & np.all(is_digit | ~inside, axis=1)


def digit_loop_states(trans_sb: np.ndarray, mask_rw: np.ndarray, row_s: np.ndarray,
                      digit_w: np.ndarray) -> np.ndarray:
    """bool [S]: the digit-loop states of a grammar's tables (see the module docstring).

    Args:
      trans_sb: int32 [S, 256] byte transitions (state 0 dead).
      mask_rw, row_s: the packed mask rows and each state's row (`GrammarTables`).
      digit_w: uint32 [ceil(V/32)] the digit-only tokens, packed as the mask rows are.
    """
    trans_sb = np.asarray(trans_sb)
    states = np.arange(trans_sb.shape[0])
    digits_sd = trans_sb[:, _DIGITS]
    loops_sd = digits_sd == states[:, None]
    others_loop_s = np.any(trans_sb[:, _OTHERS] == states[:, None], axis=1)
    loop_s = np.all(loops_sd | (digits_sd == 0), axis=1) & np.any(loops_sd, axis=1) & ~others_loop_s & (states != 0)
    candidates = np.flatnonzero(loop_s)
    # Some allowed token is not digits only: the row can always leave the run.
    rows = np.asarray(mask_rw)[np.asarray(row_s)[candidates]]
    loop_s[candidates] = np.any(rows & ~np.asarray(digit_w)[None, :], axis=1)
    return loop_s
