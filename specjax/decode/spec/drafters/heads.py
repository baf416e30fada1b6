"""Weights of a head drafter (Medusa, EAGLE) as one jit argument, and the output head it drafts through.

Head drafters produce *features*; tokens come from an output head applied to them. By default that
is the target's own (frozen, tied) head over the whole vocabulary — read from the merged target
inside the program, so it is never copied — or, with a reduced draft vocabulary, the gathered
[N, D] rows of it (`draft_vocab.HeadTable`), which the caller builds once and passes here.
"""

from __future__ import annotations

from typing import Any

from flax import struct

from specjax.models.draft_vocab import HeadTable
from specjax.models.transformer import Transformer


@struct.dataclass
class HeadParams:
    """`draft_params` of the head drafters.

    Attributes:
      weights: the head module's parameters (`nnx.split(module)[1]`).
      vocab: a reduced draft vocabulary's head table, or None for the target's full head.
    """

    weights: Any
    vocab: HeadTable | None = None


def output_head(model: Transformer, params: HeadParams) -> HeadTable:
    """The head the draft scores tokens with: the reduced one if given, else the target's own."""
    if params.vocab is not None:
        return params.vocab
    table_vd = model.head_table()
    return HeadTable.full(table_vd, model.cfg.final_logit_softcap)


def vocab_head(model: Transformer, vocab) -> HeadTable:
    """The reduced head of a `DraftVocab` over this target's head rows (with its logit soft-cap)."""
    table_vd = model.head_table()
    return vocab.head(table_vd, model.cfg.final_logit_softcap)
