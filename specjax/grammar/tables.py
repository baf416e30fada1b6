"""A byte DFA + a vocabulary → device tables: packed token masks per state and the byte transition table.

The mask of state ``s`` has bit ``v`` set iff walking token ``v``'s bytes from ``s`` never reaches the dead
state (the automaton is trimmed, so "not dead" means "can still be completed"). Computing it for 262,144
tokens from every state is vectorised three ways:

* **rows, not states**: two states need the same row iff they agree on "alive after each byte string of
  length ≤ the longest token" and on acceptance (for EOS) — a bounded Moore refinement finds these
  classes, and only one representative per class is walked;
* **byte classes**: bytes that act alike in every state are one symbol, so tokens with equal class
  strings are one column (found by folding the vocabulary's byte trie, built once, see ``_vocab_trie``);
* **a trie**: the unique class strings are walked level by level from chunks of representatives, carrying
  only the live (representative, trie node) pairs: from most states most tokens die within a byte or two, so
  this is a few percent of the dense [representatives, trie nodes] walk.
"""

from __future__ import annotations

import numpy as np

from specjax.grammar import _deadline
from specjax.grammar._dfa import byte_classes, row_ids
from specjax.grammar._vocab_trie import ByteTrie, ClassTrie
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
    # Rows are first told apart over the U unique class strings (+ acceptance): far fewer columns than V.
    row_index: dict[bytes, int] = {}
    row_keys: list[np.ndarray] = []
    row_of_rep = np.zeros(len(reps), np.int64)
    for members, stays, sub, sub_trie in _loop_groups(trans_sc, reps, trie):
        local: dict[bytes, int] = {}  # this group's rows told apart over its leaving strings only
        for lo in range(0, len(members), _CHUNK):
            _deadline.check()
            chunk = members[lo:lo + _CHUNK]
            alive = np.zeros((len(chunk), len(sub) + 1), bool)  # + acceptance, for EOS (no copy to append it)
            alive[:, -1] = auto.accept_s[reps[chunk]]
            _walk(trans_sc, n_cls, reps[chunk], sub_trie, alive)
            packed = np.packbits(alive, axis=1)
            keys, first, inverse = np.unique(packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1),
                                              return_index=True, return_inverse=True)
            ids = np.zeros(len(keys), np.int64)
            for k, key in enumerate(keys):  # one Python step per distinct row, not per state
                if (j := local.get(key.tobytes())) is None:
                    bits = np.unpackbits(packed[first[k]], count=len(sub) + 1).view(bool)
                    full = stays.copy()  # a string that never leaves the state's self-loops keeps it alive
                    full[sub] = bits[:-1]
                    row = np.packbits(np.append(full, bits[-1]))
                    j = local[key.tobytes()] = row_index.setdefault(row.tobytes(), len(row_index))
                    if j == len(row_keys):
                        row_keys.append(row)
                ids[k] = j
            row_of_rep[chunk] = ids[inverse.reshape(-1)]
    return _expand_rows(np.stack(row_keys), vocab, tok_string, trie.n_strings), row_of_rep[state_class].astype(np.int32)


def _loop_groups(trans_sc: np.ndarray, reps: np.ndarray, trie: ClassTrie):
    """Representatives grouped by their self-loop classes: (members, stays [U], leaving strings, their trie).

    A class string made only of a state's self-loop classes walks from the state back to itself, so it is alive
    there (the automaton is trimmed: every live state can still accept); only the other strings need a walk.
    Inside a free-text string most of the vocabulary loops, so each such state walks a few thousand strings
    (those with a quote, backslash, ...) instead of the whole trie: the walk was ~80% of a schema's mask table.
    Groups where most strings leave walk the shared full trie.
    """
    loops_rc = trans_sc[reps] == reps[:, None]
    loops_rc[reps == DEAD] = False  # the dead state loops on everything but is alive nowhere
    group = row_ids(loops_rc.astype(np.int64))
    everything = np.arange(trie.n_strings)
    for g in range(int(group.max()) + 1 if len(group) else 0):
        members = np.nonzero(group == g)[0]
        stays = trie.strings_within(loops_rc[members[0]])
        sub = np.nonzero(~stays)[0]
        if len(sub) > trie.n_strings // 2:
            yield members, np.zeros(trie.n_strings, bool), everything, trie
        else:
            yield members, stays, sub, trie.restricted(sub)


def _expand_rows(keys_rk: np.ndarray, vocab: Vocabulary, tok_string: np.ndarray, n_strings: int) -> np.ndarray:
    """Packed rows over class strings (+ acceptance) → packed rows over the V token ids."""
    alive_rk = np.unpackbits(keys_rk, axis=1, count=n_strings + 1)
    alive_rk = np.concatenate([alive_rk, np.zeros((len(alive_rk), 1), np.uint8)], axis=1)  # never: specials
    column_v = np.full(vocab.size, n_strings + 1, np.int64)  # each token's column of alive_rk
    column_v[vocab.kind_v == 0] = tok_string.reshape(-1)
    column_v[vocab.kind_v == 1] = n_strings  # EOS: acceptance
    # np.take, not fancy indexing along axis 1: ~10x faster for [rows, 262,144] gathers.
    return np.concatenate([pack_bits(np.take(alive_rk[lo:lo + _CHUNK], column_v, axis=1).view(bool))
                           for lo in range(0, len(alive_rk), _CHUNK)])


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


def _walk(trans_sc: np.ndarray, n_cls: int, states: np.ndarray, trie: ClassTrie, alive: np.ndarray) -> None:
    """Sets ``alive[i, j]`` (bool [len(states), ≥ n_strings], zeros) iff string j from ``states[i]`` stays alive.

    Only live (start state, trie node) pairs are carried from level to level: from most states most tokens
    die on their first byte or two, so this is a small fraction of the dense [states, trie nodes] walk.
    """
    flat = trans_sc.reshape(-1)
    row = np.arange(len(states))  # live pairs: start state (index into states), trie node, current state
    node = np.zeros(len(states), np.int64)
    cur = states.astype(np.int64)
    for symbol, child_start, end_string in zip(trie.symbol, trie.child_start, trie.end_string, strict=True):
        _deadline.check()
        first, count = child_start[node], child_start[node + 1] - child_start[node]
        offset = np.cumsum(count) - count
        child = np.repeat(first - offset, count) + np.arange(int(offset[-1] + count[-1]) if len(count) else 0)
        row, cur = np.repeat(row, count), np.repeat(cur, count)
        cur = flat[cur * n_cls + symbol[child]].astype(np.int64)
        keep = cur != DEAD
        row, node, cur = row[keep], child[keep], cur[keep]
        ends = end_string[node]
        hit = ends >= 0
        alive[row[hit], ends[hit]] = True
        if len(row) == 0:
            break
