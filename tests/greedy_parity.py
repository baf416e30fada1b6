"""Shared checks for "greedy speculative output equals plain greedy output" (issue 3's rule).

A (k+1)-token verification forward is not bit-identical to k+1 one-token plain steps (float32
sums are reassociated), so where plain greedy decoding stands at a near tie the two may pick
different tokens. `greedy_divergences` tolerates a divergence only at a position whose top-2
logit margin under plain decoding is below `NEAR_TIE` and where both picks are those top two
tokens; it counts and prints such cases. Any other divergence fails the test: it is a bug.

`run_speculative` runs one batch through the speculative program directly, so that a test can
(a) end rows on extra EOS ids (the loop takes its EOS ids as a static argument, normally the
model config's) and (b) read per-row counters: `discarded_b` > 0 says a row stopped strictly
inside an accepted block (tokens verified after its EOS were dropped).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.decode import Completion, GenerateConfig, SpecConfig, SpeculativeGenerator, speculative_program

# float32 reassociation moves Gemma 3 270M's logits (|logit| < ~40) by ~1e-5 relative; 0.01 is
# ~25x that, and still far below the margins of all but genuine ties.
NEAR_TIE = 0.01


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first position where a speculative row left plain greedy decoding (a near tie)."""

    row: int
    position: int  # index into the generated tokens
    margin: float  # plain decoding's top-1 minus top-2 logit there
    plain_token: int | None  # None: that side had stopped (EOS) at this position
    spec_token: int | None


@functools.partial(jax.jit, static_argnums=0)
def _last_logits(graphdef, params, ids_1t):
    model = nnx.merge(graphdef, params)
    hidden_btd, _ = model(ids_1t, jnp.arange(ids_1t.shape[1])[None])
    return model.logits(hidden_btd[:, -1:])[0, 0]


def top2(model, ids: list[int]) -> tuple[tuple[int, int], float]:
    """(top-1 id, top-2 id) and their logit margin after the text `ids` (an uncached forward)."""
    logits_v = np.asarray(_last_logits(*nnx.split(model), jnp.asarray([ids], jnp.int32)))
    second, first = np.argsort(logits_v)[-2:]
    return (int(first), int(second)), float(logits_v[first] - logits_v[second])


def _first_difference(a: Completion, b: Completion) -> int | None:
    """Index of the first generated position where two completions differ (a stop counts), or None."""
    for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)):
        if x != y:
            return i
    if len(a.tokens) == len(b.tokens) and a.finish_reason == b.finish_reason:
        return None
    return min(len(a.tokens), len(b.tokens))


def greedy_divergences(model, prompt_ids: list[list[int]], plain: list[Completion], spec: list[Completion],
                       label: str, eps: float = NEAR_TIE) -> list[Divergence]:
    """Compares speculative rows with plain greedy rows; fails on any divergence but a near tie.

    Args:
      model: the target (its uncached forward measures plain decoding's margin at a divergence).
      prompt_ids: each row's prompt token ids (as the generator encoded them, BOS included).
      plain, spec: completions of the same prompts (same length limit and stop rules).
      label: names the run in messages and in the printed count.
      eps: the near-tie margin (logits).

    Returns:
      The tolerated divergences (at most one per row: after it the rows' texts differ).

    Raises:
      AssertionError: a divergence at a margin >= eps, or where either pick is not a top-2 token.
    """
    found = []
    for row, (ids, p, s) in enumerate(zip(prompt_ids, plain, spec, strict=True)):
        i = _first_difference(p, s)
        if i is None:
            continue
        (first, second), margin = top2(model, list(ids) + p.tokens[:i])
        p_tok = p.tokens[i] if i < len(p.tokens) else None
        s_tok = s.tokens[i] if i < len(s.tokens) else None
        where = (f"{label}: row {row} diverges at generated token {i} (plain {p_tok} / {p.finish_reason}, "
                 f"speculative {s_tok} / {s.finish_reason}); plain top-2 {first}, {second} with margin {margin:.5f}")
        assert margin < eps, f"{where} >= NEAR_TIE {eps}: a real divergence (bug)"
        assert {p_tok, s_tok} - {None} <= {first, second}, f"{where}: a pick outside the top two (bug)"
        found.append(Divergence(row, i, margin, p_tok, s_tok))
    compared = sum(len(p.tokens) for p in plain)
    print(f"{label}: {len(found)} near-tie divergence(s) over {len(plain)} rows, {compared} plain tokens"
          + "".join(f"; row {d.row} @ {d.position} margin {d.margin:.5f}" for d in found))
    return found


@dataclasses.dataclass
class SpecRun:
    """One batch of `run_speculative`: completions plus per-row counters of the final loop state."""

    completions: list[Completion]
    rounds_b: np.ndarray  # target forwards while the row was live
    discarded_b: np.ndarray  # verified tokens of the row's last round dropped after its stop
    tau: float  # decode tokens per round (as SpecStats.tau)


def run_speculative(gen: SpeculativeGenerator, prompts: list[str], cfg: GenerateConfig, spec: SpecConfig,
                    eos_ids: tuple[int, ...] | None = None) -> SpecRun:
    """Runs `prompts` (one batch) through `speculative_program` with gen's drafter, optionally with other
    EOS ids than the model config's.

    A round emits accepted + 1 tokens unless the row stops inside it, and `accepted_bk` sums accepted
    tokens by position (depth for trees), so rounds_b + accepted - (count_b - 1) tokens were dropped
    (the first token comes from the prefill, outside any round).
    """
    assert len(prompts) <= cfg.batch_size and gen.drafter is not None
    ids = gen.encode(prompts, cfg.chat)
    _, args, static = gen._batch_inputs(ids, cfg, gen._stop_tables(cfg.stop), 0, extra_slots=spec.k)
    if eos_ids is not None:
        static = dict(static, eos_ids=tuple(eos_ids))
    state = speculative_program(gen.graphdef, *args, gen.draft_params, **static, k=spec.k, drafter=gen.drafter,
                                adapt=spec.policy())
    out_bn, count_b, reason_b, steps, rounds_b, accepted_bk = jax.device_get(
        (state.row.out_bn, state.row.count_b, state.row.reason_b, state.row.steps, state.counters.rounds_b,
         state.counters.accepted_bk))
    gen._cache = state.row.cache
    n = len(prompts)
    out = (out_bn, count_b, reason_b, steps)
    completions = [gen._completion(prompts[j], out, j, cfg) for j in range(n)]
    decoded_b = np.maximum(count_b[:n] - 1, 0)
    discarded_b = rounds_b[:n] + accepted_bk[:n].sum(axis=1) - decoded_b
    assert (discarded_b >= 0).all(), discarded_b
    return SpecRun(completions, rounds_b[:n], discarded_b, float(decoded_b.sum() / max(rounds_b[:n].sum(), 1)))


def truncate_at(plain: list[Completion], stop_ids: set[int], tokenizer) -> list[Completion]:
    """Plain greedy completions as they would end with `stop_ids` as extra EOS ids: greedy decoding is
    deterministic and each row's text is independent of the batch, so they are the prefixes up to the
    first such token (which EOS handling then drops)."""
    out = []
    for c in plain:
        cut = next((i for i, t in enumerate(c.tokens) if t in stop_ids), None)
        out.append(c if cut is None else dataclasses.replace(c, tokens=c.tokens[:cut], finish_reason="eos",
                                                           text=tokenizer.decode(c.tokens[:cut])))
    return out
