"""Training data: packing, batch order, dev split, corpora, and the self-distillation cache."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx

from specjax.models import Transformer
from specjax.train import distill_data
from specjax.train.config import DataConfig, TrainConfigError
from specjax.train.data import BatchOrder, Document, corpus_documents, pack, read_texts, split_dev
from specjax.train.models import Target
from specjax.train.presets import tiny


def test_pack_cuts_rows_and_shifts_target_flags_into_the_mask():
    docs = [Document(np.array([2, 5, 6, 7]), np.array([0, 0, 1, 1.0])), Document(np.array([2, 8]), np.array([0, 1.0]))]
    rows = pack(docs, 4)
    np.testing.assert_array_equal(rows.tokens, [[2, 5, 6, 7], [2, 8, 0, 0]])
    # mask[t] = 1 when token t+1 is a target; the last column has no next token in its row.
    np.testing.assert_array_equal(rows.mask, [[0, 1, 1, 0], [1, 0, 0, 0]])


def test_batch_order_is_a_pure_function_of_seed_and_index():
    rows = pack([Document(np.arange(3, 3 + 8 * 4), np.ones(32))], 4)
    a, b = BatchOrder(rows, 4, 2, seed=7), BatchOrder(rows, 4, 2, seed=7)
    first = [a.batch(i)["tokens"] for i in range(5)]
    assert first[0].shape == (2, 2, 4)
    np.testing.assert_array_equal(b.batch(3)["tokens"], first[3])  # random access = sequential access
    epoch0 = np.concatenate([x.reshape(-1, 4) for x in first[:2]])
    assert sorted(map(tuple, epoch0)) == sorted(map(tuple, rows.tokens))  # an epoch visits every row once


def test_batch_order_refuses_too_little_data():
    with pytest.raises(TrainConfigError, match="fewer than batch_size=8"):
        BatchOrder(pack([Document(np.arange(8), np.ones(8))], 4), 8, 1, 0)


def test_dev_split_is_fixed_and_disjoint():
    items = [f"p{i}" for i in range(50)]
    train, dev = split_dev(items, 5, seed=1234)
    assert split_dev(items, 5, seed=1234)[1] == dev and not set(train) & set(dev) and len(train) == 45


def test_text_and_jsonl_corpora(tmp_path, byte_tokenizer):
    (tmp_path / "a.txt").write_text("first doc\nline two\n\nsecond doc\n")
    assert read_texts(tmp_path / "a.txt", "text") == ["first doc\nline two", "second doc"]
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n\n{"body": "y"}\n')
    with pytest.raises(TrainConfigError, match=r"a.jsonl:3: no string field 'text'"):
        read_texts(tmp_path / "a.jsonl", "jsonl")
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\n{oops\n')
    with pytest.raises(TrainConfigError, match=r"b.jsonl:2:\d+: invalid JSON"):
        read_texts(tmp_path / "b.jsonl", "jsonl")
    docs = corpus_documents(["ab"], byte_tokenizer)
    np.testing.assert_array_equal(docs[0].target_n, [0, 1, 1])  # BOS is not a target


@pytest.fixture(scope="module")
def tiny_target():
    return Target(Transformer(tiny().replace(max_seq_len=256), rngs=nnx.Rngs(0)), "random:tiny-test", None)


def test_self_distillation_generates_once_then_reads_the_cache(tmp_path, tiny_target, byte_tokenizer, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"prompt number {i}"}) + "\n" for i in range(6)))
    dcfg = DataConfig(prompts=(str(prompts),), num_prompts=4, dev_prompts=2, max_new_tokens=5, gen_batch_size=2,
                      chat=False, cache_dir=str(tmp_path / "cache"))
    target = dataclasses.replace(tiny_target, tokenizer=byte_tokenizer)
    train, dev = distill_data.load_documents(dcfg, target, progress=False)
    assert len(train) == 4 and len(dev) == 2
    for d in train + dev:
        n_prompt = int((d.target_n == 0).sum())
        assert 1 <= d.target_n.sum() <= 5 and d.target_n[n_prompt:].all()  # continuation tokens are the targets
    shards = sorted((tmp_path / "cache").rglob("*.jsonl"))
    assert len(shards) == 3  # 6 prompts in generation batches of 2

    def no_generation(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr("specjax.decode.generate.Generator.generate", no_generation)
    train2, dev2 = distill_data.load_documents(dcfg, target, progress=False)
    for a, b in zip(train + dev, train2 + dev2, strict=True):
        np.testing.assert_array_equal(a.ids_n, b.ids_n)
    other = distill_data.cache_dir("gguf-sha256:other", dcfg)
    assert other != shards[0].parent  # another target never reads these continuations


def test_missing_prompts_file_is_a_clear_error(tmp_path, tiny_target):
    dcfg = DataConfig(prompts=(str(tmp_path / "nope.jsonl"),))
    with pytest.raises(TrainConfigError, match="data.prompts: file not found"):
        distill_data.load_documents(dcfg, dataclasses.replace(tiny_target, tokenizer=object()), progress=False)


@pytest.mark.slow
@pytest.mark.real_model
def test_self_distillation_with_gemma3_270m_is_keyed_by_the_gguf_sha(tmp_path):
    from specjax.models.loading import default_model_path, file_sha256
    from specjax.train.config import TaskConfig
    from specjax.train.models import build_target

    target = build_target(TaskConfig(target="gemma3-270m"))
    assert target.identity == f"gguf-sha256:{file_sha256(default_model_path())}"
    dcfg = DataConfig(prompts=("../shared/data/prompts/alpaca_80.jsonl",), num_prompts=2, dev_prompts=1,
                      max_new_tokens=8, gen_batch_size=2, cache_dir=str(tmp_path))
    train, dev = distill_data.load_documents(dcfg, target, progress=False)
    assert len(train) == 2 and len(dev) == 1
    assert distill_data.cache_dir(target.identity, dcfg).is_dir()
    text = target.tokenizer.decode([int(t) for t, m in zip(train[0].ids_n, train[0].target_n, strict=True) if m])
    assert text.strip()  # the target's own continuation
