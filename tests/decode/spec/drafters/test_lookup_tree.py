"""Lookup trees: ranked occurrences, continuations, the trie merge, and greedy equality at batch 1.

Batch 8 (ragged, EOS inside accepted blocks) is in test_batch8_equality; the sampling proof in
test_token_tree_sampling; the real model in test_token_trees_real.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer

from specjax.decode import GenerateConfig, Generator, SpecConfig, SpeculativeGenerator
from specjax.decode.spec.drafters.lookup_tree import (
    LookupTreeDrafter,
    continuations,
    lookup_tree_propose,
    ranked_match_ends,
    trie,
)
from specjax.decode.spec.drafters.ngram import ngram_propose


def _hist(rows, width=24):
    h = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        h[i, :len(r)] = r
    return jnp.asarray(h), jnp.asarray([len(r) for r in rows], jnp.int32)


def test_occurrences_rank_longer_tails_first_then_recent_ones():
    # Tail "1 2": as a 2-gram at ends 2 and 8; "2" alone also at end 5 (after 7, not 1).
    hist, n = _hist([[9, 1, 2, 3, 7, 2, 4, 1, 2, 5, 1, 2]])
    end, found = ranked_match_ends(hist, n, 4, max_ngram=2, min_ngram=1)
    assert np.asarray(end).tolist() == [[8, 2, 5, 0]] and np.asarray(found).tolist() == [[True, True, True, False]]


def test_continuations_cycle_through_the_present():
    hist, n = _hist([[5, 8, 5, 8, 5]])
    cont = continuations(hist, n, jnp.array([[2, 0]]), 4)  # "5" ended at 2: then 8 5, then the present
    assert np.asarray(cont).tolist() == [[[8, 5, 8, 5], [8, 5, 8, 5]]]


def test_trie_merges_shared_prefixes_and_drops_missing_continuations():
    cont = jnp.array([[[1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 2, 3], [7, 7, 7]]])
    found = jnp.array([[True, True, True, True, False]])
    tokens, parent, valid = trie(cont, found)
    v = np.asarray(valid)[0].reshape(5, 3)
    # Continuation 1 adds only its last node, 2 its last two, 3 is a duplicate, 4 was not found.
    assert v.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1], [0, 0, 0], [0, 0, 0]]
    p = np.asarray(parent)[0].reshape(5, 3)
    assert p[0].tolist() == [-1, 0, 1] and p[1, 2] == 1 and p[2, 1:].tolist() == [0, 7]


def test_propose_is_the_chain_draft_plus_the_alternatives():
    rows = [[1, 2, 3, 4, 0, 1, 2, 6, 7, 0, 1, 2], [3, 3, 9], [4, 5]]
    hist, n = _hist(rows)
    draft = jax.jit(lambda h, n: lookup_tree_propose(h, n, 6, branches=3, depth=3))(hist, n)
    tokens, parent, len_b = (np.asarray(x) for x in (draft.tokens_bk, draft.parent_bk, draft.len_b))
    # Row 0: "1 2" was followed by "6 7 0" (latest) and "3 4 0": two root children; "2" alone adds nothing new.
    assert len_b[0] == 6 and tokens[0].tolist() == [6, 7, 0, 3, 4, 0] and parent[0].tolist() == [-1, 0, 1, -1, 3, 4]
    chain = ngram_propose(hist, n, 3)
    assert tokens[0, :3].tolist() == np.asarray(chain.tokens_bk)[0].tolist()
    # Row 1: "9" never occurred before; row 2: nothing repeats. No draft.
    assert len_b[1:].tolist() == [0, 0]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="branches"):
        LookupTreeDrafter(branches=0)
    with pytest.raises(ValueError, match="min_ngram"):
        LookupTreeDrafter(max_ngram=1, min_ngram=2)


@pytest.mark.parametrize("k", [4, 12])
def test_greedy_equals_plain_greedy_batch1(tiny_model, k):
    """Batch 1 on the random tiny model; k=4 truncates the trie, k=12 holds every continuation."""
    prompts = ["abcabcabcabc", "the cat the cat"]
    cfg = GenerateConfig(max_new_tokens=24, batch_size=1, ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(prompts, cfg)
    spec = SpecConfig(k=k, method="lookup", lookup_branches=3, lookup_depth=4, adaptive=False)
    out, stats = SpeculativeGenerator(tiny_model, ByteTokenizer()).generate(prompts, cfg, spec)
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert stats.tau > 1.5, stats.line()
