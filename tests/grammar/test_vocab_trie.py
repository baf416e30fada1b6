"""The vocabulary's byte trie folded into class tries (`_vocab_trie`), against plain Python on random vocabularies."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.grammar._vocab_trie import ByteTrie, ClassTrie
from specjax.grammar.tables import Vocabulary

ALPHABET = b"ab{}\"\\ 09"
tokens_st = st.lists(st.binary(min_size=1, max_size=6).map(lambda b: bytes(ALPHABET[c % len(ALPHABET)] for c in b)),
                     min_size=1, max_size=60, unique=True)


def _strings(trie: ClassTrie) -> dict[tuple[int, ...], int]:
    """Every string of the trie → its id, read back by walking ``child_start`` ranges from the root."""
    out: dict[tuple[int, ...], int] = {}
    frontier = [(0, ())]  # (node index in the level above, classes so far)
    for symbol, child_start, end_string in zip(trie.symbol, trie.child_start, trie.end_string, strict=True):
        nxt = []
        for node, prefix in frontier:
            for child in range(child_start[node], child_start[node + 1]):
                path = prefix + (int(symbol[child]),)
                if end_string[child] >= 0:
                    assert path not in out
                    out[path] = int(end_string[child])
                nxt.append((child, path))
        frontier = nxt
    return out


def _fold(tokens: list[bytes], cls_b: np.ndarray) -> tuple[ClassTrie, np.ndarray, list[tuple[int, ...]]]:
    vocab = Vocabulary(tokens, (0,))  # EOS 0 is one of the text tokens here: ByteTrie takes what it is given
    trie, token_string = ClassTrie.fold(ByteTrie(vocab.bytes_vl, vocab.length_v), cls_b, int(cls_b.max()) + 1)
    return trie, token_string, [tuple(int(cls_b[b]) for b in t) for t in tokens]


@settings(deadline=None, max_examples=60)
@given(tokens=tokens_st, n_cls=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_fold_numbers_each_class_string_once(tokens, n_cls, seed):
    cls_b = np.random.default_rng(seed).integers(0, n_cls, 256)
    trie, token_string, class_strings = _fold(tokens, cls_b)
    strings = _strings(trie)
    assert sorted(strings.values()) == list(range(trie.n_strings))  # ids 0… without gaps
    assert set(strings) == set(class_strings)
    for i, s in enumerate(class_strings):  # each token's id is its class string's
        assert token_string[i] == strings[s]


@settings(deadline=None, max_examples=60)
@given(tokens=tokens_st, n_cls=st.integers(1, 4), seed=st.integers(0, 2**16), data=st.data())
def test_restricted_keeps_exactly_the_chosen_strings(tokens, n_cls, seed, data):
    cls_b = np.random.default_rng(seed).integers(0, n_cls, 256)
    trie, _, _ = _fold(tokens, cls_b)
    strings = _strings(trie)
    chosen = sorted(data.draw(st.sets(st.sampled_from(range(trie.n_strings)))))
    sub = trie.restricted(np.array(chosen, np.int64))
    by_id = {i: s for s, i in strings.items()}
    assert _strings(sub) == {by_id[i]: position for position, i in enumerate(chosen)}
    allowed = np.random.default_rng(seed + 1).random(n_cls) < 0.6
    within = trie.strings_within(allowed)
    assert [bool(within[i]) for i in range(trie.n_strings)] == [all(allowed[c] for c in by_id[i])
                                                               for i in range(trie.n_strings)]


@settings(deadline=None, max_examples=60)
@given(tokens=tokens_st, n_cls=st.integers(1, 4), seed=st.integers(0, 2**16), data=st.data())
def test_hits_are_the_live_strings_and_sort_by_start_stably(tokens, n_cls, seed, data):
    # mask_rows relies on both: the hits are exactly the (start, string) pairs that stay alive, and a stable sort
    # by start alone orders them by (start, string) (each level sorted, ids growing level by level).
    cls_b = np.random.default_rng(seed).integers(0, n_cls, 256)
    trie, _, _ = _fold(tokens, cls_b)
    chosen = sorted(data.draw(st.sets(st.sampled_from(range(trie.n_strings)), min_size=1)))
    sub = trie.restricted(np.array(chosen, np.int64))  # the tries the mask tables walk are restricted ones too
    by_id = {i: s for s, i in _strings(sub).items()}
    rng = np.random.default_rng(seed + 2)
    trans = np.where(rng.random((6, n_cls)) < 0.7, rng.integers(0, 6, (6, n_cls)), 0)  # state 0 is dead
    trans[0] = 0
    states = rng.integers(0, 6, 5)
    row, string = sub.hits(trans, states)
    want = set()
    for r, q0 in enumerate(states.tolist()):
        for i, path in by_id.items():
            q = q0
            for c in path:
                q = trans[q, c]
            if q0 != 0 and q != 0:
                want.add((r, i))
    assert set(zip(row.tolist(), string.tolist(), strict=True)) == want and len(row) == len(want)
    order = np.argsort(row, kind="stable")
    assert list(zip(row[order].tolist(), string[order].tolist(), strict=True)) == sorted(want)


def test_a_trie_without_strings_hits_nothing():
    trie, _, _ = _fold([b"ab", b"a"], np.zeros(256, np.int64))
    row, string = trie.restricted(np.zeros(0, np.int64)).hits(np.ones((2, 1), np.int64), np.array([1, 1]))
    assert row.shape == string.shape == (0,)
