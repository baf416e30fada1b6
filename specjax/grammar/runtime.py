"""In-graph grammar functions: pure, jittable, batched (each row has its own state).

**State representation.** A grammar state is one int32 per row: a state of the compiled byte DFA. State 0
is the dead state (nothing is allowed, it never changes); ``tables.initial_state`` is the start. After
:func:`stack_grammars`, states of all grammars live in one table, so a batch can mix grammars: a row's
grammar is just where its state points. The state after an EOS token is the same state (generation is
over; the caller stops the row).

Costs per step and row: the mask is one row gather of ceil(V/32) words plus an unpack to V bits;
advancing walks the batch's longest token's bytes (a dynamic trip count, at most ``bytes_vl.shape[1]``,
48 for Gemma) through the [S, 256] table.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

__all__ = ["GrammarTables", "allowed", "allowed_words", "mask_logits", "advance", "stack_grammars", "unpack_words"]

_UNROLL = 4  # bytes walked per loop trip in `advance` (see `_walk_bytes`)


@flax.struct.dataclass
class GrammarTables:
    """Device tables of one (or several stacked) compiled grammars over one vocabulary.

    Attributes:
      trans_sb: int32 [S, 256] byte transitions; state 0 is dead.
      accept_s: bool [S] the text so far is a complete sentence (EOS allowed).
      mask_rw: uint32 [R, ceil(V/32)] deduplicated allowed-token rows; token v is bit v % 32 of word v // 32.
      row_s: int32 [S] the mask row of each state.
      bytes_vl: uint8 [V, L] each token's bytes (zero-padded); length_v: int32 [V] their count.
      kind_v: int8 [V] 0 text token, 1 EOS, 2 special (never allowed).
      vocab_size: V. initial_state: start state (of the first grammar when stacked).
      raw_states: subset-construction states before minimisation (statistics). truncated: whether the
        nesting bound cut the language.
    """

    trans_sb: jax.Array
    accept_s: jax.Array
    mask_rw: jax.Array
    row_s: jax.Array
    bytes_vl: jax.Array
    length_v: jax.Array
    kind_v: jax.Array
    vocab_size: int = flax.struct.field(pytree_node=False)
    initial_state: int = flax.struct.field(pytree_node=False, default=1)
    raw_states: int = flax.struct.field(pytree_node=False, default=0)
    truncated: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def n_states(self) -> int:
        return int(self.trans_sb.shape[0])

    def nbytes(self) -> int:
        """Device memory of the tables in bytes."""
        arrays = (self.trans_sb, self.accept_s, self.mask_rw, self.row_s, self.bytes_vl, self.length_v, self.kind_v)
        return int(sum(a.size * a.dtype.itemsize for a in arrays))


def allowed_words(tables: GrammarTables, state_b: jax.Array) -> jax.Array:
    """uint32 [B, ceil(V/32)]: each row's packed mask (token v is bit v % 32 of word v // 32)."""
    return tables.mask_rw[tables.row_s[state_b]]


def unpack_words(words_bw: jax.Array, vocab_size: int) -> jax.Array:
    """bool [B, V] from packed masks [B, ceil(V/32)]."""
    bits_bwk = (words_bw[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return bits_bwk.reshape(words_bw.shape[0], -1)[:, :vocab_size].astype(bool)


def allowed(tables: GrammarTables, state_b: jax.Array) -> jax.Array:
    """bool [B, V]: which tokens each row may emit next."""
    return unpack_words(allowed_words(tables, state_b), tables.vocab_size)


def mask_logits(tables: GrammarTables, state_b: jax.Array, logits_bv: jax.Array) -> jax.Array:
    """Sets disallowed tokens' logits to -inf (the dead state disallows every token)."""
    return jnp.where(allowed(tables, state_b), logits_bv, -jnp.inf)


def advance(tables: GrammarTables, state_b: jax.Array, token_b: jax.Array) -> jax.Array:
    """The state after each row emits its token; a disallowed token leads to the dead state 0."""
    bytes_bl = tables.bytes_vl[token_b].astype(jnp.int32)
    length_b = tables.length_v[token_b]
    walked_b = _walk_bytes(tables.trans_sb, state_b, bytes_bl, length_b)
    kind_b = tables.kind_v[token_b]
    eos_b = jnp.where(tables.accept_s[state_b], state_b, 0)
    return jnp.where(kind_b == 0, walked_b, jnp.where(kind_b == 1, eos_b, 0)).astype(jnp.int32)


def _walk_bytes(trans_sb: jax.Array, state_b: jax.Array, bytes_bl: jax.Array, length_b: jax.Array) -> jax.Array:
    """Each row's state after its first ``length_b`` bytes: a loop over the batch's longest token only.

    Most tokens are a few bytes while ``L`` is the vocabulary's longest (48 for Gemma), so the trip count is
    ``ceil(max(length_b) / _UNROLL)``, not ``L``; rows past their own length keep their state. The body
    walks ``_UNROLL`` bytes at once so short tokens take one trip (fewer loop-condition evaluations, which
    matters on backends where a dynamic loop condition is a device-to-host sync).
    """
    pad = -bytes_bl.shape[1] % _UNROLL
    bytes_bl = jnp.pad(bytes_bl, ((0, 0), (0, pad)))  # padding bytes lie past every row's length
    n_bytes = jnp.max(length_b, initial=0)
    # A 1-D take at state * 256 + byte: XLA:CPU runs it several times faster than the [S, 256] 2-D gather
    # for batched rows (int32 is enough: state * 256 < 2^31 while the table is under 8 GB).
    trans_f = trans_sb.reshape(-1)

    def body(carry):
        i, s_b = carry
        for k in range(_UNROLL):
            byte_b = jax.lax.dynamic_index_in_dim(bytes_bl, i + k, axis=1, keepdims=False)
            s_b = jnp.where(i + k < length_b, jnp.take(trans_f, s_b * 256 + byte_b, mode="clip"), s_b)
        return i + _UNROLL, s_b

    return jax.lax.while_loop(lambda carry: carry[0] < n_bytes, body, (jnp.int32(0), state_b))[1]


def stack_grammars(grammars: list[GrammarTables]) -> tuple[GrammarTables, list[int]]:
    """One table holding several grammars (same vocabulary); returns it and each grammar's initial state.

    State ids of grammar k are shifted by the sizes of grammars < k (minus their shared dead state), so a
    row follows its own grammar when started at that grammar's initial state.
    """
    if not grammars:
        raise ValueError("stack_grammars needs at least one grammar")
    if any(g.vocab_size != grammars[0].vocab_size for g in grammars):
        raise ValueError("stacked grammars must be compiled for the same vocabulary")
    trans, accept, rows, row_s, initial = [grammars[0].trans_sb[:1]], [grammars[0].accept_s[:1]], [], [], []
    state_offset, row_offset = 1, 0
    for g in grammars:
        shift = jnp.where(g.trans_sb[1:] == 0, 0, g.trans_sb[1:] + state_offset - 1)
        trans.append(shift)
        accept.append(g.accept_s[1:])
        rows.append(g.mask_rw)
        row_s.append((g.row_s if not row_s else g.row_s[1:]) + row_offset)
        initial.append(g.initial_state + state_offset - 1)
        state_offset += g.n_states - 1
        row_offset += g.mask_rw.shape[0]
    first = grammars[0]
    return first.replace(trans_sb=jnp.concatenate(trans), accept_s=jnp.concatenate(accept),
                         mask_rw=jnp.concatenate(rows), row_s=jnp.concatenate(row_s),
                         initial_state=initial[0], raw_states=sum(g.raw_states for g in grammars),
                         truncated=any(g.truncated for g in grammars)), initial
