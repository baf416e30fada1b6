"""The host side of speculative decoding: `SpeculativeGenerator` runs batches through `speculative_program`.

It is a `Generator` (same tokenisation, batching, completions and errors) whose batches build the
drafter (`drafters.registry.build_drafter`, once per drafter options), ask the policy whether
speculation can pay at this batch size (else it runs plain decoding's program), and collect the
speculation counters into `SpecStats`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from specjax.decode import loop
from specjax.decode.generate import Completion, GenerateConfig, Generator, Stats
from specjax.decode.spec.config import SpecConfig
from specjax.decode.spec.cost import draft_cost, max_accept, packed_share, product_kernel
from specjax.decode.spec.drafters.base import Drafter
from specjax.decode.spec.program import speculative_program
from specjax.models.sharding import LOGICAL_RULES, to_host

__all__ = ["SpecStats", "SpeculativeGenerator"]


@dataclasses.dataclass
class SpecStats(Stats):
    """`Stats` plus speculation counters (summed over all rows of all batches).

    tau: tokens per target forward in the decode rounds, COUNTING the correction/bonus
      token each round emits — plain decoding has tau = 1, and k-token drafts at most k + 1.
      The prefill forward and the first token it samples are left out of both counts.
    rounds: target forwards of the decode rounds, summed over rows (a row's count stops
      when it finishes, even though finished rows ride along in a batch).
    acceptance_by_position: for draft position i, the fraction of rounds that proposed a
      token there in which it was accepted (a chain: position i needs all before it). For
      token trees, position i is depth i + 1: rounds whose tree reached that depth, and those
      that accepted a node there.
    draft_rate: fraction of rounds that verified a draft.
    plain_rate: fraction of rounds that were plain one-token rounds (adaptive drafting backed off).
    mean_draft_len: draft tokens (tree nodes) verified per round (plain rounds count 0): the
      chosen lengths, e.g. after `tree.confident_length` cut drafts short.
    ms_per_round: mean time of one loop iteration (one target forward for the batch), last batch.
    note: why the adaptive policy switched speculation off (`policy.Adaptive.off`), or "".
    The inherited ms_per_token is decode time per generated token of a row (decode time ×
    rows / decode tokens), comparable with the plain loop's ms per step.
    """

    k: int = 0
    rounds: int = 0
    tau: float = 0.0
    acceptance_by_position: tuple[float, ...] = ()
    draft_rate: float = 0.0
    plain_rate: float = 0.0
    mean_draft_len: float = 0.0
    ms_per_round: float = 0.0
    note: str = ""

    def line(self) -> str:
        acc = " ".join(f"{a:.2f}" for a in self.acceptance_by_position)
        return (super().line() + f"; speculative k={self.k}: tau {self.tau:.2f} tokens/forward over "
                f"{self.rounds} rounds, acceptance by position [{acc}], drafted in {self.draft_rate:.0%}, "
                f"plain rounds {self.plain_rate:.0%}, mean draft {self.mean_draft_len:.2f}, "
                f"{self.ms_per_round:.1f} ms/round" + (f"; {self.note}" if self.note else ""))


_DEFAULT_GENERATE, _DEFAULT_SPEC = GenerateConfig(), SpecConfig()


class SpeculativeGenerator(Generator):
    """`Generator` whose batches run `speculative_program`.

    Args:
      model, tokenizer: the target, as for `Generator`.
      drafter: a static `Drafter`; None builds the SpecConfig's method (`drafters.registry.build_drafter`).
      draft_params: the drafter's weights (a pytree passed to the program as an argument).

    Example:
      >>> gen = SpeculativeGenerator(model, tokenizer)
      >>> completions, stats = gen.generate(["Hello"], GenerateConfig(max_new_tokens=32), SpecConfig(k=4))
      >>> stats.tau, stats.acceptance_by_position
    """

    def __init__(self, model, tokenizer, drafter: Drafter | None = None, draft_params=(), mesh=None,
                 rules=LOGICAL_RULES, profile=None):
        super().__init__(model, tokenizer, mesh, rules, profile)
        self.drafter = drafter
        # On a mesh (`Generator`), the drafter's weights are copied to every device.
        self.draft_params = draft_params if self.mesh_plan is None else self.mesh_plan.replicate(draft_params)
        self._drafters = {}  # drafter options -> (drafter, draft_params) built for them (when drafter is None)
        self._draft_costs = {}  # (drafter, id(draft_params), k) -> draft_cost (walks the weights: ~20 ms)
        # as the program's RoundContext derives them
        self._packed, self._kernel = packed_share(model, self.profile), product_kernel(model, self.profile)

    def generate(
        self,
        prompts: Sequence[str],
        cfg: GenerateConfig = _DEFAULT_GENERATE,
        spec: SpecConfig = _DEFAULT_SPEC,
        progress: Callable[[str], None] = lambda s: None,
        on_batch: Callable[[list[Completion]], None] | None = None,
    ) -> tuple[list[Completion], SpecStats]:
        """Like `Generator.generate` (same completions, tokenisation, batching and errors)."""
        self._spec = spec
        self._tally = np.zeros((3, spec.k), np.int64)  # rounds (col 0) / drafted / accepted by position
        self._plain_rounds = 0
        self._draft_tokens = 0
        self._decode_tokens = 0
        self._round_time = [0.0, 0]  # seconds after the first token, loop rounds
        self._notes = []  # the policy's notes, one per distinct batch shape
        completions, base = super().generate(prompts, cfg, progress, on_batch)
        rounds, drafted_k, accepted_k = int(self._tally[0, 0]), self._tally[1], self._tally[2]
        return completions, SpecStats(
            **dataclasses.asdict(base), k=spec.k, rounds=rounds,
            tau=self._decode_tokens / max(rounds, 1),
            acceptance_by_position=tuple(float(a / max(d, 1)) for a, d in zip(accepted_k, drafted_k, strict=True)),
            draft_rate=float(drafted_k[0] / max(rounds, 1)),
            plain_rate=self._plain_rounds / max(rounds, 1),
            mean_draft_len=self._draft_tokens / max(rounds, 1),
            ms_per_round=self._round_time[0] * 1e3 / max(self._round_time[1], 1),
            note="; ".join(self._notes),
        )

    def _policy_off(self, spec: SpecConfig, drafter, draft_params, b: int, greedy: bool) -> bool:
        """Whether the policy switches speculation off for this batch size; records why."""
        policy = spec.policy()
        if policy is None:
            return False
        key = (drafter, id(draft_params), spec.k)  # draft_params stay alive in self (_drafters or draft_params)
        if key not in self._draft_costs:
            self._draft_costs[key] = draft_cost(drafter, self.model, draft_params, spec.k)
        cost = self._draft_costs[key]
        note = policy.off_note(b, spec.k, greedy, cost, max_accept(drafter, spec.k), self._packed, self._kernel)
        if note and note not in self._notes:
            self._notes.append(note)
        return bool(note)

    def _run_plain(self, chunk, cfg: GenerateConfig, stops, progress, stats: Stats, seed_offset: int):
        """Plain decoding's own program, counted as plain rounds (speculation is off for this batch)."""
        out, first_t, t_call = super()._run_batch(chunk, cfg, stops, progress, stats, seed_offset)
        decode_tokens = int(out[1].sum()) - len(chunk)
        self._decode_tokens += decode_tokens
        self._tally[0] += decode_tokens
        self._plain_rounds += decode_tokens
        self._round_time[0] += time.perf_counter() - first_t
        self._round_time[1] += int(out[3]) - 1
        return out, first_t, t_call

    def _run_batch(self, chunk, cfg: GenerateConfig, stops, progress, stats: Stats, seed_offset: int):
        spec: SpecConfig = self._spec
        drafter, draft_params = self.drafter, self.draft_params
        if drafter is None:
            from specjax.decode.spec.drafters.registry import build_drafter

            what = spec.drafter_key()
            if what not in self._drafters:
                drafter, draft_params = build_drafter(spec, self.model, self.tokenizer, progress)
                if self.mesh_plan is not None:
                    draft_params = self.mesh_plan.replicate(draft_params)
                self._drafters[what] = drafter, draft_params
            drafter, draft_params = self._drafters[what]
        if self._policy_off(spec, drafter, draft_params, self._rows(cfg), cfg.sampling.greedy):
            return self._run_plain(chunk, cfg, stops, progress, stats, seed_offset)
        key, args, static = self._batch_inputs(chunk, cfg, stops, seed_offset, extra_slots=spec.k)
        args = (*args, draft_params)
        b, t, _, n_out = key[:4]
        active_b = np.arange(b) < len(chunk)  # as `_batch_inputs` built it (args[2] may span processes)
        program = self._program(
            ("spec", spec.k, drafter, spec.policy(), *key),
            lambda: self._lower(speculative_program, args, dict(static, k=spec.k, drafter=drafter,
                                                                adapt=spec.policy())),
            f"speculative k={spec.k} for batch {b}, prompt bucket {t}, {n_out} new tokens", progress, stats)
        loop.CLOCK.t = None
        t_call = time.perf_counter()
        state = program(*args)
        row, cnt = state.row, state.counters
        out = to_host((row.out_bn, row.count_b, row.reason_b, row.steps, cnt.rounds_b,
                       cnt.plain_rounds_b, cnt.drafted_bk, cnt.accepted_bk, cnt.draft_tokens_b))
        t_end = time.perf_counter()
        self._cache = state.row.cache
        first_t = loop.CLOCK.first_token_time(t_call, t_end)
        out_bn, count_b, reason_b, steps, rounds_b, plain_rounds_b, drafted_bk, accepted_bk, draft_tokens_b = out
        decode_tokens = int(np.maximum(count_b[active_b] - 1, 0).sum())
        self._decode_tokens += decode_tokens
        self._tally[0] += int(rounds_b.sum())
        self._plain_rounds += int(plain_rounds_b.sum())
        self._draft_tokens += int(draft_tokens_b.sum())
        self._tally[1] += drafted_bk.sum(axis=0)
        self._tally[2] += accepted_bk.sum(axis=0)
        self._round_time[0] += t_end - first_t  # over all batches, like the decode stats
        self._round_time[1] += int(steps)
        if decode_tokens > 0:
            # Per row, like the plain loop's ms/step: decode time over tokens per row.
            stats.add_decode(t_end - first_t, decode_tokens, max(decode_tokens // len(chunk), 1))
        return (out_bn, count_b, reason_b, steps), first_t, t_call
