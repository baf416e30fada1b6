"""The n-gram (prompt lookup) drafter on hand-made histories and against a Python reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode.spec.drafters.ngram import NgramDrafter, ngram_propose


def _propose(histories, k, max_ngram=3, min_ngram=1, width=16, fill=0):
    """Runs the drafter on ragged histories, right-padded with `fill` (must be ignored)."""
    hist_bl = np.full((len(histories), width), fill, np.int32)
    for i, h in enumerate(histories):
        hist_bl[i, :len(h)] = h
    len_b = np.array([len(h) for h in histories], np.int32)
    d = _jitted(k, max_ngram, min_ngram)(jnp.asarray(hist_bl), jnp.asarray(len_b))
    return np.asarray(d.tokens_bk).tolist(), np.asarray(d.len_b).tolist()


_CACHE = {}


def _jitted(k, max_ngram, min_ngram):
    key = (k, max_ngram, min_ngram)
    if key not in _CACHE:
        _CACHE[key] = jax.jit(lambda h, n: ngram_propose(h, n, k, max_ngram, min_ngram))
    return _CACHE[key]


def reference(hist, k, max_ngram, min_ngram=1):
    """The rule in plain Python: longest tail first, latest earlier occurrence, cycle past the end."""
    n_len = len(hist)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n_len < n + 1:
            continue
        tail = hist[n_len - n:]
        ends = [j for j in range(n - 1, n_len - 1) if hist[j - n + 1:j + 1] == tail]
        if ends:
            j = ends[-1]
            cont = hist[j + 1:]
            return [cont[i % len(cont)] for i in range(k)], k
    return [hist[-1]] * k, 0


def test_continues_the_earlier_occurrence():
    toks, lens = _propose([[1, 2, 3, 9, 1, 2]], k=3)
    assert toks == [[3, 9, 1]] and lens == [3]


def test_longer_tail_beats_more_recent_shorter_one():
    hist = [4, 1, 2, 5, 9, 2, 6, 1, 2]
    # Tail "1 2" occurred at index 1..2 (followed by 5 9 2); tail "2" alone last at index 5 (then 6 1 2).
    assert _propose([hist], k=3, max_ngram=2) == ([[5, 9, 2]], [3])
    assert _propose([hist], k=3, max_ngram=1) == ([[6, 1, 2]], [3])


def test_most_recent_occurrence_and_periodic_extension():
    # "5" occurs at 0 and 2; the latest (2) is followed by "8 5" and then the present, so the
    # draft cycles with period 2.
    assert _propose([[5, 7, 5, 8, 5]], k=5, max_ngram=2) == ([[8, 5, 8, 5, 8]], [5])
    assert _propose([[3, 4, 3, 4]], k=5) == ([[3, 4, 3, 4, 3]], [5])
    assert _propose([[7, 7]], k=3) == ([[7, 7, 7]], [3])  # a repeated token drafts more of it


def test_no_match_proposes_nothing():
    toks, lens = _propose([[1, 2, 3], [6]], k=4)
    assert lens == [0, 0]
    assert toks == [[3, 3, 3, 3], [6, 6, 6, 6]]  # placeholders: the last token, never accepted


def test_min_ngram_rejects_short_matches():
    assert _propose([[1, 2, 3, 9, 1, 2]], k=2, max_ngram=3, min_ngram=2)[1] == [2]
    assert _propose([[4, 1, 5, 1]], k=2, max_ngram=3, min_ngram=2)[1] == [0]


def test_padding_past_the_length_is_ignored():
    # Padding of 1s would "match" the tail 1 if it were read; the row has no real match.
    assert _propose([[3, 1]], k=2, fill=1) == ([[1, 1]], [0])
    # Rows of different lengths in one call are independent.
    toks, lens = _propose([[1, 2, 1], [5, 6, 7, 5, 6]], k=3, fill=1)
    assert toks == [[2, 1, 2], [7, 5, 6]] and lens == [3, 3]


@pytest.mark.parametrize("max_ngram", [1, 3])
def test_matches_python_reference_on_random_histories(max_ngram):
    rng = np.random.default_rng(max_ngram)
    # Small vocabularies make every kind of match (long, short, overlapping, none) common.
    hists = [rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 15))).tolist() for _ in range(64)]
    toks, lens = _propose(hists, k=4, max_ngram=max_ngram, width=16, fill=99)
    for h, tk, ln in zip(hists, toks, lens, strict=True):
        assert (tk, ln) == reference(h, 4, max_ngram), h


def test_drafter_reads_the_loop_state():
    class State:  # the fields the loop state exposes to drafters
        hist_bl = jnp.array([[1, 2, 3, 1, 2, 0, 0]])
        hist_len_b = jnp.array([5])
        draft_state = ()

    d, draft_state = NgramDrafter(max_ngram=2).propose(None, (), State(), 2)
    assert np.asarray(d.tokens_bk).tolist() == [[3, 1]] and d.q_probs_bkv is None and draft_state == ()
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(max_ngram=1, min_ngram=2)
