"""Grammar-constrained decoding inside the jitted loops: the per-batch grammar pytree and its in-graph steps.

A batch carries one :class:`BatchGrammar`: the (stacked, padded) tables of every grammar its rows use, and
each row's grammar state. The loops call three things per token, all pure and jittable:

* :func:`mask` before sampling: disallowed tokens get logit -inf, so greedy takes the masked argmax and
  sampling draws from the masked, renormalised distribution (top-k / top-p then act on that);
* :func:`step` after a token is emitted: the row's new state, and whether the row is *complete* — its
  state allows EOS and nothing else, so the only continuation is to stop (the row finishes there);
* :func:`draft_states` in speculative rounds: the state each draft position (chain) or tree node reaches
  from the row's state, so verification can mask the target's logits at every position;
* :func:`close` / :func:`close_block` (when the batch closes its sentences, the default): a token that
  would leave the row unable to finish within ``max_new_tokens`` is replaced by the first token of the
  state's shortest completion (`specjax.grammar.closing`), so a constrained row ends complete, never cut.
  The check runs on the token already chosen, so before the budget binds nothing changes; greedy
  speculation stays identical to plain decoding, and sampling keeps its law (the replacement is a fixed
  function of the state, the token and the tokens left, applied to what plain decoding would emit).

Compiling a new program per grammar would cost seconds per schema, so :func:`prepare` pads the tables
to power-of-two sizes and clears their static metadata: grammars of similar size share one program.

**Digit runs** (`grammar.digit_guard`; a grammar with a digit bound, JSON Schema's ``max_digits``): a row's
state then also counts the digit-only tokens it emitted in a row, in the high bits of the same int32
(``state | run << 24``; a dead state is 0 whatever the count), so the loops carry nothing new. Once the count
reaches the bound, a digit-loop state masks digit-only tokens and the row leaves the run. Every function here
takes and returns that packed form; without a bound the packed form is the plain state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.decode.shapes import bucket
from specjax.grammar.closing import UNREACHABLE, byte_tokens, closing_tables
from specjax.grammar.digit_guard import digit_loop_states, digit_tokens
from specjax.grammar.runtime import GrammarTables, advance, allowed_words, stack_grammars, unpack_words
from specjax.grammar.tables import pack_bits

__all__ = ["BatchGrammar", "MAX_DIGIT_BOUND", "close", "close_block", "closing_of", "digit_loops_of",
           "draft_states", "mask", "prepare", "step", "vocab_byte_tokens", "vocab_digit_tokens"]


@struct.dataclass
class BatchGrammar:
    """The grammars of one batch (a program argument; the loops carry `state_b` forward themselves).

    Attributes:
      tables: stacked, padded tables (state 0 dead; padding states are dead too).
      complete_s: bool [S] the state accepts and allows no text token: only EOS may follow.
      state_b: int32 [B] each row's state before its first generated token (0 for padding rows).
      dist_s, close_s: int32 [S] single-byte tokens to the nearest accepting state and the token starting
        that way (`grammar.closing`), or None when rows are not closed within the budget.
      bound_s: int32 [S] the digit bound of each digit-loop state (0 elsewhere), or None when no grammar of
        the batch bounds digit runs (states are then plain, see the module docstring).
      digit_w: uint32 [ceil(V/32)] the digit-only tokens, packed as the masks; digit_v: bool [V] the same.
    """

    tables: GrammarTables
    complete_s: jax.Array
    state_b: jax.Array
    dist_s: jax.Array | None = None
    close_s: jax.Array | None = None
    bound_s: jax.Array | None = None
    digit_w: jax.Array | None = None
    digit_v: jax.Array | None = None


_RUN_SHIFT = 24  # state | run << 24: states below 2**24 (a [S, 256] int32 table of 16 GiB)
MAX_DIGIT_BOUND = 127  # run counts saturate here (the sign bit stays clear), so bounds are at most this


def _state(grammar: BatchGrammar, gram_b: jax.Array) -> jax.Array:
    """The DFA state of packed row states."""
    return gram_b if grammar.bound_s is None else gram_b & ((1 << _RUN_SHIFT) - 1)


def _advance(grammar: BatchGrammar, gram_b: jax.Array, tok_b: jax.Array) -> jax.Array:
    """Packed states after each row emits its token (the run grows on a digit-only token, else restarts)."""
    new_b = advance(grammar.tables, _state(grammar, gram_b), tok_b)
    if grammar.bound_s is None:
        return new_b
    run_b = jnp.where(grammar.digit_v[tok_b], jnp.minimum((gram_b >> _RUN_SHIFT) + 1, MAX_DIGIT_BOUND), 0)
    return jnp.where(new_b == 0, 0, new_b | (run_b << _RUN_SHIFT))


def _allowed(grammar: BatchGrammar, gram_b: jax.Array) -> jax.Array:
    """bool [B, V]: the tokens each packed row state allows (digit-only ones masked at a run's bound)."""
    state_b = _state(grammar, gram_b)
    words_bw = allowed_words(grammar.tables, state_b)
    if grammar.bound_s is not None:
        bound_b = grammar.bound_s[state_b]
        stop_b = (bound_b > 0) & ((gram_b >> _RUN_SHIFT) >= bound_b)
        words_bw = jnp.where(stop_b[:, None], words_bw & ~grammar.digit_w[None, :], words_bw)
    return unpack_words(words_bw, grammar.tables.vocab_size)


def _complete_states(tables: GrammarTables) -> np.ndarray:
    """bool [S]: accepting states whose mask row has no text token (EOS is then the only choice)."""
    text_v = np.asarray(tables.kind_v) == 0
    words = -(-tables.vocab_size // 32)
    text_w = np.zeros(words * 32, bool)
    text_w[:tables.vocab_size] = text_v
    text_words = np.packbits(text_w, bitorder="little").view("<u4")
    row_has_text_r = np.any(np.asarray(tables.mask_rw) & text_words[None, :], axis=1)
    return np.asarray(tables.accept_s) & ~row_has_text_r[np.asarray(tables.row_s)]


def vocab_byte_tokens(tables: GrammarTables) -> np.ndarray:
    """The vocabulary's single-byte text tokens (`closing.byte_tokens`) from any grammar's tables over it."""
    return byte_tokens(np.asarray(tables.bytes_vl), np.asarray(tables.length_v), np.asarray(tables.kind_v))


def closing_of(tables: GrammarTables, byte_token: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One grammar's closing tables (dist_s, close_s) on the host (`grammar.closing`); `byte_token`
    (`vocab_byte_tokens`) is derived from the tables when not given."""
    if byte_token is None:
        byte_token = vocab_byte_tokens(tables)
    return closing_tables(np.asarray(tables.trans_sb), np.asarray(tables.accept_s), byte_token)


def _stack_closings(closings: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-grammar closing tables laid out as `stack_grammars` lays out states: the shared dead state 0, then
    each grammar's states 1.. in order (close_s holds token ids, which stacking does not shift)."""
    dist = np.concatenate([closings[0][0][:1]] + [d[1:] for d, _ in closings])
    close = np.concatenate([closings[0][1][:1]] + [c[1:] for _, c in closings])
    return dist, close


def vocab_digit_tokens(tables: GrammarTables) -> np.ndarray:
    """bool [V]: the vocabulary's digit-only text tokens (`grammar.digit_guard`) from any grammar's tables over it."""
    return digit_tokens(np.asarray(tables.bytes_vl), np.asarray(tables.length_v), np.asarray(tables.kind_v))


def digit_loops_of(tables: GrammarTables, digit_v: np.ndarray | None = None) -> np.ndarray:
    """One grammar's digit-loop states bool [S] on the host (`grammar.digit_guard`); `digit_v`
    (`vocab_digit_tokens`) is derived from the tables when not given."""
    if digit_v is None:
        digit_v = vocab_digit_tokens(tables)
    return digit_loop_states(np.asarray(tables.trans_sb), np.asarray(tables.mask_rw), np.asarray(tables.row_s),
                             pack_bits(digit_v[None, :])[0])


def _stack_digit_bounds(loops: list[np.ndarray | None], bounds: list[int | None]) -> np.ndarray:
    """The bound of each stacked state int32 [S] (0: none), laid out as `stack_grammars` lays out states: the
    dead state 0, then each grammar's states 1.. (a grammar without a bound contributes zeros)."""
    parts = [np.zeros(1, np.int32)]
    for loop_s, bound in zip(loops, bounds, strict=True):
        if bound is not None and not 1 <= bound <= MAX_DIGIT_BOUND:
            raise ValueError(f"a digit bound must be within 1..{MAX_DIGIT_BOUND}, got {bound}")
        parts.append(np.where(loop_s, bound or 0, 0).astype(np.int32)[1:])
    return np.concatenate(parts)


def prepare(grammars: list[GrammarTables], row_grammar: list[int], batch: int, close: bool = True,
            closings: list[tuple[np.ndarray, np.ndarray]] | None = None,
            digit_bounds: list[int | None] | None = None, digit_loops: list[np.ndarray | None] | None = None,
            digit_v: np.ndarray | None = None) -> BatchGrammar:
    """Stacks the grammars a batch uses and pads them to bucketed sizes.

    Args:
      grammars: compiled tables (same vocabulary).
      row_grammar: for each real row, the index of its grammar in `grammars`.
      batch: rows of the program (rows past len(row_grammar) are padding: dead state).
      close: also carry the closing tables (`close`), so rows end complete within their budget.
      closings: each grammar's closing tables (`closing_of`), computed once by the caller; None computes them.
      digit_bounds: for each grammar, the most digit-only tokens a row may emit in a row where the grammar
        could loop on digits forever (`grammar.digit_guard`), or None for no bound; None: no grammar has one.
      digit_loops, digit_v: each bounded grammar's digit-loop states (`digit_loops_of`; None for the others) and
        the vocabulary's digit-only tokens (`vocab_digit_tokens`), computed once by the caller; None computes them.

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
    dist_s = close_s = None
    if close:
        dist, closer = _stack_closings(closings or [closing_of(g) for g in grammars])
        dist_s = jnp.asarray(np.pad(dist, (0, s_pad), constant_values=UNREACHABLE))
        close_s = jnp.asarray(np.pad(closer, (0, s_pad), constant_values=-1))
    digit = {}
    if digit_bounds is not None and any(b is not None for b in digit_bounds):
        if s + s_pad >= 1 << _RUN_SHIFT:
            raise ValueError(f"digit bounds need fewer than {1 << _RUN_SHIFT:,} states, the batch has {s:,}")
        digit_v = vocab_digit_tokens(grammars[0]) if digit_v is None else digit_v
        given = digit_loops or [None] * len(grammars)
        loops = [np.zeros(g.n_states, bool) if b is None else digit_loops_of(g, digit_v) if loop_s is None else loop_s
                 for g, b, loop_s in zip(grammars, digit_bounds, given, strict=True)]
        digit = {"bound_s": jnp.asarray(np.pad(_stack_digit_bounds(loops, digit_bounds), (0, s_pad))),
                 "digit_w": jnp.asarray(pack_bits(digit_v[None, :])[0]), "digit_v": jnp.asarray(digit_v)}
    return BatchGrammar(tables=tables, complete_s=jnp.asarray(complete_s), state_b=jnp.asarray(state_b),
                        dist_s=dist_s, close_s=close_s, **digit)


def mask(grammar: BatchGrammar, state_b: jax.Array, logits_bv: jax.Array) -> jax.Array:
    """Logits [B, V] with the tokens each row's state disallows set to -inf (digit runs bounded where the batch
    bounds them)."""
    return jnp.where(_allowed(grammar, state_b), logits_bv, -jnp.inf)


def mask_block(grammar: BatchGrammar, state_bt: jax.Array, logits_btv: jax.Array) -> jax.Array:
    """Masks every block position [B, T, V] with its own state.

    Dead states (positions after a draft token the grammar refuses: they can never be reached, since
    that token has probability 0) are left unmasked, which keeps their softmax finite.
    """
    b, t, v = logits_btv.shape
    state_n = state_bt.reshape(b * t)
    ok_nv = _allowed(grammar, state_n) | (state_n == 0)[:, None]
    return jnp.where(ok_nv.reshape(b, t, v), logits_btv, -jnp.inf)


def step(grammar: BatchGrammar, state_b: jax.Array, tok_b: jax.Array, active_b: jax.Array):
    """(new state_b, complete_b): active rows advance by their token; complete rows must stop."""
    new_b = jnp.where(active_b, _advance(grammar, state_b, tok_b), state_b)
    return new_b, active_b & grammar.complete_s[_state(grammar, new_b)]


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
        new_b = _advance(grammar, parent_state_b, tokens_bk[:, j])
        states.append(jnp.where(valid_bk[:, j] & (parent_state_b != 0), new_b, 0))
    state_bt = jnp.stack(states, axis=1)
    if parent_bk is None:
        ok_bk = state_bt[:, 1:] != 0
        len_b = jnp.sum(jnp.cumprod(ok_bk.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    return state_bt, len_b


def _late(grammar: BatchGrammar, state_b, tok_b, room_b, eos_ids: tuple[int, ...]):
    """(late_b, forced_b, new_b): whether tok_b leaves a row unable to end within room_b more tokens, the
    token that starts its state's shortest completion instead, and the state tok_b leads to."""
    new_b = _advance(grammar, state_b, tok_b)
    # Tokens the row needs after tok_b: none once only EOS may follow (the row stops there), else the bytes
    # to an accepting state plus the EOS that ends it.
    eos_cost = 1 if eos_ids else 0

    def need(packed_b):
        s_b = _state(grammar, packed_b)
        return jnp.where(grammar.complete_s[s_b], 0, grammar.dist_s[s_b] + eos_cost)

    need_b = need(new_b)
    # Only while the row can still close (by the single-byte bound) counting this token: a budget already
    # short of that is left to the model, whose multi-byte tokens may still fit (forcing single bytes
    # from there on would only cut the row sooner into a worse prefix).
    closable_b = need(state_b) <= room_b + 1
    is_eos = jnp.isin(tok_b, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(tok_b, bool)
    closer_b = grammar.close_s[_state(grammar, state_b)]
    forced_b = jnp.where(closer_b >= 0, closer_b, eos_ids[0] if eos_ids else tok_b)
    late_b = (need_b > room_b) & ~is_eos & closable_b & (forced_b != tok_b)
    return late_b, forced_b, new_b


def close(grammar: BatchGrammar, state_b, tok_b, room_b, eos_ids: tuple[int, ...]):
    """(tok_b with a row's token replaced by its state's closing token where it would not end in time,
    late_b: which rows were replaced).

    Args:
      state_b: each row's state before tok_b; tok_b: the chosen tokens.
      room_b: tokens each row may still emit after tok_b (max_new_tokens - emitted - 1).
      eos_ids: the static EOS ids (the first one ends a row whose sentence is complete).
    """
    if grammar.dist_s is None:
        return tok_b, jnp.zeros_like(tok_b, bool)
    late_b, forced_b, _ = _late(grammar, state_b, tok_b, room_b, eos_ids)
    return jnp.where(late_b, forced_b, tok_b), late_b


def close_block(grammar: BatchGrammar, state_b, tokens_bt, accepted_b, room_b, eos_ids: tuple[int, ...]):
    """A verified round's emission, closed: (tokens_bt, accepted_b) cut at the first late token, and
    late_b (which rows had one).

    Position i <= accepted_b of tokens_bt is what plain decoding would emit as the row's next tokens (the
    accepted draft, then the correction / bonus token). The first of them that `close` would replace
    becomes the round's correction token: it is replaced, and the draft tokens after it are rejected
    (their cache slots are rewritten later, as after any rejection).

    Args:
      state_b: each row's state before the round; room_b: tokens it may emit after the round's first.
    """
    if grammar.dist_s is None:
        return tokens_bt, accepted_b, jnp.zeros_like(accepted_b, bool)
    t = tokens_bt.shape[1]
    cut_b = jnp.full_like(accepted_b, t)
    forced_at_b = tokens_bt[:, 0]
    for i in range(t):
        late_b, forced_b, state_b = _late(grammar, state_b, tokens_bt[:, i], room_b - i, eos_ids)
        first_b = late_b & (i <= accepted_b) & (cut_b == t)
        cut_b = jnp.where(first_b, i, cut_b)
        forced_at_b = jnp.where(first_b, forced_b, forced_at_b)
    hit_b = cut_b < t
    col_bt = jnp.arange(t)[None, :] == cut_b[:, None]
    tokens_bt = jnp.where(col_bt & hit_b[:, None], forced_at_b[:, None], tokens_bt)
    return tokens_bt, jnp.where(hit_b, cut_b, accepted_b).astype(accepted_b.dtype), hit_b
