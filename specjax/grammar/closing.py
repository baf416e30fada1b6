"""Closing a sentence within a token budget: how far each grammar state is from a complete sentence.

A constrained row that is still inside a free-form string when ``max_new_tokens`` runs out ends cut, and a
cut JSON document is not an instance of its schema. The decode loops avoid that (`decode/constrain.py`,
``close``): before a token is emitted they check that the state it leads to can still reach a complete
sentence in the tokens left; if not, the row takes the first token of the state's shortest completion
instead. This module computes, once per batch on the host, what that check needs:

* ``dist_s``: the fewest bytes from each state to an accepting state (EOS allowed), walking only bytes that
  some single-byte text token spells — each such byte is one token, so ``dist_s`` bounds the tokens a
  completion takes (multi-byte tokens could only make it shorter);
* ``close_s``: the single-byte token that starts such a shortest completion (-1 at accepting states, where
  the shortest completion is EOS itself).

Following ``close_s`` lowers ``dist_s`` by exactly one per token, so a row steered onto it always
finishes in time. The distances come from one multi-source breadth-first search on the reversed byte graph
(`scipy.sparse.csgraph`, unweighted), so the cost is linear in the table's distinct edges.
"""

from __future__ import annotations

import numpy as np

__all__ = ["UNREACHABLE", "byte_tokens", "closing_tables"]

UNREACHABLE = np.int32(2**30)  # dist_s of states with no completion (the dead state, padding)


def byte_tokens(bytes_vl: np.ndarray, length_v: np.ndarray, kind_v: np.ndarray) -> np.ndarray:
    """int32 [256]: a text token spelling exactly each byte, or -1 when the vocabulary has none.

    Where several tokens spell the same byte (a plain token and a byte-fallback one), the lowest id is taken:
    any of them advances the grammar the same way.
    """
    single = np.flatnonzero((np.asarray(length_v) == 1) & (np.asarray(kind_v) == 0))
    out = np.full(256, -1, np.int32)
    byte_of = np.asarray(bytes_vl)[single, 0].astype(np.int64)
    # Reversed, so that for a repeated byte the lowest id is written last and wins.
    out[byte_of[::-1]] = single[::-1]
    return out


def closing_tables(trans_sb: np.ndarray, accept_s: np.ndarray, byte_token: np.ndarray) -> tuple[np.ndarray,
                                                                                                np.ndarray]:
    """(dist_s int32 [S], close_s int32 [S]) of a byte DFA (state 0 dead), over the bytes `byte_token` spells.

    Args:
      trans_sb: int32 [S, 256] byte transitions (0 = dead).
      accept_s: bool [S] states where the text is a complete sentence.
      byte_token: int32 [256] from :func:`byte_tokens`.

    Returns:
      dist_s: fewest single-byte tokens to an accepting state (0 there, ``UNREACHABLE`` where none leads);
      close_s: the token starting that shortest completion (-1 at accepting and unreachable states).
    """
    trans_sb = np.asarray(trans_sb)
    accept_s = np.asarray(accept_s, bool).copy()
    accept_s[0] = False
    n = trans_sb.shape[0]
    usable = np.flatnonzero(np.asarray(byte_token) >= 0)
    sub = trans_sb[:, usable]
    src, col = np.nonzero(sub)
    dst = sub[src, col]
    from scipy.sparse import csr_matrix  # imported here: at module level it cost every start 0.2 s
    from scipy.sparse.csgraph import dijkstra

    # The reversed graph (an edge dst -> src per byte edge src -> dst): distances from the accepting states
    # in it are the forward distances to them. Duplicate edges are summed by csr_matrix, which `unweighted`
    # ignores.
    graph = csr_matrix((np.ones(len(src), np.int8), (dst, src)), shape=(n, n))
    sources = np.flatnonzero(accept_s)
    dist_s = np.full(n, UNREACHABLE, np.int32)
    close_s = np.full(n, -1, np.int32)
    if not len(sources):
        return dist_s, close_s
    dist, pred, _ = dijkstra(graph, directed=True, indices=sources, unweighted=True, min_only=True,
                          return_predecessors=True)
    reach = np.isfinite(dist)
    dist_s[reach] = dist[reach].astype(np.int32)
    # A state's predecessor in the reversed graph is the next state on its forward shortest path.
    todo = np.flatnonzero(reach & (dist_s > 0))
    hit = sub[todo] == pred[todo][:, None]
    close_s[todo] = np.asarray(byte_token)[usable[np.argmax(hit, axis=1)]]
    return dist_s, close_s
