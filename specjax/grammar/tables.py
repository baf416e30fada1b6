"""A byte DFA + a vocabulary → device tables: packed token masks per state and the byte transition table.

The mask of state ``s`` has bit ``v`` set iff walking token ``v``'s bytes from ``s`` never reaches the dead
state (the automaton is trimmed, so "not dead" means "can still be completed"). Computing it for 262,144
tokens from every state is made cheap five ways:

* **rows, not states**: two states need the same row iff they agree on "alive after each byte string of
  length ≤ the longest token" and on acceptance (for EOS) — a bounded Moore refinement finds these
  classes, and only one representative per class is walked;
* **byte classes**: bytes that act alike in every state are one symbol, so tokens with equal class
  strings are one column (found by folding the vocabulary's byte trie, built once, see ``_vocab_trie``);
* **a trie**: the unique class strings are walked level by level from chunks of representatives, carrying
  only the live (representative, trie node) pairs: from most states most tokens die within a byte or two, so
  this is a few percent of the dense [representatives, trie nodes] walk;
* **no walk where the answer is known** (``_bodies``): inside a JSON string a token that never leaves the
  string (its self-loops, UTF-8 and escape helpers) is alive whatever the context, and in a ``maxLength``
  chain a token of string characters is alive iff it fits; only the other strings are walked per state;
* **rows in token space**: each distinct row is built from its group's base and its walked strings' tokens
  (or, when sparse, from its alive strings' tokens alone), not by a gather over all V columns.
"""

from __future__ import annotations

import numpy as np

from specjax.grammar import _deadline
from specjax.grammar._bodies import Group, loop_groups
from specjax.grammar._dfa import byte_classes, row_ids
from specjax.grammar._vocab_trie import ByteTrie, ClassTrie, ranges
from specjax.grammar.automaton import DEAD, ByteAutomaton

__all__ = ["Vocabulary", "mask_rows", "pack_bits"]

_CHUNK = 256  # representatives walked at once (bounds the live-pair arrays and the [chunk, U] block)


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
    trans = auto.trans_sb
    cls_b, n_cls = byte_classes(trans)
    first = np.unique(cls_b, return_index=True)[1]
    trans_sc = trans[:, first]
    state_class = _bounded_classes(trans_sc, auto.accept_s, vocab.max_len)
    reps = np.unique(state_class, return_index=True)[1]
    trie, tok_string = ClassTrie.fold(vocab.trie, cls_b, n_cls)
    rows = _TokenRows(vocab, tok_string, trie.n_strings)
    row_of_rep = np.zeros(len(reps), np.int64)
    for g in loop_groups(trans_sc, reps, trie, vocab.max_len):
        group = rows.group(g)
        for lo in range(0, len(g.members), _CHUNK):
            _deadline.check()
            chunk = g.members[lo:lo + _CHUNK]
            alive = np.zeros((len(chunk), len(g.walk) + 1), bool)  # + acceptance, for EOS (no copy to append it)
            alive[:, -1] = auto.accept_s[reps[chunk]]
            g.trie.walk(trans_sc, reps[chunk], alive)
            packed = np.packbits(alive, axis=1)
            if g.run_m is not None:  # a run's bound is part of the row
                packed = np.concatenate([packed, g.run_m[lo:lo + _CHUNK, None].astype(">u2").view(np.uint8)], 1)
            keys, first, inverse = np.unique(packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1),
                                              return_index=True, return_inverse=True)
            ids = [group.row(key.tobytes(), alive[first[k]], None if g.run_m is None else g.run_m[lo + first[k]])
                   for k, key in enumerate(keys)]  # one Python step per distinct row, not per state
            row_of_rep[chunk] = np.asarray(ids, np.int64)[inverse.reshape(-1)]
    return rows.stack(), row_of_rep[state_class].astype(np.int32)


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

    def row(self, key: bytes, bits: np.ndarray, run_m: int | None = None) -> int:
        """The row id for ``bits`` (bool [len(sub) + 1], the last one acceptance) and a run member's bound;
        ``key`` identifies both."""
        j = self.memo.get(key)
        if j is None:
            alive = np.nonzero(bits[:-1])[0]
            if self.empty_base and len(alive) * 8 < len(self.sub_tok):  # sparse: only the alive strings' tokens
                row_v = np.zeros(self.rows.size, bool)
                row_v[self.rows.tokens_of(self.sub[alive])] = True
            else:
                row_v = self.base.copy()
                row_v[self.sub_tok] = bits[self.sub_pos]
            if self.run is not None:
                row_v[self.run[0]] = self.run[1] <= run_m
            row_v[self.rows.eos] = bits[-1]
            j = self.memo[key] = self.rows.add(row_v)
        return j


def _bounded_classes(trans_sc: np.ndarray, accept: np.ndarray, depth: int) -> np.ndarray:
    """States that agree on acceptance and on "alive" after every string of ≤ ``depth`` symbols."""
    part = (np.arange(len(accept)) != DEAD).astype(np.int64)
    count = 2
    for _ in range(depth):
        _deadline.check()
        part = row_ids(np.concatenate([part[:, None], part[trans_sc]], axis=1))
        new = int(part.max()) + 1
        if new == count:
            break
        count = new
    return row_ids(np.stack([part, accept.astype(np.int64)], axis=1))

