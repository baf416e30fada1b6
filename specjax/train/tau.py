"""Periodic τ on dev prompts: speculative decoding with the run's current draft, inside the training loop.

Teacher-forced dev accuracy says how often a head's first guess is right; what speculative decoding
gains is τ, the tokens each target forward produces (the correction / bonus token included, so plain
decoding has τ = 1). `DevTau` runs specjax's `SpeculativeGenerator` (greedy, the real decode program)
with a drafter built from the parameters in memory (no checkpoint round trip) on the first dev
documents' prompts, exactly as `spec_methods.build_drafter` builds one from a saved run:

* ``draft``: `DraftModelDrafter` (a chain of k tokens);
* ``medusa``: `MedusaDrafter` on the first k nodes of the Medusa paper's 63-node tree;
* ``eagle``: `EagleDrafter` (EAGLE-2 dynamic tree, depth 4, top-4, k nodes) over the run's reduced
  draft vocabulary.

Prompts are token ids (the dev documents' leading non-target tokens: for self-distilled data exactly the
chat-templated prompt the target answered), so no tokenizer is needed. Adaptive back-off is off: τ
measures the drafter, every round drafts. The drafter (static, part of the compiled program's key) is
built once; later evaluations swap only its weights, so the program compiles once per run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from specjax.decode.generate import Completion, GenerateConfig
from specjax.decode.spec.config import SpecConfig
from specjax.decode.spec.driver import SpeculativeGenerator
from specjax.models.sharding import to_host
from specjax.train.config import TrainConfig
from specjax.train.data import Document
from specjax.train.task import Task
from specjax.train.tasks import task_module

EAGLE_DEPTH, EAGLE_TOP_K = 4, 4


def default_k(kind: str) -> int:
    """Draft tokens per round when `tau_k` is 0: a 4-token chain for a draft model, 10 tree nodes for heads."""
    return 4 if kind == "draft" else 10


def prompt_ids(docs: Sequence[Document], n: int, max_len: int = 64) -> list[list[int]]:
    """The first n documents' prompts: their leading non-target tokens.

    Corpus documents have no prompt (every token but BOS is a target): their first half, at most
    `max_len` tokens, stands in.
    """
    out = []
    for d in docs[:n]:
        targets = np.flatnonzero(d.target_n > 0)
        cut = int(targets[0]) if targets.size else len(d.ids_n)
        if cut < 2:
            cut = max(1, min(len(d.ids_n) // 2, max_len))
        out.append([int(t) for t in d.ids_n[:cut]])
    return out


class _TokenPromptGenerator(SpeculativeGenerator):
    """A SpeculativeGenerator fed token-id prompts; completions keep token ids only (no tokenizer needed)."""

    def encode(self, prompts, chat: bool) -> list[list[int]]:
        del chat  # the ids are already what the target saw
        return [list(p) for p in prompts]

    def _stop_tables(self, stop):
        return None  # no stop strings (they would need the tokenizer's bytes)

    def _completion(self, prompt, out, j: int, cfg: GenerateConfig) -> Completion:
        out_bn, count_b, _, _ = out
        return Completion(prompt="", text="", tokens=[int(x) for x in out_bn[j, :count_b[j]]], finish_reason="")


def build_run_drafter(kind: str, module, model, vocab_ids, k: int):
    """(drafter, draft_params, depth) for a trained module on `model`, as `spec_methods` builds them."""
    if kind == "draft":
        from specjax.decode.spec.drafters.draft_model import DraftModelDrafter

        drafter, params = DraftModelDrafter.create(module, model)
        return drafter, params, k
    from specjax.models.draft_vocab import DraftVocab

    vocab = None if vocab_ids is None else DraftVocab(np.asarray(vocab_ids), model.cfg.vocab_size)
    if kind == "medusa":
        from specjax.decode.spec.drafters.medusa import MedusaDrafter
        from specjax.decode.spec.trees import MEDUSA_63, StaticTree

        tree = StaticTree.from_paths(MEDUSA_63[:k])
        drafter, params = MedusaDrafter.build(module, model, tree, vocab)
        return drafter, params, tree.max_depth
    from specjax.decode.spec.drafters.eagle import EagleDrafter

    drafter, params = EagleDrafter.build(module, model, vocab, EAGLE_DEPTH, EAGLE_TOP_K)
    return drafter, params, EAGLE_DEPTH


class DevTau:
    """τ of the current draft on dev prompts (see the module docstring).

    Args:
      cfg: the run (tau_prompts, tau_new_tokens, tau_k).
      model: the frozen target Transformer.
      task: the run's Task (kind, graphdef, EAGLE vocabulary in its meta).
      prompts: token-id prompts (`prompt_ids`).
    """

    def __init__(self, cfg: TrainConfig, model, task: Task, prompts: list[list[int]]):
        self.model, self.task, self.prompts = model, task, prompts
        self.k = cfg.tau_k or default_k(task.kind)
        self.gen_cfg = GenerateConfig(max_new_tokens=cfg.tau_new_tokens, batch_size=len(prompts))
        self.spec = SpecConfig(k=self.k, adaptive=False)
        self.gen = None

    def __call__(self, params, frozen) -> dict[str, float]:
        """{"tau", "accept_d1" … "accept_dN" (by draft depth), "draft_rate", "tau_s"} for these parameters."""
        t0 = time.perf_counter()
        # Host copies: the trainer's arrays live on its mesh, the decode program on the target's device.
        # Of the frozen arrays only a draft model's untrained rest belongs to the module (not the target).
        needed = {k: v for k, v in frozen.items() if k == "draft_rest"}
        module = task_module(self.task, to_host(params), to_host(needed))
        drafter, draft_params, depth = build_run_drafter(self.task.kind, module, self.model,
                                                         self.task.meta.get("vocab_ids"), self.k)
        if self.gen is None:
            self.gen = _TokenPromptGenerator(self.model, None, drafter, draft_params)
            self.depth = depth
        else:
            self.gen.draft_params = draft_params  # same drafter: the compiled program is reused
        _, stats = self.gen.generate(self.prompts, self.gen_cfg, self.spec)
        out = {"tau": stats.tau, "draft_rate": stats.draft_rate}
        out.update({f"accept_d{i + 1}": a for i, a in enumerate(stats.acceptance_by_position[:self.depth])})
        out["tau_s"] = time.perf_counter() - t0
        return out
