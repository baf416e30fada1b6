"""Tries over the vocabulary: one byte trie per vocabulary, folded per grammar into a trie of class strings.

Mask tables walk every token from every state, so tokens whose bytes are equal up to the grammar's byte
classes are one string and share one walk. Finding those strings used to map all 262,144 tokens to classes
and deduplicate the padded rows (~0.25 s, the whole compile time of a small schema). The tokens' byte trie
does not depend on the grammar: it is built once per vocabulary (``ByteTrie``), and each grammar folds it
level by level into its class trie (``ClassTrie.fold``, ~30 ms): a node's class-trie node is its parent's
plus its byte's class.
"""

from __future__ import annotations

import numpy as np

from specjax.grammar import _deadline

__all__ = ["ByteTrie", "ClassTrie", "ranges"]


def ranges(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``start[i] : start[i] + count[i]`` (int64), without a Python loop."""
    offset = np.cumsum(count) - count
    return np.repeat(start - offset, count) + np.arange(int(count.sum()))


def _sorted_levels(key: np.ndarray, base: int, n_above: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique ``parent * base + symbol`` keys → (symbol, parent, child_start, inverse), sorted by parent."""
    uniq, inverse = np.unique(key, return_inverse=True)
    parent = uniq // base
    return uniq % base, parent, np.searchsorted(parent, np.arange(n_above + 1)), inverse.reshape(-1)


class ByteTrie:
    """The text tokens' bytes as a trie, stored per level (level k holds the nodes at depth k + 1).

    Args:
      bytes_tl: uint8 [T, L] each token's bytes, zero-padded.
      length_t: int [T] each token's length (≥ 1).

    Attributes:
      byte: per level, each node's byte.
      parent: per level, each node's parent (an index into the level above; the root is 0).
      length: int64 [T] the tokens' lengths.
      ending: per level, the tokens that end there and their end nodes (two int64 arrays).
    """

    def __init__(self, bytes_tl: np.ndarray, length_t: np.ndarray):
        self.length = np.asarray(length_t, np.int64)
        self.byte, self.parent = [], []
        node = np.zeros(len(self.length), np.int64)  # each token's node at the last level it reached
        n_above = 1
        for k in range(bytes_tl.shape[1]):
            live = np.nonzero(self.length > k)[0]
            if len(live) == 0:
                break
            symbol, parent, _, inverse = _sorted_levels(node[live] * 256 + bytes_tl[live, k], 256, n_above)
            node[live] = inverse
            self.byte.append(symbol.astype(np.uint8))
            self.parent.append(parent)
            n_above = len(symbol)
        order = np.argsort(self.length, kind="stable")
        bounds = np.searchsorted(self.length[order], np.arange(1, len(self.byte) + 2))
        self.ending = [(order[lo:hi], node[order[lo:hi]]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


class ClassTrie:
    """Unique class strings as a trie, stored per level: each level's nodes are sorted by parent, so the
    children of a node of the level above are one contiguous range (``child_start``).

    Attributes:
      symbol: per level, each node's class.
      parent: per level, each node's parent in the level above.
      child_start: per level, int64 [nodes above + 1]: the children of node ``i`` above are
        ``child_start[i]:child_start[i + 1]``.
      end_string: per level, the string that ends at each node, or -1.
      n_strings: how many strings the trie holds.
    """

    def __init__(self, symbol, parent, child_start, end_string, n_strings: int):
        self.symbol, self.parent, self.child_start, self.end_string = symbol, parent, child_start, end_string
        self.n_strings = n_strings

    @classmethod
    def fold(cls, trie: ByteTrie, cls_b: np.ndarray, n_cls: int) -> tuple[ClassTrie, np.ndarray]:
        """The class trie of the tokens under a byte → class map, and the string id of each token."""
        symbol, parent, child_start, class_node = [], [], [], []
        above = np.zeros(1, np.int64)  # each byte node's class node, one level up
        for byte, byte_parent in zip(trie.byte, trie.parent, strict=True):
            s, p, c, above = _sorted_levels(above[byte_parent] * n_cls + cls_b[byte], n_cls,
                                            len(symbol[-1]) if symbol else 1)
            symbol.append(s)
            parent.append(p)
            child_start.append(c)
            class_node.append(above)
        # Strings are numbered level by level, in node order within a level.
        token_string = np.zeros(len(trie.length), np.int64)
        end_string, n_strings = [], 0
        for level, nodes, (tokens, byte_nodes) in zip(symbol, class_node, trie.ending, strict=True):
            ends = nodes[byte_nodes]  # the class node where each of this level's tokens ends
            is_end = np.zeros(len(level), bool)
            is_end[ends] = True
            number = np.cumsum(is_end) - 1 + n_strings
            token_string[tokens] = number[ends]
            end_string.append(np.where(is_end, number, -1))
            n_strings += int(is_end.sum())
        return cls(symbol, parent, child_start, end_string, n_strings), token_string

    def restricted(self, strings: np.ndarray) -> ClassTrie:
        """The sub-trie holding only the given strings (sorted ids), renumbered 0… in that order."""
        position = np.full(self.n_strings + 1, -1, np.int64)  # the last entry: "no string ends here" (-1) stays -1
        position[strings] = np.arange(len(strings))
        ends = np.split(position[np.concatenate(self.end_string)], np.cumsum([len(e) for e in self.end_string[:-1]]))
        need = [e >= 0 for e in ends]
        for k in range(len(need) - 1, 0, -1):  # a node is needed if a kept string ends at or below it
            need[k - 1][self.parent[k][need[k]]] = True
        symbol, parent, child_start, end_string = [], [], [], []
        index_above, n_above = np.zeros(1, np.int64), 1  # the kept nodes' new indices, one level up
        for k, keep in enumerate(need):
            if not keep.any():
                break
            p = index_above[self.parent[k][keep]]
            symbol.append(self.symbol[k][keep])
            parent.append(p)
            child_start.append(np.searchsorted(p, np.arange(n_above + 1)))
            end_string.append(ends[k][keep])
            index_above, n_above = np.cumsum(keep) - 1, int(keep.sum())
        return ClassTrie(symbol, parent, child_start, end_string, len(strings))

    def walk(self, trans_sc: np.ndarray, states: np.ndarray, alive: np.ndarray) -> None:
        """Sets ``alive[i, j]`` (bool [len(states), ≥ n_strings], zeros) iff string j walked from ``states[i]``
        never reaches state 0, the dead state; ``trans_sc`` [S, classes] is the next state per class."""
        row, string = self.hits(trans_sc, states)
        alive[row, string] = True

    def hits(self, trans_sc: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (start index, string) pairs such that the string walked from ``states[start]`` never reaches state
        0, the dead state (int32 arrays); ``trans_sc`` [S, classes] is the next state per class. They come level
        by level, each level's sorted by (start, string), and string ids grow level by level: a stable sort by
        start sorts them by (start, string).

        Only live (start state, trie node) pairs are carried from level to level: from most states most tokens
        die on their first byte or two, so this is a small fraction of the dense [states, trie nodes] walk.
        """
        n_cls = trans_sc.shape[1]
        flat = trans_sc.reshape(-1)
        row = np.arange(len(states))  # live pairs: start state (index into states), trie node, current state
        node = np.zeros(len(states), np.int64)
        cur = states.astype(np.int64)
        out_row, out_string = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]  # a trie without strings hits none
        for symbol, child_start, end_string in zip(self.symbol, self.child_start, self.end_string, strict=True):
            _deadline.check()
            count = child_start[node + 1] - child_start[node]
            child = ranges(child_start[node], count)
            row, cur = np.repeat(row, count), np.repeat(cur, count)
            cur = flat[cur * n_cls + symbol[child]].astype(np.int64)
            keep = cur != 0
            row, node, cur = row[keep], child[keep], cur[keep]
            ends = end_string[node]
            hit = ends >= 0
            out_row.append(row[hit].astype(np.int32))  # int32: a chunk's hits can number tens of millions
            out_string.append(ends[hit].astype(np.int32))
            if len(row) == 0:
                break
        return np.concatenate(out_row), np.concatenate(out_string)

    def lengths(self) -> np.ndarray:
        """int64 [n_strings]: each string's length in classes."""
        out = np.zeros(self.n_strings, np.int64)
        for k, end_string in enumerate(self.end_string):
            out[end_string[end_string >= 0]] = k + 1
        return out

    def first_symbols(self) -> np.ndarray:
        """int64 [n_strings]: each string's first class."""
        out = np.zeros(self.n_strings, np.int64)
        first = np.zeros(1, np.int64)
        for k, (symbol, parent, end_string) in enumerate(zip(self.symbol, self.parent, self.end_string, strict=True)):
            first = symbol.astype(np.int64) if k == 0 else first[parent]
            out[end_string[end_string >= 0]] = first[end_string >= 0]
        return out

    def strings_within(self, allowed_c: np.ndarray) -> np.ndarray:
        """bool [n_strings]: the strings made only of allowed classes (one pass over the trie's nodes)."""
        out = np.zeros(self.n_strings, bool)
        inside = np.ones(1, bool)  # the root
        for symbol, parent, end_string in zip(self.symbol, self.parent, self.end_string, strict=True):
            inside = inside[parent] & allowed_c[symbol]
            out[end_string[inside & (end_string >= 0)]] = True
            if not inside.any():
                break
        return out
