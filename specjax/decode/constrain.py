"""Grammar-constrained decoding inside the jitted loops: the per-batch grammar pytree and its in-graph steps.

A batch carries one :class:`BatchGrammar`: the (stacked, padded) tables of every grammar its rows use, and
each row's grammar state. The loops call three things per token, all pure and jittable:

* :func:`mask` before sampling: disallowed tokens get logit -inf, so greedy takes the masked argmax and
  sampling draws from the masked, renormalised distribution (top-k / top-p then act on that);
* :func:`step` after a token is emitted: the row's new state, and whether the row is *complete* — its
  state allows EOS and nothing else, so the only continuation is to stop (the row finishes there);
* :func:`draft_states` in speculative rounds: the state each draft position (chain) or tree node reaches
  from the row's state, so verification can mask the target's logits at every position.

Compiling a new program per grammar would cost seconds per schema, so :func:`prepare` pads the tables
to power-of-two sizes and clears their static metadata: grammars of similar size share one program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decode.shapes import bucket
from specjax.grammar.runtime import GrammarTables, advance, allowed, mask_logits, stack_grammars

__all__ = ["BatchGrammar", "draft_states", "mask", "prepare", "step"]


@struct.dataclass
class BatchGrammar:
    """The grammars of one batch (a program argument; the loops carry `state_b` forward themselves).

    Attributes:
      tables: stacked, padded tables (state 0 dead; padding states are dead too).
      complete_s: bool [S] the state accepts and allows no text token: only EOS may follow.
      state_b: int32 [B] each row's state before its first generated token (0 for padding rows).
    """

    tables: GrammarTables
    complete_s: jax.Array
    state_b: jax.Array


def _complete_states(tables: GrammarTables) -> np.ndarray:
    """bool [S]: accepting states whose mask row has no text token (EOS is then the only choice)."""
    text_v = np.asarray(tables.kind_v) == 0
    words = -(-tables.vocab_size // 32)
    text_w = np.zeros(words * 32, bool)
    text_w[:tables.vocab_size] = text_v
    text_words = np.packbits(text_w, bitorder="little").view("<u4")
    row_has_text_r = np.any(np.asarray(tables.mask_rw) & text_words[None, :], axis=1)
    return np.asarray(tables.accept_s) & ~row_has_text_r[np.asarray(tables.row_s)]


def prepare(grammars: list[GrammarTables], row_grammar: list[int], batch: int) -> BatchGrammar:
    """Stacks the grammars a batch uses and pads them to bucketed sizes.

    Args:
      grammars: compiled tables (same vocabulary).
      row_grammar: for each real row, the index of its grammar in `grammars`.
      batch: rows of the program (rows past len(row_grammar) are padding: dead state).

    Returns:
      The batch's grammar argument; equal bucket sizes give equal shapes, hence one compiled program.
    """
    stacked, initial = stack_grammars(grammars) if len(grammars) > 1 else (grammars[0], [grammars[0].initial_state])
    s, r = stacked.n_states, int(stacked.mask_rw.shape[0])
    s_pad, r_pad = bucket(s, 64) - s, bucket(r, 4) - r
    complete_s = np.pad(_complete_states(stacked), (0, s_pad))
    tables = stacked.replace(
        trans_sb=jnp.pad(stacked.trans_sb, ((0, s_pad), (0, 0))),
        accept_s=jnp.pad(stacked.accept_s, (0, s_pad)),
        mask_rw=jnp.pad(stacked.mask_rw, ((0, r_pad), (0, 0))),
        # Padding states are unreachable; they point at row 0 (any valid row).
        row_s=jnp.pad(stacked.row_s, (0, s_pad)),
        initial_state=1, raw_states=0, truncated=False)
    state_b = np.zeros((batch,), np.int32)
    state_b[:len(row_grammar)] = [initial[g] for g in row_grammar]
    return BatchGrammar(tables=tables, complete_s=jnp.asarray(complete_s), state_b=jnp.asarray(state_b))


def mask(grammar: BatchGrammar, state_b: jax.Array, logits_bv: jax.Array) -> jax.Array:
    """Logits [B, V] with the tokens each row's state disallows set to -inf (`runtime.mask_logits`)."""
    return mask_logits(grammar.tables, state_b, logits_bv)


def mask_block(grammar: BatchGrammar, state_bt: jax.Array, logits_btv: jax.Array) -> jax.Array:
    """Masks every block position [B, T, V] with its own state.

    Dead states (positions after a draft token the grammar refuses: they can never be reached, since
    that token has probability 0) are left unmasked, which keeps their softmax finite.
    """
    b, t, v = logits_btv.shape
    state_n = state_bt.reshape(b * t)
    ok_nv = allowed(grammar.tables, state_n) | (state_n == 0)[:, None]
    return jnp.where(ok_nv.reshape(b, t, v), logits_btv, -jnp.inf)


def step(grammar: BatchGrammar, state_b: jax.Array, tok_b: jax.Array, active_b: jax.Array):
    """(new state_b, complete_b): active rows advance by their token; complete rows must stop."""
    new_b = jnp.where(active_b, advance(grammar.tables, state_b, tok_b), state_b)
    return new_b, active_b & grammar.complete_s[new_b]


def draft_states(grammar: BatchGrammar, state_b: jax.Array, tokens_bk: jax.Array, len_b: jax.Array,
                 parent_bk: jax.Array | None):
    """States along a draft and the draft length cut at the first refused token (chains).

    Args:
      state_b: each row's state after its last committed token (the block's row 0).
      tokens_bk, len_b, parent_bk: the draft (`drafters.Draft`); parent_bk None for a chain.

    Returns:
      (state_bt [B, k+1]: row 0 the row's state, row 1 + j the state after node j (0 when node j or an
      ancestor is refused or j >= len_b); len_b: for a chain, cut before its first refused token;
      for a tree unchanged — a refused node has target probability 0 and is never accepted).
    """
    b, k = tokens_bk.shape
    valid_bk = jnp.arange(k)[None, :] < len_b[:, None]
    states = [state_b]
    for j in range(k):
        if parent_bk is None:
            parent_state_b = states[j]
        else:
            parent_j_b = jnp.clip(parent_bk[:, j], -1, j - 1)
            parent_state_b = jnp.take_along_axis(jnp.stack(states, axis=1), (parent_j_b + 1)[:, None], axis=1)[:, 0]
        new_b = advance(grammar.tables, parent_state_b, tokens_bk[:, j])
        states.append(jnp.where(valid_bk[:, j] & (parent_state_b != 0), new_b, 0))
    state_bt = jnp.stack(states, axis=1)
    if parent_bk is None:
        ok_bk = state_bt[:, 1:] != 0
        len_b = jnp.sum(jnp.cumprod(ok_bk.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    return state_bt, len_b
