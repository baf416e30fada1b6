"""From a `SpecConfig` to (drafter, draft_params): option checks and the drafter factory.

Methods: "ngram" (prompt lookup, `drafters.NgramDrafter`), "layerskip" (`layer_skip.LayerSkipDrafter`),
"draft" (`draft_model.DraftModelDrafter`; a GGUF, an HF directory or a specjax training run), "medusa"
(`medusa_drafter.MedusaDrafter`, static tree) and "eagle" (`eagle_drafter.EagleDrafter`, EAGLE-2 dynamic
tree); the last two load heads trained by `python -m specjax.train` (`draft_checkpoint=`). Two training-free
token trees: "recycle" (Token Recycling, `recycle.RecycleDrafter`: the target's past top-k per token) and
"lookup" (`lookup_tree.LookupTreeDrafter`: several prompt/output lookup continuations merged as a trie). The two model
drafters can draft over a reduced vocabulary: the `draft_vocab` most frequent target ids of a corpus file
(EOS ids always kept); an EAGLE checkpoint brings the reduced vocabulary it was trained with.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.decode.errors import GenerationError
from specjax.decode.spec.drafters.ngram import NgramDrafter
from specjax.jsonl import jsonl_rows
from specjax.models.draft_vocab import DraftVocab, DraftVocabError
from specjax.models.loading import DEFAULT_MODEL

METHODS = ("ngram", "lookup", "recycle", "layerskip", "draft", "medusa", "eagle")
MAX_RECYCLE_WIDTH = 64  # successors kept per token: the table is [V, width] int32 (64 MiB at V = 262,144)


def check_spec(spec) -> None:
    """Raises GenerationError naming the first bad drafter option of a `SpecConfig`."""
    if spec.method not in METHODS:
        raise GenerationError(f"speculative method {spec.method!r} is unknown (available: {', '.join(METHODS)})")
    if spec.method == "draft" and not spec.draft_model:
        raise GenerationError("the draft method needs a draft model: set draft_model= (a .gguf file or a "
                              "Hugging Face directory)")
    if spec.method in ("medusa", "eagle") and not spec.draft_checkpoint:
        raise GenerationError(f"the {spec.method} method needs trained heads: set draft_checkpoint= (the out_dir of "
                              f"`python -m specjax.train +experiment={spec.method}_gemma3_270m`)")
    if spec.draft_checkpoint and not Path(spec.draft_checkpoint).expanduser().is_dir():
        raise GenerationError(f"draft_checkpoint={spec.draft_checkpoint!r}: no such directory (expected a training "
                              "run's out_dir)")
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
    _check_positive(spec, "lookup_branches", "lookup_depth", "recycle_width")
    if spec.recycle_width > MAX_RECYCLE_WIDTH:
        raise GenerationError(f"recycle_width must be at most {MAX_RECYCLE_WIDTH}, got {spec.recycle_width}")
    layers = spec.layers
    if isinstance(layers, int) and layers < 1 or not isinstance(layers, int) and len(layers) == 0:
        raise GenerationError(f"layers must be a positive count or a non-empty list of layer indices, got {layers!r}")


def _check_positive(spec, *names: str) -> None:
    """Raises GenerationError for the first of `names` that is not a positive integer."""
    for name in names:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GenerationError(f"{name} must be a positive integer, got {value!r}")


def corpus_texts(path: str | Path) -> list[str]:
    """Texts of a corpus file: every string field of each jsonl row, or the whole file as plain text."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise GenerationError(f"draft_vocab_corpus={str(path)!r}: no such file")
    if p.suffix != ".jsonl":
        return [p.read_text(encoding="utf-8", errors="replace")]
    texts = []
    for _, row in jsonl_rows(p, GenerationError):
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
    if spec.method == "lookup":
        from specjax.decode.spec.drafters.lookup_tree import LookupTreeDrafter

        return LookupTreeDrafter(spec.lookup_branches, spec.lookup_depth, spec.max_ngram, spec.min_ngram), ()
    if spec.method == "recycle":
        from specjax.decode.spec.drafters.recycle import RecycleDrafter
        from specjax.decode.spec.trees import TreeError

        try:
            return RecycleDrafter.create(spec.k, spec.recycle_width), ()
        except TreeError as e:
            raise GenerationError(f"recycle: {e}") from None
    ids = draft_vocab(spec, model, tokenizer)
    if spec.method == "layerskip":
        from specjax.decode.spec.drafters.layer_skip import LayerSkipDrafter, reduced_head

        layers = spec.layers
        drafter = (LayerSkipDrafter.early_exit(layers, spec.confidence) if isinstance(layers, int)
                   else LayerSkipDrafter(tuple(layers), spec.confidence))
        drafter.check(model)
        return drafter, (() if ids is None else reduced_head(model, ids))
    if spec.method in ("medusa", "eagle"):
        return _head_drafter(spec, model, progress)
    from specjax.decode.spec.drafters.draft_model import DraftModelDrafter, load_draft_model

    if _is_run_dir(spec.draft_model):
        ckpt = _checkpoint(spec.draft_model, "draft", model, progress)
        return DraftModelDrafter.create(ckpt.module, model, ids, spec.confidence)
    progress(f"loading draft model {spec.draft_model}")
    dtype = "float32" if jnp.dtype(model.dtype) == jnp.float32 else "bfloat16"
    draft = load_draft_model(spec.draft_model, model, dtype)
    return DraftModelDrafter.create(draft, model, ids, spec.confidence)


def _is_run_dir(path: str | None) -> bool:
    """Whether `path` is a specjax training run (or one of its best/<step> directories)."""
    if not path:
        return False
    p = Path(path).expanduser()
    return p.is_dir() and ((p / "best").is_dir() or (p / "meta").is_dir())


def _checkpoint(path: str, kind: str, model, progress):
    """Loads a trained draft of `kind` from a run directory, refusing other kinds and vocabularies."""
    from specjax.models.draft_artifacts import DraftCheckpointError, load_draft_checkpoint

    progress(f"loading {kind} checkpoint {path}")
    try:
        ckpt = load_draft_checkpoint(path, dtype=model.dtype)
    except DraftCheckpointError as e:
        raise GenerationError(f"draft checkpoint {path!r}: {e}") from None
    if ckpt.kind != kind:
        raise GenerationError(f"draft checkpoint {path!r} holds a {ckpt.kind} draft, not {kind}")
    if kind == "draft" and ckpt.config.vocab_size != model.cfg.vocab_size:
        raise GenerationError(f"draft checkpoint {path!r} has a {ckpt.config.vocab_size}-token vocabulary but the "
                              f"target has {model.cfg.vocab_size}")
    if kind != "draft" and ckpt.config.d_model != model.cfg.d_model:
        raise GenerationError(f"{kind} checkpoint {path!r} was trained on features of width {ckpt.config.d_model}, "
                              f"but the target's are {model.cfg.d_model} wide (trained for target {ckpt.target})")
    return ckpt


def _head_drafter(spec, model, progress):
    """(drafter, draft_params) for trained Medusa heads (static tree) or an EAGLE head (dynamic tree)."""
    from specjax.decode.spec.drafters.eagle import EagleDrafter, EagleDrafterError
    from specjax.decode.spec.drafters.medusa import MedusaDrafter, MedusaDrafterError
    from specjax.decode.spec.trees import MEDUSA_63, StaticTree

    ckpt = _checkpoint(spec.draft_checkpoint, spec.method, model, progress)
    vocab = None if ckpt.vocab_ids is None else DraftVocab(np.asarray(ckpt.vocab_ids), model.cfg.vocab_size)
    try:
        if spec.method == "medusa":
            # The paper's tree, its first k nodes (prefix-closed: they are listed best-first).
            if spec.k > len(MEDUSA_63):
                raise GenerationError(f"medusa drafts at most {len(MEDUSA_63)} tree nodes, got k={spec.k}")
            return MedusaDrafter.build(ckpt.module, model, StaticTree.from_paths(MEDUSA_63[:spec.k]), vocab)
        return EagleDrafter.build(ckpt.module, model, vocab, spec.eagle_depth, spec.eagle_top_k, spec.confidence)
    except (MedusaDrafterError, EagleDrafterError) as e:
        raise GenerationError(f"{spec.method}: {e}") from None
