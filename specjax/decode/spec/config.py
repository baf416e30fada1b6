"""Speculation options: `SpecConfig` (static: every field is part of the compiled program or drafter).

The adaptive policy's defaults live in `policy.Adaptive`; `SpecConfig.policy()` builds one.
"""

from __future__ import annotations

import dataclasses

from specjax.decode.errors import GenerationError
from specjax.decode.spec.drafters.registry import check_spec
from specjax.decode.spec.policy import Adaptive

__all__ = ["SpecConfig"]


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Speculation options (all static: changing one compiles a new program).

    Attributes:
      k: tokens drafted per round — the chain length, or the node count of a token tree (the
        target forward covers k + 1 positions).
      max_ngram, min_ngram: tail lengths tried by the n-gram (prompt lookup) drafter.
      adaptive: back off to plain one-token rounds while the batch's drafts are not expected to pay
        for a verify round (`policy.Adaptive`); False speculates every round.
      min_expected_accept, ema_weight, probe_every, max_probe_every, verify_cost, min_best_gain,
        cheap_max_gap: the adaptive policy (`policy.Adaptive`); probe_every (costly drafters only: layer skip, draft
        model, Medusa, EAGLE) is how many plain rounds pass before a probe re-measures the drafts, a gap
        that doubles after each probe up to max_probe_every while speculating does not pay; verify_cost
        (None: estimated) is a speculative round's cost in plain rounds, drafting included; speculation
        is off (plain decoding) when a fully accepted round would gain less than min_best_gain.
      method: the drafter: "ngram" (prompt lookup), "lookup" (prompt lookup trees), "recycle" (Token
        Recycling), "layerskip" (the target's first `layers` layers,
        or the listed ones) or "draft" (a separate model loaded from `draft_model`); built by
        `drafters.registry.build_drafter`.
      layers: layer-skip's kept layers: N for early exit after the first N, or a tuple of indices.
      draft_model: the draft model (a .gguf file, a Hugging Face directory or "gemma3-270m").
      draft_vocab: draft over the N most frequent tokens of `draft_vocab_corpus` only (0 = full vocabulary).
      draft_vocab_corpus: text or jsonl file whose token counts choose the reduced draft vocabulary.
      confidence: a model draft stops at its first position whose top draft probability is below
        this (0 = always k tokens); for EAGLE, the least path probability a tree node needs.
      draft_checkpoint: a `python -m specjax.train` run directory holding Medusa or EAGLE heads.
      eagle_depth, eagle_top_k: EAGLE-2 tree depth and children per expanded node (tree budget: k).
      lookup_branches, lookup_depth: the lookup tree's continuations per round and tokens read after each
        (tree budget: k).
      recycle_width: Token Recycling's successors kept per token (the table's width; the template's k nodes
        use ranks below it).
    """

    k: int = 4
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True
    min_expected_accept: float | None = Adaptive.min_expected_accept
    ema_weight: float = Adaptive.ema_weight
    probe_every: int = Adaptive.probe_every
    max_probe_every: int = Adaptive.max_probe_every
    verify_cost: float | None = None
    min_best_gain: float = Adaptive.min_best_gain
    cheap_max_gap: int = Adaptive.cheap_max_gap
    method: str = "ngram"
    layers: int | tuple[int, ...] = 4
    draft_model: str | None = None
    draft_vocab: int = 0
    draft_vocab_corpus: str | None = None
    confidence: float = 0.0
    draft_checkpoint: str | None = None
    eagle_depth: int = 4
    eagle_top_k: int = 4
    lookup_branches: int = 4
    lookup_depth: int = 8
    recycle_width: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise GenerationError(f"k must be a positive integer, got {self.k!r}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise GenerationError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if not 0 < self.ema_weight <= 1:
            raise GenerationError(f"ema_weight must be in (0, 1], got {self.ema_weight!r}")
        if not isinstance(self.probe_every, int) or isinstance(self.probe_every, bool) or self.probe_every < 1:
            raise GenerationError(f"probe_every must be a positive integer, got {self.probe_every!r}")
        if not isinstance(self.max_probe_every, int) or isinstance(self.max_probe_every, bool) or \
                self.max_probe_every < self.probe_every:
            raise GenerationError(f"max_probe_every must be an integer >= probe_every ({self.probe_every}), "
                                  f"got {self.max_probe_every!r}")
        if not isinstance(self.cheap_max_gap, int) or isinstance(self.cheap_max_gap, bool) or self.cheap_max_gap < 1:
            raise GenerationError(f"cheap_max_gap must be a positive integer, got {self.cheap_max_gap!r}")
        if self.verify_cost is not None and not (isinstance(self.verify_cost, (int, float)) and self.verify_cost >= 1):
            raise GenerationError(f"verify_cost must be >= 1 (plain rounds per speculative round), "
                                  f"got {self.verify_cost!r}")
        if self.min_expected_accept is not None and (isinstance(self.min_expected_accept, bool) or not isinstance(
                self.min_expected_accept, (int, float)) or self.min_expected_accept < 0):
            raise GenerationError(f"min_expected_accept must be a number >= 0 or None (the backend's floor), "
                                  f"got {self.min_expected_accept!r}")
        if isinstance(self.min_best_gain, bool) or not isinstance(self.min_best_gain, (int, float)) or \
                self.min_best_gain < 0:
            raise GenerationError(f"min_best_gain must be a number >= 0 (0: never switch speculation off), "
                                  f"got {self.min_best_gain!r}")
        check_spec(self)  # the drafter options

    def drafter_key(self) -> SpecConfig:
        """What the drafter built for these options depends on: this config with the policy's fields at
        their defaults and k at 0 (a new draft length or policy reloads nothing) — except the static
        trees of Medusa and Token Recycling, which have k nodes. Hashable: the generator's drafter cache key."""
        policy = {f.name: f.default for f in dataclasses.fields(self) if f.name in _POLICY_FIELDS}
        return dataclasses.replace(self, **policy, k=self.k if self.method in ("medusa", "recycle") else _DEFAULT_K)

    def policy(self) -> Adaptive | None:
        """The static adaptive policy, or None when every round speculates."""
        if not self.adaptive:
            return None
        cost = None if self.verify_cost is None else float(self.verify_cost)
        floor = None if self.min_expected_accept is None else float(self.min_expected_accept)
        return Adaptive(min_expected_accept=floor, ema_weight=float(self.ema_weight),
                        probe_every=self.probe_every, max_probe_every=self.max_probe_every,
                        verify_cost=cost, min_best_gain=float(self.min_best_gain),
                        cheap_max_gap=self.cheap_max_gap)


_POLICY_FIELDS = frozenset(f.name for f in dataclasses.fields(Adaptive)) | {"adaptive"}
_DEFAULT_K = SpecConfig.k
