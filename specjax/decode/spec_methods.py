"""From a `SpecConfig` to (drafter, draft_params): option checks and the drafter factory.

Methods: "ngram" (prompt lookup, `drafters.NgramDrafter`), "layerskip" (`layer_skip.LayerSkipDrafter`)
and "draft" (`draft_model.DraftModelDrafter`). The two model drafters can draft over a reduced
vocabulary: the `draft_vocab` most frequent target ids of a corpus file (EOS ids always kept).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.decode.drafters import NgramDrafter
from specjax.decode.generate import GenerationError
from specjax.models.draft_vocab import DraftVocab, DraftVocabError
from specjax.models.loading import DEFAULT_MODEL

METHODS = ("ngram", "layerskip", "draft")


def check_spec(spec) -> None:
    """Raises GenerationError naming the first bad drafter option of a `SpecConfig`."""
    if spec.method not in METHODS:
        raise GenerationError(f"speculative method {spec.method!r} is unknown (available: {', '.join(METHODS)})")
    if spec.method == "draft" and not spec.draft_model:
        raise GenerationError("the draft method needs a draft model: set draft_model= (a .gguf file or a "
                              "Hugging Face directory)")
    if spec.draft_model and spec.draft_model != DEFAULT_MODEL and not Path(spec.draft_model).expanduser().exists():
        raise GenerationError(f"draft_model={spec.draft_model!r}: no such file or directory (expected a .gguf file "
                              "or a Hugging Face directory)")
    if not isinstance(spec.draft_vocab, int) or spec.draft_vocab < 0:
        raise GenerationError(f"draft_vocab must be an integer >= 0 (0 = full vocabulary), got {spec.draft_vocab!r}")
    if spec.draft_vocab and spec.draft_vocab_corpus is None:
        raise GenerationError(f"draft_vocab={spec.draft_vocab} needs draft_vocab_corpus= (a text or jsonl file whose "
                              "token counts choose the kept ids)")
    if not 0.0 <= spec.confidence < 1.0:
        raise GenerationError(f"confidence must be in [0, 1) (0 = off), got {spec.confidence!r}")
    layers = spec.layers
    if isinstance(layers, int) and layers < 1 or not isinstance(layers, int) and len(layers) == 0:
        raise GenerationError(f"layers must be a positive count or a non-empty list of layer indices, got {layers!r}")


def corpus_texts(path: str | Path) -> list[str]:
    """Texts of a corpus file: every string field of each jsonl row, or the whole file as plain text."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise GenerationError(f"draft_vocab_corpus={str(path)!r}: no such file")
    if p.suffix != ".jsonl":
        return [p.read_text(encoding="utf-8", errors="replace")]
    texts = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise GenerationError(f"{p}:{n}:{e.colno}: invalid JSON ({e.msg})") from None
            if isinstance(row, dict):
                texts.extend(v for v in row.values() if isinstance(v, str))
    return texts


def draft_vocab(spec, model, tokenizer) -> DraftVocab | None:
    """The reduced draft vocabulary (most frequent ids of the corpus, EOS ids always kept), or None."""
    if not spec.draft_vocab:
        return None
    v = model.cfg.vocab_size
    counts = np.zeros((v,), np.int64)
    for text in corpus_texts(spec.draft_vocab_corpus):
        counts += np.bincount(np.asarray(tokenizer.encode(text, add_bos=False), np.int64), minlength=v)[:v]
    try:
        return DraftVocab.from_counts(counts, spec.draft_vocab, model.cfg.eos_ids)
    except DraftVocabError as e:
        raise GenerationError(f"draft_vocab={spec.draft_vocab}: {e}") from None


def build_drafter(spec, model, tokenizer, progress: Callable[[str], None] = lambda s: None):
    """(drafter, draft_params) for `spec.method` proposing to `model`.

    Raises:
      GenerationError: bad layers, an unreadable draft model or corpus, mismatched vocabularies.
    """
    if spec.method == "ngram":
        return NgramDrafter(max_ngram=spec.max_ngram, min_ngram=spec.min_ngram), ()
    ids = draft_vocab(spec, model, tokenizer)
    if spec.method == "layerskip":
        from specjax.decode.layer_skip import LayerSkipDrafter, reduced_head

        layers = spec.layers
        drafter = (LayerSkipDrafter.early_exit(layers, spec.confidence) if isinstance(layers, int)
                   else LayerSkipDrafter(tuple(layers), spec.confidence))
        drafter.check(model)
        return drafter, (() if ids is None else reduced_head(model, ids))
    from specjax.decode.draft_model import DraftModelDrafter, load_draft_model

    progress(f"loading draft model {spec.draft_model}")
    dtype = "float32" if jnp.dtype(model.dtype) == jnp.float32 else "bfloat16"
    draft = load_draft_model(spec.draft_model, model, dtype)
    return DraftModelDrafter.create(draft, model, ids, spec.confidence)
