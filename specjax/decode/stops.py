"""Stop strings detected inside the jitted loop.

Each stop string becomes a KMP automaton over bytes; composing it with every token's
bytes gives a table [states, vocab] of next states, precomputed with vectorised numpy.
Inside the loop, advancing a row is one gather per stop string — no detokenisation, no
host round trip — and a match is the accepting state. Matches across token boundaries
and inside multi-byte UTF-8 sequences are found because the automaton runs on bytes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


def _kmp_dfa(pattern: bytes) -> np.ndarray:
    """DFA [len+1, 256]: state = length of the longest pattern prefix that ends the text."""
    n = len(pattern)
    dfa = np.zeros((n + 1, 256), np.int32)
    dfa[0, pattern[0]] = 1
    fallback = 0
    for state in range(1, n + 1):
        dfa[state] = dfa[fallback]
        if state < n:
            dfa[state, pattern[state]] = state + 1
            fallback = dfa[fallback, pattern[state]]
    dfa[n] = n  # absorbing: once matched, stays matched
    return dfa


def _token_byte_matrix(token_bytes: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(b) for b in token_bytes), np.int32, len(token_bytes))
    width = max(int(lengths.max()), 1)
    flat = np.frombuffer(b"".join(b.ljust(width, b"\0") for b in token_bytes), np.uint8)
    return flat.reshape(len(token_bytes), width), lengths


def stop_table(pattern: bytes, byte_matrix_vw: np.ndarray, lengths_v: np.ndarray) -> np.ndarray:
    """Next-state table [len(pattern)+1, V] of the pattern's automaton after each token."""
    dfa = _kmp_dfa(pattern)
    n_states = len(pattern) + 1
    state_sv = np.broadcast_to(np.arange(n_states, dtype=np.int32)[:, None], (n_states, len(lengths_v))).copy()
    for j in range(byte_matrix_vw.shape[1]):
        active_v = lengths_v > j
        if not active_v.any():
            break
        stepped = dfa[state_sv, byte_matrix_vw[None, :, j]]
        state_sv = np.where(active_v[None, :], stepped, state_sv)
    return state_sv


@struct.dataclass
class StopTables:
    """Stacked automata for several stop strings: next_state [n_stop, max_states, V]."""

    next_state: jax.Array
    accept: jax.Array  # [n_stop] accepting state of each automaton

    @property
    def count(self) -> int:
        return self.next_state.shape[0]


def build_stop_tables(stops: tuple[str, ...], token_bytes: list[bytes]) -> StopTables | None:
    """Compiles stop strings against the vocabulary; None when there are none."""
    stops = tuple(s for s in stops if s)
    if not stops:
        return None
    matrix, lengths = _token_byte_matrix(token_bytes)
    tables = [stop_table(s.encode("utf-8"), matrix, lengths) for s in stops]
    depth = max(t.shape[0] for t in tables)
    dtype = np.int8 if depth < 127 else np.int32
    stacked = np.zeros((len(tables), depth, len(token_bytes)), dtype)
    for i, t in enumerate(tables):
        stacked[i, : t.shape[0]] = t
    accept = np.array([t.shape[0] - 1 for t in tables], np.int32)
    return StopTables(next_state=jnp.asarray(stacked), accept=jnp.asarray(accept))


def advance(tables: StopTables, state_bn: jax.Array, tokens_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Advances every row's automata by one token.

    Returns:
      (new state [B, n_stop], matched [B] — any stop string has now occurred).
    """
    n = jnp.arange(tables.count)
    new_bn = tables.next_state[n[None, :], state_bn, tokens_b[:, None]].astype(jnp.int32)
    return new_bn, jnp.any(new_bn == tables.accept[None, :], axis=-1)


def truncate_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """Cuts the text before the earliest stop string (the stop string is not returned)."""
    cut = min((i for s in stops if s and (i := text.find(s)) >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
