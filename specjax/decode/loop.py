"""The on-device generation program: prefill and the token loop in one jitted function.

Everything per token happens inside a `lax.while_loop` over a `DecodeState` pytree:
sample each row's next token from the carried hidden state, check EOS / stop strings /
length, run the token forward. The host sees the program once per batch. The KV cache is
passed in and donated, so XLA updates it in place and the caller reuses the buffer.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax import compile_cache
from specjax.decode import constrain
from specjax.decode import stops as stops_lib
from specjax.decode.backend import BackendProfile, decode_program
from specjax.decode.inputs import BatchInputs
from specjax.decode.sampling import SamplingConfig, sample
from specjax.models.kv_cache import KVCache

# REASON_GRAMMAR: the row's grammar reached a state where only EOS may follow (its sentence is complete).
# REASON_CLOSED: the row ended complete, but only because the token budget closed it (`closed`); it is set
# when the first token is replaced and kept through the EOS / complete sentence that follows.
REASON_LENGTH, REASON_EOS, REASON_STOP, REASON_GRAMMAR, REASON_CLOSED = 0, 1, 2, 3, 4


@struct.dataclass(kw_only=True)
class RowState:
    """What every decode loop carries per row: its output, position, stopping state (what `emit`
    updates) and the loop's key and step count. Row b has produced out_bn[b, :count_b[b]].

    Attributes:
      pos_b: position of the row's next cache write (plain loop) or of its latest token (speculative
        loop, `spec_rounds.SpecState`).
      done_b, reason_b: whether the row has finished and why (REASON_*).
      stop_bn: each row's stop-string matcher states (`stops.py`).
      steps: loop iterations so far (target forwards for the whole batch).
      gram_b: each row's grammar state (constrained decoding), else None.
    """

    cache: KVCache
    out_bn: jax.Array
    pos_b: jax.Array
    count_b: jax.Array
    done_b: jax.Array
    reason_b: jax.Array
    stop_bn: jax.Array
    key: jax.Array
    steps: jax.Array
    gram_b: jax.Array | None = None


@struct.dataclass(kw_only=True)
class DecodeState(RowState):
    """Plain loop carry: hidden_b1d is the final hidden state of each row's latest token (slot
    pos_b - 1), from which the next token is sampled."""

    hidden_b1d: jax.Array


class FirstTokenClock:
    """Host timestamp of the first sampled token, recorded by a one-off debug callback.

    The callback fires once per generate call (first iteration), never per token: under a
    `lax.cond` on the loop counter (CPU profile) or in the first iteration run before the loop
    (accelerators, `backend.py`); it lets us report time to first token for a program that runs
    prefill and decode as one executable.
    """

    def __init__(self) -> None:
        self.t = None

    def mark(self, _) -> None:
        self.t = time.perf_counter()

    @staticmethod
    def enabled() -> bool:
        """Whether programs traced now carry the clock: not while JAX's persistent compilation cache is on,
        which never stores a program with a host callback (`specjax.compile_cache`)."""
        return not compile_cache.active()

    def first_token_time(self, t_call: float, t_end: float) -> float:
        """When the call's first token was sampled; without a clock, the call's start (rates then include
        the prefill)."""
        return self.t or (t_end if self.enabled() else t_call)


CLOCK = FirstTokenClock()


def emit(state: RowState, tok_b, active_b, max_new, eos_ids, stop_tables, grammar=None):
    """Appends one token per active row and updates the stopping conditions.

    With a grammar (`constrain.BatchGrammar`), active rows advance their state `gram_b` by the token,
    and a row whose state then allows only EOS finishes (REASON_GRAMMAR) without spending a step on it.
    """
    b = tok_b.shape[0]
    # Inactive rows aim past the end of the buffer, and mode="drop" discards those writes.
    column_b = jnp.where(active_b, state.count_b, state.out_bn.shape[1])
    out_bn = state.out_bn.at[jnp.arange(b), column_b].set(tok_b, mode="drop")
    count_b = state.count_b + active_b.astype(jnp.int32)
    is_eos = jnp.isin(tok_b, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(active_b)
    closing_b = state.reason_b == REASON_CLOSED  # an EOS or a complete sentence then ends it as closed
    reason_b = jnp.where(active_b & is_eos & ~closing_b, REASON_EOS, state.reason_b)
    stop_bn = state.stop_bn
    hit_b = jnp.zeros_like(active_b)
    if stop_tables is not None:
        new_stop_bn, hit_b = stops_lib.advance(stop_tables, state.stop_bn, tok_b)
        stop_bn = jnp.where(active_b[:, None], new_stop_bn, state.stop_bn)
        reason_b = jnp.where(active_b & hit_b & ~is_eos, REASON_STOP, reason_b)
    complete_b = jnp.zeros_like(active_b)
    if grammar is not None:
        gram_b, complete_b = constrain.step(grammar, state.gram_b, tok_b, active_b)
        complete_b = complete_b & ~is_eos & ~hit_b
        reason_b = jnp.where(complete_b & ~closing_b, REASON_GRAMMAR, reason_b)
        state = state.replace(gram_b=gram_b)
    ended_b = is_eos | hit_b | complete_b
    reason_b = jnp.where(active_b & ~ended_b & (count_b >= max_new), REASON_LENGTH, reason_b)
    done_b = state.done_b | (active_b & (ended_b | (count_b >= max_new)))
    return state.replace(out_bn=out_bn, count_b=count_b, done_b=done_b, reason_b=reason_b, stop_bn=stop_bn)


def closed(state: RowState, tok_b, max_new, eos_ids, grammar):
    """(state, tok_b) with tok_b closed within the budget when the batch has a grammar that closes
    (`constrain.close`); a row whose token was replaced is marked REASON_CLOSED."""
    if grammar is None:
        return state, tok_b
    tok_b, late_b = constrain.close(grammar, state.gram_b, tok_b, max_new - state.count_b - 1, eos_ids)
    return mark_closed(state, late_b), tok_b


def mark_closed(state: RowState, late_b) -> RowState:
    """Rows with late_b (a token replaced by `constrain.close`) will end as REASON_CLOSED."""
    return state.replace(reason_b=jnp.where(late_b & ~state.done_b, REASON_CLOSED, state.reason_b))


def next_tokens(model, hidden_b1d, live, key, sampling, temperature, top_p, grammar=None, gram_b=None):
    """One token per row from the final hidden states [B, 1, D] (masked by the grammar if any).

    Greedy without a grammar asks the model for its argmax only, which for a few rows on CPU
    never builds the [B, 262144] logits (`Transformer.greedy_tokens`).
    """
    if sampling.greedy and grammar is None:
        return model.greedy_tokens(hidden_b1d, live)[:, 0]
    logits_bv = model.logits(hidden_b1d, live=live)[:, 0]
    if grammar is not None:
        logits_bv = constrain.mask(grammar, gram_b, logits_bv)
    return sample(logits_bv, key, sampling, temperature, top_p)


def prefill_chunk(t: int, max_chunk: int) -> int:
    """Tokens per prefill block for a prompt bucket of t: t itself up to max_chunk, else the largest
    power of two dividing t, at most max_chunk (prompt buckets are 2^k or 3 * 2^k, `shapes.py`)."""
    return t if t <= max_chunk else min(max_chunk, t & -t)


def prefill(model, cache: KVCache, prompt_bt: jax.Array, len_b: jax.Array, max_chunk: int | None = None,
            taps: tuple[int, ...] = ()):
    """Runs right-padded prompts [B, T] through the model from slot 0.

    A long prompt is run in blocks of `prefill_chunk(T, max_chunk)` tokens (a `lax.scan`), each
    attending to the cache the earlier blocks wrote: attention scores are [B, heads, block, slots]
    instead of [B, heads, T, slots], so an 8k-token prompt at batch 4 needs ~0.3 GB per layer for
    them, not ~4.3 GB (which ran a 24 GB machine out of memory).

    Returns:
      (final hidden states [B, T, D], each row's at its last prompt token [B, 1, D], the cache, and the
      outputs of the blocks in `taps` [B, T, len(taps)·D] or None without taps: `Transformer.forward`).
    """
    b, t = prompt_bt.shape
    c = prefill_chunk(t, max_chunk or t)
    if c == t:
        positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        hidden_btd, cache, taps_btx = model.forward(prompt_bt, positions_bt, cache, jnp.zeros((b,), jnp.int32),
                                                    taps=taps)
    else:
        def block(cache, start):
            tokens_bc = jax.lax.dynamic_slice_in_dim(prompt_bt, start, c, axis=1)
            positions_bc = jnp.broadcast_to(start + jnp.arange(c, dtype=jnp.int32), (b, c))
            start_b = jnp.full((b,), start, jnp.int32)
            hidden_bcd, cache, taps_bcx = model.forward(tokens_bc, positions_bc, cache, start_b, taps=taps)
            return cache, (hidden_bcd, taps_bcx)

        cache, chunks = jax.lax.scan(block, cache, jnp.arange(0, t, c, dtype=jnp.int32))
        hidden_btd, taps_btx = (None if x is None else jnp.swapaxes(x, 0, 1).reshape(b, t, -1) for x in chunks)
    last_b1d = jnp.take_along_axis(hidden_btd, (len_b - 1)[:, None, None], axis=1)
    return hidden_btd, last_b1d, cache, taps_btx


@decode_program("graphdef", "sampling", "n_out", "eos_ids")
def generate_program(
    graphdef,
    params,
    cache: KVCache,
    inputs: BatchInputs,
    *,
    sampling: SamplingConfig,
    n_out: int,
    eos_ids: tuple[int, ...],
    profile: BackendProfile,
):
    """Prefills right-padded prompts and generates until every row is done.

    Args:
      graphdef, params: the split model (`nnx.split`); params are traced, not baked in.
      cache: KV cache with at least T + n_out slots (donated).
      inputs: the batch (`inputs.BatchInputs`: prompts, limits, sampling values, stop strings, grammars).
      sampling: the static token selection (temperature / top_p values are traced in `inputs`).
      n_out: output buffer length (static); eos_ids: ids that end a row (static).
      profile: the backend's `BackendProfile` (static; calls default it to `backend.profile_for()`).

    Returns:
      (DecodeState after the loop, its cache being the donated buffer updated in place).
    """
    model = nnx.merge(graphdef, params)
    prompt_bt, len_b, active_b, max_new = inputs.prompt_bt, inputs.len_b, inputs.active_b, inputs.max_new
    key, temperature, top_p = inputs.key, inputs.temperature, inputs.top_p
    stop_tables, grammar = inputs.stop_tables, inputs.grammar
    b = prompt_bt.shape[0]
    _, last_hidden_b1d, cache, _ = prefill(model, cache, prompt_bt, len_b, profile.prefill_chunk)

    n_stop = 0 if stop_tables is None else stop_tables.count
    state = DecodeState(
        cache=cache,
        hidden_b1d=last_hidden_b1d,
        out_bn=jnp.zeros((b, n_out), jnp.int32),
        pos_b=len_b.astype(jnp.int32),
        count_b=jnp.zeros((b,), jnp.int32),
        done_b=~active_b,
        reason_b=jnp.full((b,), REASON_LENGTH, jnp.int32),
        stop_bn=jnp.zeros((b, n_stop), jnp.int32),
        key=key,
        steps=jnp.zeros((), jnp.int32),
        gram_b=None if grammar is None else grammar.state_b,
    )

    def cond(s: DecodeState):
        return ~jnp.all(s.done_b)

    def body(s: DecodeState, mark: bool = False) -> DecodeState:
        # Sample from the carried hidden state, then run the new token forward. Carrying
        # hidden (not the token) across iterations keeps the final norm out of the head's
        # fused one-row product (quant.py): a loop boundary is opaque to XLA fusion.
        active_b = ~s.done_b
        key, sub = jax.random.split(s.key)
        tok_b = next_tokens(model, s.hidden_b1d, profile.live(s.steps), sub, sampling, temperature, top_p, grammar,
                            s.gram_b)
        s, tok_b = closed(s, tok_b, max_new, eos_ids, grammar)
        # The callback depends on the tokens (so it fires once they exist) through a scalar: on a
        # mesh the whole [B] array would be gathered to one device (decode/mesh.py).
        if CLOCK.enabled():
            if mark:
                jax.debug.callback(CLOCK.mark, jnp.max(tok_b))
            elif profile.first_token_cond:
                jax.lax.cond(s.steps == 0, lambda: jax.debug.callback(CLOCK.mark, jnp.max(tok_b)), lambda: None)
        s = emit(s.replace(key=key, steps=s.steps + 1), tok_b, active_b, max_new, eos_ids, stop_tables, grammar)
        # One forward after the last token is wasted; skipping it would need a cond around
        # the cache update, which costs more than it saves.
        hidden_b1d, cache = model(tok_b[:, None], s.pos_b[:, None], s.cache, s.pos_b)
        return s.replace(cache=cache, hidden_b1d=hidden_b1d, pos_b=s.pos_b + active_b.astype(jnp.int32))

    if not profile.first_token_cond and CLOCK.enabled():
        state = body(state, mark=True)  # the first token's iteration, peeled off for the clock
    return jax.lax.while_loop(cond, body, state)
