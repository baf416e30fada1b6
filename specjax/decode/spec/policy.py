"""When to speculate: the adaptive policy (`Adaptive`) and the loop that runs the rounds it chooses (`run`).

On XLA:CPU a speculative round costs ~1.8–8 plain rounds depending on batch, k and sampling
(docs/performance.md), so speculating only pays when the drafts are good. With a policy the loop
runs plain rounds while the batch's drafts are not expected to pay, then speculative rounds while
they are.

Draft quality is tracked per row as an exponential moving average of the tokens a draft gets
accepted (`PolicyState.accept_ema_b`). Speculative rounds update it from verification. How plain
rounds keep it fresh depends on what a draft costs (`Drafter.cheap`):

* A cheap drafter (n-gram lookup) costs no forward, and the policy counts only rows with a draft.
  Plain rounds update the average for free from a *shadow draft*: a proposal that was not verified
  is compared, token by token, with what the plain rounds then commit — which is exactly what
  verification would have accepted (greedy), or has the same expectation (sampling with a
  deterministic draft: both accept token x with probability p(x)). So a row whose text turns
  repetitive again is noticed without paying for a verify forward. Proposing is not free either (on
  XLA:CPU an n-gram proposal and its shadow cost ~3-7% of a Gemma 3 270M step: dozens of small ops),
  so while the shadows stay under the bar the proposals back off like a costly drafter's probes, from
  every round to every `Adaptive.cheap_max_gap` rounds; a speculative round resets the gap to 1.
* A costly drafter (a network) proposes in speculative rounds only, so a plain round costs what plain
  decoding does. After a gap of plain rounds one *probe* round drafts, and the draft becomes a shadow
  draft for the next plain rounds (no verify forward: a probe costs the draft alone). Its hit count
  replaces the row's average, which is stale after the gap. The gap starts at `probe_every` and doubles
  after each probe that leaves the batch below the bar (up to `max_probe_every`), so on text the
  drafter cannot predict the probes' cost fades: ~log2(n / probe_every) probes in n tokens.

Either way the drafter observes every committed token (`rounds.observe` after both kinds of round).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.decode.backend import profile_for
from specjax.decode.spec.drafters.base import Draft
from specjax.decode.spec.rounds import DEFAULT_EMA_WEIGHT, RoundContext, plain_round, propose, spec_round
from specjax.decode.spec.state import SpecState
from specjax.models.quant import MAX_CHUNKED_ROWS

# A batch-1 verify forward's extra cost per unit of `cost.packed_share` (see estimated_verify_cost).
PACKED_VERIFY_EXTRA = 0.7
# A greedy cheap drafter's starting average in a batch, as a share of the bar (`program.initial_state`):
# under it, so the first round is not a blind speculative one, and close enough that one shadow (weight
# w = `Adaptive.ema_weight`) matching h >= ~bar tokens reaches it: (1 - w) * 0.99 * bar + w * h >= bar.
SHADOW_PRIOR = 0.99


@dataclasses.dataclass(frozen=True)
class Adaptive:
    """When to speculate (static: part of the compiled program).

    The batch speculates when the drafts' expected extra tokens pay for the round where it matters: in
    the row that finishes last. A speculative round runs every row's k+1 positions, so it costs
    `verify_cost` plain rounds for the whole batch however few rows have good drafts, and the loop lasts
    as long as its slowest row. With e_b a row's moving average of accepted draft tokens (0 for a cheap
    drafter's row without a draft) and bar = max(threshold(k), verify_cost(b, k, greedy) - 1), the rule
    (`wants`) is that speculative rounds, at 1 + e_b tokens per row per round, finish the live rows'
    remaining budgets in fewer plain rounds' worth than plain rounds do. At batch 1 it is e >= bar; with
    equal budgets it is min over live rows of e_b >= bar.

    At batch 1 the floor `threshold(k)` decides (it leaves a margin over break-even: the average
    overshoots after lucky streaks). At batch 8 rows that repeat their prompt no longer drag a row that
    does not through verify forwards that cost 2–8 of its plain steps.

    Attributes:
      min_expected_accept: the floor of the bar, capped at 0.75 k so that a short draft length can
        still qualify; None: the backend's (`BackendProfile.spec_min_accept`: 2.0 on XLA:CPU, 1.0 on
        accelerators, where a round costs about a plain step and the floor is all of the bar).
      ema_weight: weight of the newest observation in the moving average.
      probe_every: costly drafters only (cheap ones learn from shadow drafts): plain rounds before the
        first probe (a draft run as a shadow, see the module doc), and the initial gap between probes.
      max_probe_every: the gap doubles after every probe that does not lead to speculation, up to
        this; a speculative round that the bar chose resets it to probe_every.
      verify_cost: what a speculative round costs in plain rounds, drafting included, or None for the
        built-in estimate: `estimated_verify_cost` (measured on XLA:CPU and on one H200; on an
        accelerator at batch 1 it is small and the floor rules) plus the drafter's `draft_cost.draft_cost`.
      min_best_gain: speculation is switched off (no probes, no speculative rounds: plain decoding)
        when even a round whose draft is accepted in full would beat plain rounds by less than this
        factor (`off`), e.g. a 4-token layer-skip draft through the full 262,144-row head on XLA:CPU.
      cheap_max_gap: a cheap drafter proposes every round while its averages reach the bar; else after
        gaps of 1, 2, 4, … plain rounds up to this many (a gap delays noticing repetitive text by at
        most this many tokens).
    """

    min_expected_accept: float | None = None
    ema_weight: float = DEFAULT_EMA_WEIGHT
    probe_every: int = 16
    max_probe_every: int = 256
    verify_cost: float | None = None
    min_best_gain: float = 1.5
    cheap_max_gap: int = 8

    def threshold(self, k: int) -> float:
        """The floor of the bar: min_expected_accept (None: the backend's) capped at 3/4 of k."""
        floor = profile_for().spec_min_accept if self.min_expected_accept is None else self.min_expected_accept
        return min(floor, 0.75 * k)

    def round_cost(self, b: int, k: int, greedy: bool, draft_cost: float = 0.0, packed: float = 0.0,
                   kernel: str = "xla") -> float:
        """A speculative round's cost in plain rounds; `draft_cost` is what the drafter's k-token draft
        costs in plain rounds (0 for cheap drafters), `packed` the target's `cost.packed_share`, `kernel`
        its `cost.product_kernel`."""
        if self.verify_cost is not None:
            return self.verify_cost
        return estimated_verify_cost(b, k, greedy, packed, kernel) + draft_cost

    def bar(self, b: int, k: int, greedy: bool, draft_cost: float = 0.0, packed: float = 0.0,
            kernel: str = "xla") -> float:
        """The expected accepted draft tokens a row needs for a speculative round to pay (see `wants`)."""
        return max(self.threshold(k), self.round_cost(b, k, greedy, draft_cost, packed, kernel) - 1.0)

    def off(self, b: int, k: int, greedy: bool, draft_cost: float, max_accept: int, packed: float = 0.0,
            kernel: str = "xla") -> bool:
        """Whether a round that accepts all it can (max_accept + 1 tokens) gains less than min_best_gain."""
        return max_accept + 1 < self.min_best_gain * self.round_cost(b, k, greedy, draft_cost, packed, kernel)

    def off_note(self, b: int, k: int, greedy: bool, draft_cost: float, max_accept: int, packed: float = 0.0,
                 kernel: str = "xla") -> str:
        """Why speculation is off, for the stats line ("" when it is on)."""
        if not self.off(b, k, greedy, draft_cost, max_accept, packed, kernel):
            return ""
        cost = self.round_cost(b, k, greedy, draft_cost, packed, kernel)
        return (f"speculation off at batch {b}: a round would cost ~{cost:.1f} plain steps for at most "
                f"{max_accept + 1} tokens, a best case below {self.min_best_gain:g}x (override: min_best_gain / "
                f"spec_min_best_gain=0, or verify_cost / spec_verify_cost=)")


def estimated_verify_cost(b: int, k: int, greedy: bool, packed: float = 0.0, kernel: str = "xla") -> float:
    """A speculative round's cost in plain rounds: (b, k+1)-token forward and verification vs a (b, 1) step.

    Measured on 2-core XLA:CPU (docs/benchmarks.md, "verify cost"). Batch 1, whole rounds: Qwen2.5-Coder
    1.5B greedy 2.67 (k=4) / 3.40 (k=8) / 3.86 (k=12), sampled 2.38 / 2.93 / 3.35; Gemma 3 270M k=8
    2.9-3.3 greedy, 2.8-3.6 sampled — modelled as 1.8 + 0.18 k (beyond one row XLA:CPU's GEMM repacks
    the weights). Packed weights (`packed`: `cost.packed_share`, the share of a step's bytes in packed
    decoder matrices) make the plain step a fused matrix-vector dot that the verify forward cannot use:
    the batch-1 estimate grows by PACKED_VERIFY_EXTRA x packed. Batch 8, Gemma: greedy 2.09 / 3.47,
    sampled 2.14 / 7.98 — past MAX_CHUNKED_ROWS block rows the head is one float32 product whose full
    logits sampling also normalises — modelled as 1 + k · per-row cost (packed or not: a batch-8 plain
    step multiplies many rows too).

    Accelerators (one H200, bfloat16, docs/benchmarks.md "Speculation on an H200"): whole rounds of the
    cheap drafters (n-gram, lookup tree, Token Recycling), greedy and sampled alike, k = 8-12 — batch 1:
    0.83-0.97 (Qwen 1.5B) and 1.03-1.25 (Gemma 3 270M) against the one-row step as it was, 1.02 (Qwen)
    and 1.42 (Gemma) for ngram:8 against the step with its products padded to 8 rows (the accelerator
    profile's `min_product_rows`, 1.2x faster); batch 8: 1.60-1.80 and 1.76-2.20. Modelled as
    1 + k · (0.02 + 0.01 (b - 1)): 1.16 / 1.72 at k = 8, batch 1 / 8 (a batch's k+1 positions per row
    stop being free as the rows multiply).

    specjax's native CPU kernels (`kernel`, `cost.product_kernel`; benchmarks/verify_cost.py on Qwen2.5-Coder
    1.5B and Gemma 3 270M q4, greedy and sampled alike, docs/benchmarks.md "Int8 activations"): the float32
    kernel at batch 1 (k + 1 ≤ `BackendProfile.native_max_rows` rows) 1.63-1.85 (k=4) / 2.46-2.85 (k=8),
    modelled as 0.85 + 0.25 k; at batch 8 (72 rows: XLA's blocks) 3.65-5.71 / 5.00-7.67, modelled by the
    dearer (Qwen) as 3.7 + 0.5 k; the int8 activation kernel (every row count), since the weights are mapped
    from the cache file (42nd session: the memory-bound plain step 1.2x faster, the compute-bound verify rows
    not), greedy / sampled: batch 1 Qwen 1.60 / 1.56 (k=4), 2.55 / 2.53 (k=8), Gemma 1.25-1.29 / 1.79-1.90,
    modelled by the dearer as 0.65 + 0.24 k; batch 8 Qwen 3.08 / 3.00, 5.01 / 4.95, Gemma 2.35-2.50 /
    3.73-3.85, modelled as 1.16 + 0.48 k (before the mapping: 0.8 + 0.17 k and 1 + 0.34 k).
    """
    if jax.default_backend() != "cpu":
        return 1.0 + k * (0.02 + 0.01 * (b - 1))
    if kernel == "int8":
        return 0.65 + 0.24 * k if b == 1 else 1.16 + 0.48 * k
    if kernel == "native":
        return 0.85 + 0.25 * k if b * (k + 1) <= profile_for().native_max_rows else 3.7 + 0.5 * k
    if b == 1:
        return (1.8 + 0.18 * k) * (1.0 + PACKED_VERIFY_EXTRA * packed)
    per_row = 0.3 if greedy or b * (k + 1) <= MAX_CHUNKED_ROWS else 0.9
    return 1.0 + per_row * k


def wants(ctx: RoundContext, s: SpecState, has_draft_b=None) -> jax.Array:
    """Whether speculative rounds finish the batch sooner than plain ones (`Adaptive`, the slowest row).

    The loop runs until its last row is done, so what a round buys is the progress of the row that
    finishes last, not the batch's mean. Row b still owes left_b = max_new - count_b tokens (EOS is not
    foreseeable); speculative rounds take it ~left_b / (1 + e_b) rounds, each `round_cost` plain rounds
    (bar = round_cost - 1, floored), plain rounds left_b. Speculate when

        (1 + bar) * max over live rows of left_b / (1 + e_b)  <=  max over live rows of left_b

    At batch 1 this is e >= bar. At batch 8 with equal budgets it is min over live rows of e_b >= bar:
    rows that copy their prompt no longer drag a row that does not through rounds costing 2-8 of its
    plain steps (it finishes last either way, later by their cost). Rows that finish early stop counting.
    """
    live_b = ~s.row.done_b
    gain_b = jnp.where(live_b if has_draft_b is None else live_b & has_draft_b, s.policy.accept_ema_b, 0.0)
    left_b = jnp.where(live_b, ctx.max_new - s.row.count_b, 0).astype(jnp.float32)
    bar = ctx.bar(live_b.shape[0])
    spec_rounds = jnp.max(left_b / (1.0 + gain_b))  # averages of accepted counts: >= 0
    return (1.0 + bar) * spec_rounds <= jnp.max(left_b) * (1.0 + 1e-6)  # e_b == bar (a first try) qualifies


def run(ctx: RoundContext, s: SpecState) -> SpecState:
    """The decode loop after the prefill: rounds until every row is done.

    Without a policy every round speculates; with one, rounds alternate between runs of plain and of
    speculative rounds as `Adaptive` decides.

    Each run of rounds is a while loop, never `lax.cond(chosen, spec, plain)` per round: a conditional's
    operands include the KV cache, and XLA:CPU copied all of it into and out of the conditional every
    round (36 buffers, ~20 ms a round at batch 8); a while loop updates its carry in place. And each kind
    of round appears once in the program (one plain forward and one verify forward besides the prefill's):
    every copy of a forward is compiled again (two more copies of the plain round made Gemma 3 270M's
    n-gram program take ~1.7x as long to compile).
    """
    running = lambda s: s.running
    if ctx.adapt is None:
        return jax.lax.while_loop(running, lambda s: spec_round(ctx, *propose(ctx, s)), s)
    b = s.row.done_b.shape[0]
    if ctx.policy_off(b):
        return jax.lax.while_loop(running, lambda s: plain_round(ctx, s), s)  # even perfect drafts would not pay
    return run_cheap(ctx, s) if ctx.cheap else run_costly(ctx, s)


def backed_off(s: SpecState, max_gap: int) -> SpecState:
    """After a probe: the plain streak restarts and the gap to the next probe doubles (up to max_gap)."""
    pol = s.policy
    return s.replace(policy=pol.replace(plain_streak=jnp.zeros_like(pol.plain_streak),
                                        probe_gap=jnp.minimum(2 * pol.probe_gap, max_gap)))


def run_cheap(ctx: RoundContext, s: SpecState) -> SpecState:
    """A cheap drafter proposes in *probes*: the carry holds the latest proposal, which a speculative
    round verifies (`chosen`) or the next plain round follows as a shadow. While the averages stay under
    the bar, plain rounds propose nothing and the probes back off (`Adaptive.cheap_max_gap`).

    The carry is (state, proposal, its grammar states, owed): `owed` says that the proposal of the last
    probe or speculative round still has to start its shadow, so the next plain round runs whatever the
    policy says.
    """
    adapt = ctx.adapt

    def chosen(c):
        return wants(ctx, c[0], c[1].len_b > 0)

    def shadowing(c):
        return jnp.any(c[0].policy.shadow.len_b > 0) | jnp.any(c[1].len_b > 0)

    def plain(c):  # follows the carried proposal (starting its shadow) and the open shadows, then carries none
        s = plain_round(ctx, c[0], c[1], follow_if=shadowing(c))
        return s, c[1].replace(len_b=jnp.zeros_like(c[1].len_b)), c[2], jnp.zeros((), bool)

    def probe(c):
        s, draft, state_bt = propose(ctx, c[0])
        return backed_off(s, adapt.cheap_max_gap), draft, state_bt, c[3]

    def spec_fn(c):
        s, draft, state_bt = propose(ctx, spec_round(ctx, *c[:3]))
        return s.replace(policy=s.policy.replace(probe_gap=jnp.ones_like(s.policy.probe_gap))), draft, state_bt, c[3]

    def idle(c):
        pol = c[0].policy
        return (pol.plain_streak < pol.probe_gap) & ~wants(ctx, c[0])

    def phases_cheap(c):
        c = jax.lax.while_loop(lambda c: c[0].running & (c[3] | idle(c)), plain, c)
        c = probe(c)
        c = jax.lax.while_loop(lambda c: c[0].running & chosen(c), spec_fn, c)
        # A speculative round or the probe left the streak at 0: the proposal no round verified is owed
        # a plain round, which starts its shadow.
        return (*c[:3], c[0].policy.plain_streak == 0)

    b = s.row.done_b.shape[0]
    empty = propose(ctx, s)  # the carry's structure; its length 0 keeps it from being followed
    carry = (s, empty[1].replace(len_b=jnp.zeros((b,), jnp.int32)), empty[2], jnp.zeros((), bool))
    return jax.lax.while_loop(lambda c: c[0].running, phases_cheap, carry)[0]


def run_costly(ctx: RoundContext, s: SpecState) -> SpecState:
    """A costly drafter drafts in speculative rounds and probes only (`Adaptive.probe_every`)."""
    b, k, adapt = s.row.done_b.shape[0], ctx.k, ctx.adapt
    # What plain rounds follow: the probe's tokens and tree, without a sampled draft's [B, k, V] q.
    tree = jax.eval_shape(lambda s: propose(ctx, s)[1].parent_bk, s) is not None
    no_draft = Draft(tokens_bk=jnp.zeros((b, k), jnp.int32), len_b=jnp.zeros((b,), jnp.int32),
                     parent_bk=jnp.broadcast_to(jnp.arange(-1, k - 1, dtype=jnp.int32), (b, k)) if tree else None)

    def probe_draft(d):  # the loop below makes one trip at most
        s, draft, _ = propose(ctx, d[0])
        follow = no_draft.replace(tokens_bk=draft.tokens_bk, len_b=draft.len_b, parent_bk=draft.parent_bk)
        return s, follow, jnp.ones((), bool)

    def plain_costly(c):
        """A plain round. A probe's (the plain streak reached the gap) drafts first and starts shadows from its
        draft, then backs off; any other follows the open shadows and starts none."""
        probing = c[0].policy.plain_streak >= c[0].policy.probe_gap
        s, draft, _ = jax.lax.while_loop(lambda d: probing & ~d[2], probe_draft, (c[0], no_draft, jnp.zeros((), bool)))
        s = plain_round(ctx, s, draft)
        probed = backed_off(s, adapt.max_probe_every).policy
        return (s.replace(policy=jax.tree.map(lambda new, old: jnp.where(probing, new, old), probed, s.policy)),)

    def spec_costly(c):
        s = spec_round(ctx, *propose(ctx, c[0]))
        return (s.replace(policy=s.policy.replace(probe_gap=jnp.full_like(s.policy.probe_gap, adapt.probe_every))),)

    def phases_costly(c):
        c = jax.lax.while_loop(lambda c: c[0].running & ~wants(ctx, c[0]), plain_costly, c)
        return jax.lax.while_loop(lambda c: c[0].running & wants(ctx, c[0]), spec_costly, c)

    return jax.lax.while_loop(lambda c: c[0].running, phases_costly, (s,))[0]
