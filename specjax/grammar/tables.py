"""A byte DFA + a vocabulary → device tables: packed token masks per state and the byte transition table.

The mask of state ``s`` has bit ``v`` set iff walking token ``v``'s bytes from ``s`` never reaches the dead
state (the automaton is trimmed, so "not dead" means "can still be completed"). Computing it for 262,144
tokens from every state is vectorised three ways:

* **rows, not states**: two states need the same row iff they agree on "alive after each byte string of
  length ≤ the longest token" and on acceptance (for EOS) — a bounded Moore refinement finds these
  classes, and only one representative per class is walked;
* **byte classes**: bytes that act alike in every state are one symbol, so tokens with equal class
  strings are one column;
* **a trie**: the unique class strings are walked level by level ([representatives, trie nodes] numpy
  gathers), sharing every common prefix.
"""

from __future__ import annotations

import numpy as np

from specjax.grammar.automaton import DEAD, ByteAutomaton, byte_classes

__all__ = ["Vocabulary", "mask_rows", "pack_bits"]

_CHUNK = 64  # representatives walked at once (bounds the [chunk, trie level] arrays)


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

    def token_list(self, select_v: np.ndarray) -> list[bytes]:
        """The bytes of the selected ids."""
        return [self._token_bytes[i] for i in np.nonzero(select_v)[0]]


def pack_bits(bits_rv: np.ndarray) -> np.ndarray:
    """bool [R, V] → uint32 [R, ceil(V/32)]; token v is bit (v % 32) of word v // 32."""
    r, v = bits_rv.shape
    padded = np.zeros((r, -(-v // 32) * 32), bool)
    padded[:, :v] = bits_rv
    return np.packbits(padded, axis=1, bitorder="little").view("<u4").astype(np.uint32)


def mask_rows(auto: ByteAutomaton, vocab: Vocabulary) -> tuple[np.ndarray, np.ndarray]:
    """Deduplicated packed mask rows uint32 [R, ceil(V/32)] and the row of each state int32 [S]."""
    trans = auto.trans_sb
    cls_b, n_cls = byte_classes(trans)
    first = np.unique(cls_b, return_index=True)[1]
    trans_sc = trans[:, first]
    state_class = _bounded_classes(trans_sc, auto.accept_s, vocab.max_len)
    reps = np.unique(state_class, return_index=True)[1]
    text = vocab.kind_v == 0
    uniq, tok_string = _class_strings(vocab, cls_b, text)
    levels, ends = _trie(uniq)
    eos = vocab.kind_v == 1
    # Rows are first told apart over the U unique class strings (+ acceptance): far fewer columns than V.
    keys = []
    for lo in range(0, len(reps), _CHUNK):
        chunk = reps[lo:lo + _CHUNK]
        alive_ru = _walk(trans_sc, n_cls, chunk, levels, ends, len(uniq))
        alive_ru = np.concatenate([alive_ru, auto.accept_s[chunk][:, None]], axis=1)
        keys.append(np.packbits(alive_ru, axis=1))
    keys_rk = np.concatenate(keys)
    _, first_rep, row_of_rep = np.unique(keys_rk, axis=0, return_index=True, return_inverse=True)
    bits = np.zeros((len(first_rep), vocab.size), bool)
    alive_uu = np.unpackbits(keys_rk[first_rep], axis=1, count=len(uniq) + 1).astype(bool)
    bits[:, text] = alive_uu[:, tok_string.reshape(-1)]
    bits[:, eos] = alive_uu[:, -1:]
    row_of_class = row_of_rep.reshape(-1)
    return pack_bits(bits), row_of_class[state_class].astype(np.int32)


def _class_strings(vocab: Vocabulary, cls_b: np.ndarray, text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique byte-class strings of the text tokens (uint8 [U, L], classes + 1, 0-padded) and each token's."""
    table = bytes((cls_b + 1).astype(np.uint8).tolist())  # class ids + 1 < 256: one byte each
    index: dict[bytes, int] = {}
    ids = np.array([index.setdefault(b.translate(table), len(index)) for b in vocab.token_list(text)], np.int64)
    uniq = np.zeros((len(index), vocab.max_len), np.uint8)
    for string, i in index.items():
        uniq[i, :len(string)] = np.frombuffer(string, np.uint8)
    return uniq, ids


def _bounded_classes(trans_sc: np.ndarray, accept: np.ndarray, depth: int) -> np.ndarray:
    """States that agree on acceptance and on "alive" after every string of ≤ ``depth`` symbols."""
    part = (np.arange(len(accept)) != DEAD).astype(np.int64)
    count = 2
    for _ in range(depth):
        sig = np.concatenate([part[:, None], part[trans_sc]], axis=1)
        part = np.unique(sig, axis=0, return_inverse=True)[1].reshape(-1)
        new = int(part.max()) + 1
        if new == count:
            break
        count = new
    sig = np.stack([part, accept.astype(np.int64)], axis=1)
    return np.unique(sig, axis=0, return_inverse=True)[1].reshape(-1)


def _trie(strings_ul: np.ndarray) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]]]:
    """Trie levels over class strings (0-padded, symbols 1..): per level (parent node, symbol) arrays, and
    per level (string ids ending there, their node)."""
    levels, ends = [], []
    node = np.zeros(len(strings_ul), np.int64)  # node of each string's prefix at the previous level
    lengths = (strings_ul > 0).sum(axis=1)
    base = int(strings_ul.max()) + 1
    for k in range(strings_ul.shape[1]):
        live = np.nonzero(lengths > k)[0]
        if len(live) == 0:
            break
        key = node[live] * base + strings_ul[live, k]
        uniq, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        levels.append((uniq // base, (uniq % base) - 1))
        node[live] = inv
        done = live[lengths[live] == k + 1]
        ends.append((done, node[done]))
    return levels, ends


def _walk(trans_sc: np.ndarray, n_cls: int, states: np.ndarray, levels, ends, n_strings: int) -> np.ndarray:
    """alive [len(states), n_strings] after walking every class string from every given state."""
    alive = np.zeros((len(states), n_strings), bool)
    flat = trans_sc.reshape(-1)
    cur = states[:, None].astype(np.int64)  # [chunk, 1]: the empty prefix
    for (parent, symbol), (done, at) in zip(levels, ends, strict=True):
        cur = flat[cur[:, parent] * n_cls + symbol[None, :]].astype(np.int64)
        alive[:, done] = cur[:, at] != DEAD
    return alive
