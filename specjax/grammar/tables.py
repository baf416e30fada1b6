"""A byte DFA + a vocabulary → device tables: packed token masks per state and the byte transition table.

The mask of state ``s`` has bit ``v`` set iff walking token ``v``'s bytes from ``s`` never reaches the dead
state (the automaton is trimmed, so "not dead" means "can still be completed"). Computing it for 262,144
tokens from every state is made cheap six ways:

* **rows, not states**: two states need the same row iff they agree on "alive after each byte string of
  length ≤ the longest token" and on acceptance (for EOS) — a bounded Moore refinement finds these
  classes, and only one representative per class is walked;
* **byte classes**: bytes that act alike in every state are one symbol, so tokens with equal class
  strings are one column (found by folding the vocabulary's byte trie, built once, see ``_vocab_trie``);
* **a trie**: the unique class strings are walked level by level from chunks of representatives, carrying
  only the live (representative, trie node) pairs: from most states most tokens die within a byte or two, so
  this is a few percent of the dense [representatives, trie nodes] walk;
* **no walk where the answer is known** (``_bodies``): inside a JSON string a token that never leaves the
  string (its self-loops, UTF-8 and escape helpers) is alive whatever the context, so is one that enters such
  a body from a state just before it and stays there, and in a ``maxLength`` chain a token of string
  characters is alive iff it fits; only the other strings are walked per state;
* **sparse hits**: a walk returns the (state, string) pairs left alive, and states with equal sets are found
  by hashing the sets (checked member by member), not by packing and sorting a dense [states, strings] block
  (which cost more than the walk on automata of 20,000+ states);
* **rows in token space**: each distinct row is built from its group's base and its walked strings' tokens
  (or, when sparse, from its alive strings' tokens alone), not by a gather over all V columns.
"""

from __future__ import annotations

import numpy as np

from specjax.grammar import _deadline
from specjax.grammar._bodies import Group, loop_groups
from specjax.grammar._dfa import byte_classes, refine_rounds, row_ids
from specjax.grammar._vocab_trie import ByteTrie, ClassTrie, ranges
from specjax.grammar.automaton import DEAD, ByteAutomaton

__all__ = ["Vocabulary", "mask_rows", "pack_bits"]

_CHUNK = 64  # representatives walked at once at first, then sized to about _HITS hits a chunk (8 to 8,192)
_HITS = 1 << 21  # hits a chunk aims at: bounds the live-pair and hit arrays (tens of MB)


class Vocabulary:
    """A tokenizer's vocabulary as arrays: bytes per token, and which ids are EOS / special.

    Args:
      token_bytes: the bytes each id adds to the text; ``b""`` marks a special (control) token, which
        never matches text.
      eos_ids: ids allowed exactly where the grammar accepts (they add no text).
    """

    def __init__(self, token_bytes: list[bytes], eos_ids: tuple[int, ...]):
        self.size = len(token_bytes)
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self.length_v = np.array([len(b) for b in token_bytes], np.int32)
        self.max_len = max(1, int(self.length_v.max()))
        flat = np.frombuffer(b"".join(token_bytes), np.uint8)
        self.bytes_vl = np.zeros((self.size, self.max_len), np.uint8)
        rows = np.repeat(np.arange(self.size), self.length_v)
        cols = np.arange(len(flat)) - np.repeat(np.cumsum(self.length_v) - self.length_v, self.length_v)
        self.bytes_vl[rows, cols] = flat
        self.kind_v = np.where(self.length_v > 0, 0, 2).astype(np.int8)  # 0 text, 1 EOS, 2 special
        self.kind_v[list(self.eos_ids)] = 1
        self._token_bytes = token_bytes
        self._trie: ByteTrie | None = None

    @property
    def trie(self) -> ByteTrie:
        """The text tokens' byte trie (built on first use, ~0.3 s for 262,144 tokens, then shared by every grammar)."""
        if self._trie is None:
            text = self.kind_v == 0
            self._trie = ByteTrie(self.bytes_vl[text], self.length_v[text])
        return self._trie


def pack_bits(bits_rv: np.ndarray) -> np.ndarray:
    """bool [R, V] → uint32 [R, ceil(V/32)]; token v is bit (v % 32) of word v // 32."""
    r, v = bits_rv.shape
    if v % 32:
        padded = np.zeros((r, -(-v // 32) * 32), bool)
        padded[:, :v] = bits_rv
        bits_rv = padded
    flat = np.packbits(np.ascontiguousarray(bits_rv).reshape(-1), bitorder="little")  # rows are whole words
    return flat.view("<u4").astype(np.uint32).reshape(r, -1)


def mask_rows(auto: ByteAutomaton, vocab: Vocabulary) -> tuple[np.ndarray, np.ndarray]:
    """Deduplicated packed mask rows uint32 [R, ceil(V/32)] and the row of each state int32 [S]."""
    cls_b, trans_sc = _classes(auto)
    n_cls = trans_sc.shape[1]
    state_class = _bounded_classes(trans_sc, auto.accept_s, vocab.max_len)
    reps = np.unique(state_class, return_index=True)[1]
    trie, tok_string = ClassTrie.fold(vocab.trie, cls_b, n_cls)
    rows = _TokenRows(vocab, tok_string, trie.n_strings)
    row_of_rep = np.zeros(len(reps), np.int64)
    for g in loop_groups(trans_sc, reps, trie, vocab.max_len):
        group = rows.group(g)
        lo, size = 0, _CHUNK
        while lo < len(g.members):
            _deadline.check()
            chunk = g.members[lo:lo + size]
            row, string = g.trie.hits(trans_sc, reps[chunk])
            accept = auto.accept_s[reps[chunk]]
            run_m = None if g.run_m is None else g.run_m[lo:lo + size]
            segments, first, inverse = _distinct_sets(row, string, len(chunk), accept, run_m)
            ids = [group.row(segments[k], bool(accept[i]), None if run_m is None else int(run_m[i]))
                   for k, i in enumerate(first)]  # one Python step per distinct row, not per state
            row_of_rep[chunk] = np.asarray(ids, np.int64)[inverse]
            lo += len(chunk)
            # Chunks where few strings stay alive grow (a walk's cost is then mostly per trie level, not per pair:
            # 29,000 states of one automaton, ~150 hits each); dense ones shrink, bounding the arrays' memory.
            size = int(np.clip(len(chunk) * _HITS // max(len(row), 1), 8, 8192))
    return rows.stack(), row_of_rep[state_class].astype(np.int32)


def _classes(auto: ByteAutomaton) -> tuple[np.ndarray, np.ndarray]:
    """The automaton's byte classes (class per byte, numbered by first byte) and its table over them [S, classes],
    found by coarsening the construction's classes: their table is a few times narrower than the 256 bytes'
    (finding classes over the byte table took 0.5 s of an 80,649-state automaton)."""
    fine_b, fine_sc = auto.classes
    coarse, _ = byte_classes(fine_sc)  # classes of the fine classes, numbered by first fine class
    # The fine classes are numbered by first byte, so the coarse ones are too, as byte_classes numbers them.
    return coarse[fine_b], fine_sc[:, np.unique(coarse, return_index=True)[1]]


def _distinct_sets(row: np.ndarray, string: np.ndarray, n: int, accept: np.ndarray, run_m: np.ndarray | None):
    """Starts that are alike: the same alive strings (``string[row == i]`` for start i), acceptance and bound.

    Returns (the sorted alive strings of each distinct start, its first start, and each start's distinct index).
    Sets are told apart by an order-free 64-bit hash of their members with their sizes, acceptance and bound,
    then checked member by member (a collision falls back to comparing the sets' bytes).
    """
    # Each trie level's hits come sorted by (start, string) and string ids grow level by level, so a stable sort
    # by start alone (a radix sort of small ints) sorts by (start, string).
    order = np.argsort(row.astype(np.int16 if n < 2**15 else np.int64), kind="stable")
    row, string = row[order], string[order]
    count = np.bincount(row, minlength=n)
    start = np.cumsum(count) - count
    bound = np.zeros(n, np.int64) if run_m is None else run_m
    ids = row_ids(np.stack([_set_digest(row, string, n), count, accept.astype(np.int64), bound], 1))
    first = np.unique(ids, return_index=True)[1]
    rep = first[ids]  # each start's representative: equal keys, so equal counts; compare the members in order
    if not (string == string[start[rep][row] + np.arange(len(row)) - start[row]]).all():  # a hash collision
        keys = [_set_key(string[start[i]:start[i] + count[i]], bool(accept[i]), None if run_m is None else
                         int(run_m[i])) for i in range(n)]
        ids = np.unique(np.array(keys, dtype=object), return_inverse=True)[1].reshape(-1)
        first = np.unique(ids, return_index=True)[1]
    segments = [string[start[i]:start[i] + count[i]] for i in first]
    return segments, first, ids.reshape(-1)


def _set_key(alive: np.ndarray, accept: bool, run_m: int | None) -> bytes:
    """The exact identity of a start's row: its alive strings, acceptance and a run member's bound."""
    return alive.tobytes() + bytes([accept]) + (b"" if run_m is None else run_m.to_bytes(8, "little", signed=True))


def _set_digest(row: np.ndarray, string: np.ndarray, n: int) -> np.ndarray:
    """int64 [n]: an order-free hash of each start's alive strings (``row`` sorted): a sum of mixed ids, wrapping."""
    mixed = (string + 1) * np.int64(-7046029254386353131)  # an odd 64-bit constant
    mixed ^= mixed >> 29
    digest = np.zeros(n, np.int64)
    if len(row):
        cut = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        digest[row[cut]] = np.add.reduceat(mixed, cut)
    return digest


class _TokenRows:
    """Packed token rows, deduplicated, built from "alive" bits over a group's class strings (+ acceptance).

    A row is built straight in token space: from the group's base (the strings that stay in the states'
    self-loops) plus the walked strings' tokens, or, for sparse rows (most states allow a few keys or
    punctuation), from only the alive strings' tokens; a dense gather of all V columns is the last resort.
    Building every row as a V-column gather cost ~1 ms per row, most of a small schema's compile.
    """

    def __init__(self, vocab: Vocabulary, tok_string: np.ndarray, n_strings: int):
        self.size, self.eos = vocab.size, np.asarray(vocab.eos_ids, np.int64)
        self.text_ids = np.nonzero(vocab.kind_v == 0)[0]
        self.tok_string = tok_string.reshape(-1)
        order = np.argsort(self.tok_string)  # the tokens of each string, contiguous
        self.tokens_by_string = self.text_ids[order]
        self.string_start = np.searchsorted(self.tok_string[order], np.arange(n_strings + 1))
        self.n_strings = n_strings
        self.index: dict[bytes, int] = {}
        self.packed: list[np.ndarray] = []

    def group(self, g: Group) -> _GroupRows:
        """Row builder for a group: its base (``g.stays``), walked strings and run strings, in token space."""
        position = np.full(self.n_strings, -1, np.int64)
        position[g.walk] = np.arange(len(g.walk))
        pos = position[self.tok_string]
        walked = pos >= 0
        base = np.zeros(self.size, bool)
        base[self.text_ids[~walked]] = g.stays[self.tok_string[~walked]]
        run = None
        if g.run_length is not None:
            length = g.run_length[self.tok_string]
            run = (self.text_ids[length >= 0], length[length >= 0])
        return _GroupRows(self, base, g.walk, self.text_ids[walked], pos[walked], run)

    def add(self, row_v: np.ndarray) -> int:
        """The id of a bool [V] row, appended if new."""
        packed = pack_bits(row_v[None])[0]
        j = self.index.setdefault(packed.tobytes(), len(self.packed))
        if j == len(self.packed):
            self.packed.append(packed)
        return j

    def tokens_of(self, strings: np.ndarray) -> np.ndarray:
        """The token ids of the given strings."""
        lo = self.string_start[strings]
        return self.tokens_by_string[ranges(lo, self.string_start[strings + 1] - lo)]

    def stack(self) -> np.ndarray:
        return np.stack(self.packed)


class _GroupRows:
    """One loop group's rows: a memo from walked bits to row ids, and the group's token base."""

    def __init__(self, rows: _TokenRows, base: np.ndarray, sub: np.ndarray, sub_tok: np.ndarray,
                 sub_pos: np.ndarray, run: tuple[np.ndarray, np.ndarray] | None):
        self.rows, self.base, self.sub, self.sub_tok, self.sub_pos = rows, base, sub, sub_tok, sub_pos
        self.run = run  # (token ids, lengths) of the run strings' tokens
        self.empty_base = not base.any()
        self.memo: dict[bytes, int] = {}

    def row(self, alive: np.ndarray, accept: bool, run_m: int | None = None) -> int:
        """The row id for the walked strings alive (``alive``: sorted positions in the group's walked strings),
        acceptance (for EOS) and a run member's bound."""
        key = _set_key(alive, accept, run_m)
        j = self.memo.get(key)
        if j is None:
            if self.empty_base and len(alive) * 8 < len(self.sub_tok):  # sparse: only the alive strings' tokens
                row_v = np.zeros(self.rows.size, bool)
                row_v[self.rows.tokens_of(self.sub[alive])] = True
            else:
                bits = np.zeros(len(self.sub), bool)
                bits[alive] = True
                row_v = self.base.copy()
                row_v[self.sub_tok] = bits[self.sub_pos]
            if self.run is not None:
                row_v[self.run[0]] = self.run[1] <= run_m
            row_v[self.rows.eos] = accept
            j = self.memo[key] = self.rows.add(row_v)
        return j


def _bounded_classes(trans_sc: np.ndarray, accept: np.ndarray, depth: int) -> np.ndarray:
    """States that agree on acceptance and on "alive" after every string of ≤ ``depth`` symbols."""
    part = refine_rounds((np.arange(len(accept)) != DEAD).astype(np.int64), trans_sc.astype(np.int64), depth, DEAD)
    return row_ids(np.stack([part, accept.astype(np.int64)], axis=1))
