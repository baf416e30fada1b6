"""Reduced draft vocabulary: building from counts / corpora, the in-graph head, files and errors."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer

from specjax.models.draft_vocab import DraftVocab, DraftVocabError, HeadTable


def test_from_counts_keeps_most_frequent_and_always_ids():
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 3])
    dv = DraftVocab.from_counts(counts, size=4, always=(1,))
    # 1 is forced; then 2, 3 (9 each, smaller id first), 5 (7).
    assert dv.ids_n.tolist() == [1, 2, 3, 5] and dv.size == 4 and dv.vocab_size == 8
    index = dv.index_of()
    assert index[[1, 2, 3, 5]].tolist() == [0, 1, 2, 3] and index[0] == -1
    assert dv.coverage(counts) == pytest.approx((0 + 9 + 9 + 7) / counts.sum())


def test_from_texts_counts_tokenised_corpus():
    tok = ByteTokenizer()
    dv = DraftVocab.from_texts(["aaab", "aab"], tok, vocab_size=64, size=2, always=())
    assert dv.ids_n.tolist() == sorted([3 + ord("a") % 61, 3 + ord("b") % 61])


def test_head_table_logits_match_full_head_rows_and_map_back():
    table_vd = jnp.asarray(np.random.default_rng(0).normal(size=(16, 8)), jnp.float32)
    hidden_bd = jnp.asarray(np.random.default_rng(1).normal(size=(3, 8)), jnp.float32)
    dv = DraftVocab(np.array([1, 4, 9, 15]), 16)
    head = dv.head(table_vd, softcap=30.0)
    full = HeadTable.full(table_vd, softcap=30.0)
    np.testing.assert_allclose(head.logits(hidden_bd), full.logits(hidden_bd)[:, dv.ids_n], rtol=1e-6)
    assert head.to_target(jnp.array([0, 3])).tolist() == [1, 15]
    assert full.to_target(jnp.array([7])).tolist() == [7]


def test_save_load_roundtrip(tmp_path):
    dv = DraftVocab.from_counts(np.arange(100), size=10, always=(0,))
    path = dv.save(tmp_path / "sub" / "vocab")
    back = DraftVocab.load(path)
    assert back.ids_n.tolist() == dv.ids_n.tolist() and back.vocab_size == 100
    assert DraftVocab.load(tmp_path / "sub" / "vocab.json").size == 10


def test_bad_inputs_give_one_clear_message(tmp_path):
    with pytest.raises(DraftVocabError, match="size must be in"):
        DraftVocab.from_counts(np.ones(5), size=6)
    with pytest.raises(DraftVocabError, match="smaller than the 2 always-kept"):
        DraftVocab.from_counts(np.ones(5), size=1, always=(0, 1))
    with pytest.raises(DraftVocabError, match="sorted ascending"):
        DraftVocab(np.array([3, 1]), 5)
    with pytest.raises(DraftVocabError, match=r"lie in \[0, 5\)"):
        DraftVocab(np.array([1, 7]), 5)
    with pytest.raises(DraftVocabError, match="does not exist"):
        DraftVocab.load(tmp_path / "missing.npy")
    with pytest.raises(DraftVocabError, match="indexes 5"):
        DraftVocab(np.array([1, 2]), 5).head(jnp.zeros((6, 2)))
    dv = DraftVocab(np.array([1, 2]), 5)
    dv.save(tmp_path / "v")
    (tmp_path / "v.json").write_text('{"vocab_size": 5, "size": 3}')
    with pytest.raises(DraftVocabError, match="size 3"):
        DraftVocab.load(tmp_path / "v.npy")
