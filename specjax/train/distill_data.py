"""Training data: the target's own continuations of prompts (self-distillation), or a corpus.

Self-distillation runs specjax's batched decoder (`Generator`) over the prompts, greedy, and
caches each generation batch as one jsonl shard under
``<cache>/distill/<key>/<sha of the batch's prompts>.jsonl``. The key hashes the target's identity
(the GGUF file's SHA-256), the generation settings and the format version, so another target or
setting never reads these continuations; an interrupted run resumes at the first missing shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specjax.train.config import DataConfig, TrainConfigError
from specjax.train.data import Document, corpus_documents, read_texts, split_dev

_FORMAT = "1"


def read_prompts(files: tuple[str, ...]) -> list[str]:
    """Prompts (field `prompt`) of jsonl files, in file and line order."""
    prompts = []
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise TrainConfigError(f"data.prompts: file not found: {path}")
        for lineno, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if not line.strip():
                continue
            try:
                prompts.append(json.loads(line)["prompt"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise TrainConfigError(f"{path}:{lineno}: expected a JSON object with a 'prompt' string") from None
    return prompts


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def cache_dir(identity: str, dcfg: DataConfig) -> Path:
    """The shard directory for this target and these generation settings."""
    from specjax.models.loading import cache_root

    root = Path(dcfg.cache_dir) if dcfg.cache_dir else cache_root() / "distill"
    key = _sha({"target": identity, "max_new_tokens": dcfg.max_new_tokens, "chat": dcfg.chat,
                "sampling": "greedy", "format": _FORMAT})[:24]
    return root / key


def generate_documents(target, prompts: list[str], dcfg: DataConfig, what: str,
                       progress: bool = True, log: Callable[[str], None] = lambda s: None) -> list[Document]:
    """Continuations of `prompts` by the target (cached per batch); prompt tokens are not targets."""
    from specjax.decode.generate import GenerateConfig, Generator

    folder = cache_dir(target.identity, dcfg)
    folder.mkdir(parents=True, exist_ok=True)
    step = dcfg.gen_batch_size
    batches = [prompts[i:i + step] for i in range(0, len(prompts), step)]
    gen, docs = None, []
    for chunk in tqdm(batches, desc=f"self-distill {what}", disable=not progress, unit="batch"):
        shard = folder / f"{_sha(chunk)[:24]}.jsonl"
        if not shard.is_file():
            if gen is None:
                gen = Generator(target.model, target.tokenizer)
            gcfg = GenerateConfig(max_new_tokens=dcfg.max_new_tokens, batch_size=step, chat=dcfg.chat)
            completions, stats = gen.generate(chunk, gcfg)
            prompt_ids = gen.encode(chunk, dcfg.chat)
            lines = [json.dumps({"prompt": c.prompt, "prompt_ids": p, "completion_ids": c.tokens,
                                 "finish": c.finish_reason}) for c, p in zip(completions, prompt_ids, strict=True)]
            tmp = shard.with_name(shard.name + f".tmp{os.getpid()}")
            tmp.write_text("\n".join(lines) + "\n")
            tmp.replace(shard)  # atomic: a killed run never leaves a half shard
            log(f"generated {len(chunk)} continuations: {stats.line()}")
        for line in shard.read_text(encoding="utf-8").split("\n"):
            if not line:
                continue
            row = json.loads(line)
            p, c = row["prompt_ids"], row["completion_ids"]
            docs.append(Document(np.asarray(p + c, np.int32),
                                 np.concatenate([np.zeros(len(p)), np.ones(len(c))]).astype(np.float32)))
    return docs


def synthetic_documents(n_docs: int, vocab: int, length: int, seed: int) -> list[Document]:
    """Random documents with learnable structure (each repeats a short random motif).

    For tests and abstract checks with a random target, where no tokenizer or text exists.
    """
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        motif = rng.integers(3, vocab, size=int(rng.integers(2, 6)))
        ids = np.concatenate([[2], np.resize(motif, length - 1)]).astype(np.int32)
        target = np.ones(length, np.float32)
        target[0] = 0.0
        docs.append(Document(ids, target))
    return docs


def load_documents(dcfg: DataConfig, target, progress: bool = True, log: Callable[[str], None] = lambda s: None,
                   tokenizer=None) -> tuple[list[Document], list[Document]]:
    """(train documents, dev documents) for the configured source; the dev split is fixed by data.seed."""
    tokenizer = tokenizer or target.tokenizer
    if dcfg.source == "synthetic":
        docs = synthetic_documents(dcfg.num_prompts + dcfg.dev_prompts, target.model.cfg.vocab_size,
                                   dcfg.max_new_tokens, dcfg.seed)
        return docs[dcfg.dev_prompts:], docs[:dcfg.dev_prompts]
    if tokenizer is None:
        raise TrainConfigError(f"data.source={dcfg.source!r} needs a target with a tokenizer (task.target)")
    if dcfg.source == "self_distill":
        train_p, dev_p = split_dev(read_prompts(dcfg.prompts), dcfg.dev_prompts, dcfg.seed)
        train_p = train_p[:dcfg.num_prompts]
        dev = generate_documents(target, dev_p, dcfg, "dev", progress, log)
        return generate_documents(target, train_p, dcfg, "train", progress, log), dev
    texts = read_texts(dcfg.path, dcfg.source, dcfg.text_field)
    n_dev = max(1, int(round(len(texts) * dcfg.dev_fraction)))
    if len(texts) <= n_dev:
        raise TrainConfigError(f"data.path {dcfg.path} has {len(texts)} documents: too few for a dev split")
    train_t, dev_t = split_dev(texts, n_dev, dcfg.seed)
    return corpus_documents(train_t, tokenizer), corpus_documents(dev_t, tokenizer)
