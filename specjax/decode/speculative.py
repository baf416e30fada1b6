"""Speculative decoding: draft k tokens, check them with one target forward, all on device.

The program mirrors `loop.generate_program`: prefill the prompts and sample the first
token, then a `lax.while_loop` whose every iteration (a "round") is, for all rows at once:

  1. the drafter proposes k tokens from the row's token history (`drafters.py`): a chain,
     or a token tree of k nodes (`Draft.parent_bk`, `tree.py`);
  2. ONE target forward over the block [last, d_1 … d_k] at positions pos … pos+k (a tree:
     pos + node depth, under its ancestor mask), writing its keys/values at cache slots
     pos … pos+k;
  3. chain or tree verification (`verify.py`) → accepted_b in 0..k and accepted_b + 1 tokens
     (a tree then moves its accepted path's keys/values to slots pos+1 … pos+accepted);
  4. the tokens are emitted one by one through `loop._emit` (EOS, stop strings and the
     length limit end a row mid-block; the rest of the block is discarded) and the row's
     position advances by the number emitted.

Rollback after a rejection costs nothing: slots of rejected drafts hold stale keys/values
at positions the row has not committed, which the attention masks never show, and the
next round overwrites them. Rows accept different amounts (ragged), each with its own pos_b.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.decode import constrain, loop
from specjax.decode import stops as stops_lib
from specjax.decode.draft_cost import draft_cost, max_accept
from specjax.decode.drafters import Drafter, Prefill, is_cheap
from specjax.decode.generate import Completion, GenerateConfig, GenerationError, Generator, Stats
from specjax.decode.sampling import SamplingConfig, sample
from specjax.decode.spec_rounds import Adaptive, SpecState, commit, make_loop
from specjax.models.kv_cache import IN_PLACE_COMPILER_OPTIONS, KVCache
from specjax.models.sharding import LOGICAL_RULES, to_host

__all__ = ["Adaptive", "SpecConfig", "SpecState", "SpecStats", "SpeculativeGenerator", "speculative_program"]


@functools.partial(
    jax.jit, static_argnames=("graphdef", "sampling", "n_out", "eos_ids", "k", "drafter", "adapt"),
    donate_argnames=("cache",), compiler_options=IN_PLACE_COMPILER_OPTIONS)
def speculative_program(
    graphdef,
    params,
    cache: KVCache,
    prompt_bt: jax.Array,
    len_b: jax.Array,
    active_b: jax.Array,
    max_new: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    stop_tables: stops_lib.StopTables | None,
    grammar: constrain.BatchGrammar | None = None,
    draft_params=(),
    *,
    sampling: SamplingConfig,
    n_out: int,
    eos_ids: tuple[int, ...],
    k: int,
    drafter: Drafter,
    adapt: Adaptive | None = None,
) -> SpecState:
    """Prefills right-padded prompts, then runs speculative rounds until every row is done.

    Arguments are those of `loop.generate_program` (the rows' grammars `grammar` included: chain
    drafts are cut at their first refused token and every block position is masked, see
    `spec_rounds.make_loop`), plus the drafter's weights `draft_params` (any pytree, () for none),
    the static draft length k (>= 1) and drafter, and the static adaptive policy (None: every
    round speculates; see `spec_rounds.py`). The cache needs at least T + n_out + k slots: a row's
    last round may write drafted positions up to k past its final token (written, never committed).

    Returns:
      SpecState after the loop (its cache is the donated buffer, updated in place).
    """
    model = nnx.merge(graphdef, params)
    b, t = prompt_bt.shape
    hidden_btd, last_hidden_b1d, cache = loop.prefill(model, cache, prompt_bt, len_b)
    key, sub = jax.random.split(key)
    # The first token comes from the prefill, exactly as in the plain loop.
    first_logits_bv = model.logits(last_hidden_b1d)[:, 0]
    if grammar is not None:
        first_logits_bv = constrain.mask(grammar, grammar.state_b, first_logits_bv)
    first_b = sample(first_logits_bv, sub, sampling, temperature, top_p)
    jax.debug.callback(loop.CLOCK.mark, jnp.max(first_b))  # a scalar: see loop.py

    n_stop = 0 if stop_tables is None else stop_tables.count
    probe_every = 0 if adapt is None else adapt.probe_every
    first_ema = adapt.bar(b, k, sampling.greedy) if adapt is not None and is_cheap(drafter) else 0.0
    hist_bl = jnp.zeros((b, t + n_out), jnp.int32).at[:, :t].set(prompt_bt)
    state = SpecState(
        cache=cache,
        hist_bl=hist_bl,
        last_b=first_b,
        out_bn=jnp.zeros((b, n_out), jnp.int32),
        pos_b=len_b.astype(jnp.int32) - 1,  # _commit advances it to the first token's position
        count_b=jnp.zeros((b,), jnp.int32),
        done_b=~active_b,
        reason_b=jnp.full((b,), loop.REASON_LENGTH, jnp.int32),
        stop_bn=jnp.zeros((b, n_stop), jnp.int32),
        key=key,
        steps=jnp.zeros((), jnp.int32),
        rounds_b=jnp.zeros((b,), jnp.int32),
        plain_rounds_b=jnp.zeros((b,), jnp.int32),
        drafted_bk=jnp.zeros((b, k), jnp.int32),
        accepted_bk=jnp.zeros((b, k), jnp.int32),
        # A cheap drafter's first draft is tried once (its average starts at the bar), then the evidence
        # decides; a costly drafter's first round is a probe (its average starts at 0).
        accept_ema_b=jnp.full((b,), first_ema, jnp.float32),
        plain_streak=jnp.full((), probe_every, jnp.int32),
        probe_gap=jnp.full((), probe_every, jnp.int32),
        draft_tokens_b=jnp.zeros((b,), jnp.int32),
        shadow_bk=jnp.zeros((b, k), jnp.int32),
        shadow_parent_bk=jnp.zeros((b, k), jnp.int32),
        shadow_len_b=jnp.zeros((b,), jnp.int32),
        shadow_hit_b=jnp.zeros((b,), jnp.int32),
        shadow_node_b=jnp.full((b,), -1, jnp.int32),
        draft_state=drafter.init(model, draft_params, Prefill(tokens_bt=prompt_bt, len_b=len_b, hidden_btd=hidden_btd,
                                                              first_b=first_b, num_slots=cache.num_slots)),
        sampling=sampling, temperature=temperature, top_p=top_p,
        gram_b=None if grammar is None else grammar.state_b,
    )
    state = commit(state, first_b[:, None], jnp.ones((b,), jnp.int32), max_new, eos_ids, stop_tables, grammar)
    static_top_p = 1.0 if sampling.top_p >= 1.0 else top_p  # nucleus sort only when asked (as `sample`)

    run = make_loop(model, draft_params, k, drafter, sampling, temperature, static_top_p, top_p, max_new, eos_ids,
                    stop_tables, adapt, grammar)
    return run(state)


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Speculation options (all static: changing one compiles a new program).

    Attributes:
      k: tokens drafted per round — the chain length, or the node count of a token tree (the
        target forward covers k + 1 positions).
      max_ngram, min_ngram: tail lengths tried by the n-gram (prompt lookup) drafter.
      adaptive: back off to plain one-token rounds while the batch's drafts are not expected to pay
        for a verify round (`spec_rounds.Adaptive`); False speculates every round.
      min_expected_accept, ema_weight, probe_every, max_probe_every, verify_cost, min_best_gain: the
        adaptive policy (`spec_rounds.Adaptive`); probe_every (costly drafters only: layer skip, draft
        model, Medusa, EAGLE) is how many plain rounds pass before a probe re-measures the drafts, a gap
        that doubles after each probe up to max_probe_every while speculating does not pay; verify_cost
        (None: estimated) is a speculative round's cost in plain rounds, drafting included; speculation
        is off (plain decoding) when a fully accepted round would gain less than min_best_gain.
      method: the drafter: "ngram" (prompt lookup), "layerskip" (the target's first `layers` layers,
        or the listed ones) or "draft" (a separate model loaded from `draft_model`); built by
        `spec_methods.build_drafter`.
      layers: layer-skip's kept layers: N for early exit after the first N, or a tuple of indices.
      draft_model: the draft model (a .gguf file, a Hugging Face directory or "gemma3-270m").
      draft_vocab: draft over the N most frequent tokens of `draft_vocab_corpus` only (0 = full vocabulary).
      draft_vocab_corpus: text or jsonl file whose token counts choose the reduced draft vocabulary.
      confidence: a model draft stops at its first position whose top draft probability is below
        this (0 = always k tokens); for EAGLE, the least path probability a tree node needs.
      draft_checkpoint: a `python -m specjax.train` run directory holding Medusa or EAGLE heads.
      eagle_depth, eagle_top_k: EAGLE-2 tree depth and children per expanded node (tree budget: k).
    """

    k: int = 4
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True
    min_expected_accept: float = 2.0
    ema_weight: float = 0.3
    probe_every: int = Adaptive.probe_every
    max_probe_every: int = Adaptive.max_probe_every
    verify_cost: float | None = None
    min_best_gain: float = Adaptive.min_best_gain
    method: str = "ngram"
    layers: int | tuple[int, ...] = 4
    draft_model: str | None = None
    draft_vocab: int = 0
    draft_vocab_corpus: str | None = None
    confidence: float = 0.0
    draft_checkpoint: str | None = None
    eagle_depth: int = 4
    eagle_top_k: int = 4

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
        if self.verify_cost is not None and not (isinstance(self.verify_cost, (int, float)) and self.verify_cost >= 1):
            raise GenerationError(f"verify_cost must be >= 1 (plain rounds per speculative round), "
                                  f"got {self.verify_cost!r}")
        if isinstance(self.min_best_gain, bool) or not isinstance(self.min_best_gain, (int, float)) or \
                self.min_best_gain < 0:
            raise GenerationError(f"min_best_gain must be a number >= 0 (0: never switch speculation off), "
                                  f"got {self.min_best_gain!r}")
        from specjax.decode.spec_methods import check_spec

        check_spec(self)  # the drafter options

    def policy(self) -> Adaptive | None:
        """The static adaptive policy, or None when every round speculates."""
        if not self.adaptive:
            return None
        cost = None if self.verify_cost is None else float(self.verify_cost)
        return Adaptive(min_expected_accept=float(self.min_expected_accept), ema_weight=float(self.ema_weight),
                        probe_every=self.probe_every, max_probe_every=self.max_probe_every,
                        verify_cost=cost, min_best_gain=float(self.min_best_gain))


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
    note: why the adaptive policy switched speculation off (`spec_rounds.Adaptive.off`), or "".
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
      drafter: a static `Drafter`; None builds the SpecConfig's method (`spec_methods.build_drafter`).
      draft_params: the drafter's weights (a pytree passed to the program as an argument).

    Example:
      >>> gen = SpeculativeGenerator(model, tokenizer)
      >>> completions, stats = gen.generate(["Hello"], GenerateConfig(max_new_tokens=32), SpecConfig(k=4))
      >>> stats.tau, stats.acceptance_by_position
    """

    def __init__(self, model, tokenizer, drafter: Drafter | None = None, draft_params=(), mesh=None,
                 rules=LOGICAL_RULES):
        super().__init__(model, tokenizer, mesh, rules)
        self.drafter = drafter
        # On a mesh (`Generator`), the drafter's weights are copied to every device.
        self.draft_params = draft_params if self.mesh_plan is None else self.mesh_plan.replicate(draft_params)
        self._drafters = {}  # drafter options -> (drafter, draft_params) built for them (when drafter is None)
        self._draft_costs = {}  # (drafter, id(draft_params), k) -> draft_cost (walks the weights: ~20 ms)

    def generate(
        self,
        prompts: Sequence[str],
        cfg: GenerateConfig = _DEFAULT_GENERATE,
        spec: SpecConfig = _DEFAULT_SPEC,
        progress: Callable[[str], None] = lambda s: None,
    ) -> tuple[list[Completion], SpecStats]:
        """Like `Generator.generate` (same completions, tokenisation, batching and errors)."""
        self._spec = spec
        self._tally = np.zeros((3, spec.k), np.int64)  # rounds (col 0) / drafted / accepted by position
        self._plain_rounds = 0
        self._draft_tokens = 0
        self._decode_tokens = 0
        self._round_time = [0.0, 0]  # seconds after the first token, loop rounds
        self._notes = []  # the policy's notes, one per distinct batch shape
        completions, base = super().generate(prompts, cfg, progress)
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
        note = policy.off_note(b, spec.k, greedy, cost, max_accept(drafter, spec.k))
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
            from specjax.decode.spec_methods import build_drafter

            # Not k, so a new draft length reloads nothing — except Medusa's static tree, which has k nodes.
            what = (spec.method, spec.max_ngram, spec.min_ngram, spec.layers, spec.draft_model, spec.draft_vocab,
                    spec.draft_vocab_corpus, spec.confidence, spec.draft_checkpoint, spec.eagle_depth, spec.eagle_top_k,
                    spec.k if spec.method == "medusa" else 0)
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
        program = self._program(
            ("spec", spec.k, drafter, spec.policy(), *key),
            lambda: self._lower(speculative_program, args, dict(static, k=spec.k, drafter=drafter,
                                                                adapt=spec.policy())),
            f"speculative k={spec.k} for batch {b}, prompt bucket {t}, {n_out} new tokens", progress, stats)
        active_b = np.arange(b) < len(chunk)  # as `_batch_inputs` built it (args[4] may span processes)
        loop.CLOCK.t = None
        t_call = time.perf_counter()
        state = program(*args)
        out = to_host((state.out_bn, state.count_b, state.reason_b, state.steps, state.rounds_b,
                              state.plain_rounds_b, state.drafted_bk, state.accepted_bk, state.draft_tokens_b))
        t_end = time.perf_counter()
        self._cache = state.cache
        first_t = loop.CLOCK.t or t_end
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
