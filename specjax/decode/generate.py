"""Host side of generation: tokenize, bucket, batch, run the on-device program, detokenize."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from specjax.compile_cache import ENV, persistent_cache_hits
from specjax.decode import constrain, loop
from specjax.decode.backend import BackendProfile, profile_for
from specjax.decode.errors import GenerationError
from specjax.decode.grammar_spec import GrammarSpec, compile_spec
from specjax.decode.inputs import BatchInputs
from specjax.decode.mesh import MeshPlan
from specjax.decode.sampling import SamplingConfig
from specjax.decode.shapes import bucket, prompt_bucket
from specjax.decode.stops import StopTables, build_stop_tables, truncate_at_stop
from specjax.models import sharding
from specjax.models.transformer import Transformer

if TYPE_CHECKING:
    from specjax.models.tokenizer import Tokenizer

FINISH_REASONS = {loop.REASON_LENGTH: "length", loop.REASON_EOS: "eos", loop.REASON_STOP: "stop",
                  loop.REASON_GRAMMAR: "grammar", loop.REASON_CLOSED: "closed"}


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """Options of one generate call.

    Attributes:
      max_new_tokens: per-sequence limit on generated tokens.
      sampling: greedy / temperature / top-k / top-p / seed.
      stop: stop strings; generation of a row ends once its text contains one, and the
        returned text ends before it.
      batch_size: rows per device program; a partial last batch is padded (no recompile).
      chat: wrap each prompt in the model's chat template (Gemma turn markers).
      ignore_eos: keep generating past EOS (benchmarks with a fixed length).
      grammar: constrain every output to a grammar (`GrammarSpec`: Lark, JSON Schema or regex), or one
        spec per prompt (a tuple as long as the prompt list; rows of a batch may differ). A row ends
        with finish_reason "grammar" once its text is a complete sentence that nothing can extend
        (the grammar allows only EOS), with "eos" when the model chose EOS where the grammar allowed it.
      close_grammar: with a grammar, make every row end complete within max_new_tokens: a token after which
        the row could no longer reach a complete sentence in the tokens left is replaced by the first token
        of the shortest completion (`constrain.close`), and the row ends with finish_reason "closed". Output
        differs from unclosed decoding only in the last tokens of a row that would otherwise be cut; False
        keeps the cut (finish_reason "length").
    """

    max_new_tokens: int = 128
    sampling: SamplingConfig = SamplingConfig()
    stop: tuple[str, ...] = ()
    batch_size: int = 1
    chat: bool = False
    ignore_eos: bool = False
    grammar: GrammarSpec | tuple[GrammarSpec, ...] | None = None
    close_grammar: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise GenerationError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        specs = self.grammar if isinstance(self.grammar, tuple) else (self.grammar,)
        if self.grammar is not None and not all(isinstance(g, GrammarSpec) for g in specs):
            raise GenerationError("grammar must be a GrammarSpec or a tuple of them (one per prompt)")

    def row_grammars(self, n_prompts: int) -> list[GrammarSpec] | None:
        """The grammar of each of the first n_prompts prompts, or None when generation is unconstrained."""
        if self.grammar is None:
            return None
        if not isinstance(self.grammar, tuple):
            return [self.grammar] * n_prompts
        if len(self.grammar) < n_prompts:
            raise GenerationError(f"{len(self.grammar)} grammars given for {n_prompts} prompts (one per prompt, "
                                  "or a single GrammarSpec for all)")
        return list(self.grammar[:n_prompts])


@dataclasses.dataclass
class Completion:
    prompt: str
    text: str
    tokens: list[int]
    # "eos", "stop", "length", "grammar" (complete, only EOS could follow) or "closed" (complete, but the token
    # budget chose its last tokens: `GenerateConfig.close_grammar`)
    finish_reason: str
    # Why the text breaks its JSON Schema where a keyword was left unenforced (`GrammarSpec.unenforced`; checked
    # with jsonschema for complete texts), else None: outputs of an exact grammar are never checked here.
    violation: str | None = None


@dataclasses.dataclass
class Stats:
    """Timings of one generate call (all batches).

    prefill_ms: device program start → first token (first batch), the prompt forward.
    ttft_ms: generate() entry → first token of the first batch (adds tokenization).
    decode_tokens_per_s: tokens after the first ones / time after the first token.
    tokens_per_s: all new tokens / wall time of the call.
    ms_per_token: mean time of one loop step (one token for every row of a batch).
    """

    prompts: int = 0
    new_tokens: int = 0
    wall_s: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_tokens_per_s: float = 0.0
    tokens_per_s: float = 0.0
    ms_per_token: float = 0.0
    compiled: int = 0
    compile_s: float = 0.0
    trace_s: float = 0.0  # of compile_s: tracing and lowering the programs (paid with or without the compile cache)
    cached: int = 0  # of `compiled`, programs loaded from the persistent compile cache, in `cached_s` of compile_s
    cached_s: float = 0.0
    decode_s: float = 0.0  # summed over batches: time after each batch's first token
    decode_tokens: int = 0  # tokens produced in that time (all rows)
    decode_steps: int = 0  # loop steps (per-row tokens) in that time

    def add_decode(self, seconds: float, tokens: int, steps: int) -> None:
        """Accumulates one batch's decode phase; rates are over all batches, not the last."""
        self.decode_s += seconds
        self.decode_tokens += tokens
        self.decode_steps += steps
        self.decode_tokens_per_s = self.decode_tokens / max(self.decode_s, 1e-9)
        self.ms_per_token = self.decode_s * 1e3 / max(self.decode_steps, 1)

    def line(self) -> str:
        timed = self.ttft_ms == self.ttft_ms  # NaN: the programs carried no first-token clock (compile cache on)
        return (f"{self.prompts} prompt(s), {self.new_tokens} new tokens in {self.wall_s:.2f} s: "
                f"{self.tokens_per_s:.1f} tok/s overall, {self.decode_tokens_per_s:.1f} tok/s decoding"
                + (f", {self.ms_per_token:.1f} ms/step, prefill {self.prefill_ms:.0f} ms, TTFT {self.ttft_ms:.0f} ms"
                   if timed else f" (prefill included), {self.ms_per_token:.1f} ms/step, TTFT not timed "
                   f"(cached programs carry no clock; {ENV}=0 times it)") + self._compile_note())

    def _compile_note(self) -> str:
        """The one-off time apart: tracing, compiling (grammar tables included) and loading cached programs."""
        if not self.compile_s:
            return ""
        fresh, parts = self.compiled - self.cached, [f"tracing {self.trace_s:.1f} s"] if self.compiled else []
        if fresh or not self.compiled:
            parts.append(f"compiling {fresh} program(s) {self.compile_s - self.trace_s - self.cached_s:.1f} s")
        if self.cached:
            parts.append(f"loading {self.cached} from the compile cache {self.cached_s:.2f} s")
        return f" (+{self.compile_s:.1f} s one-off: {', '.join(parts)})"


class Generator:
    """Runs batched generation of one model; keeps compiled programs and the KV cache buffer.

    Example:
      >>> gen = Generator(model, tokenizer)
      >>> completions, stats = gen.generate(["Hello"], GenerateConfig(max_new_tokens=32))
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer, mesh: Mesh | None = None,
                 rules=sharding.LOGICAL_RULES, profile: BackendProfile | None = None):
        """Args:
          model, tokenizer: what to run.
          mesh: optional ('data', 'model') mesh (`sharding.make_mesh`): the batch runs data-parallel
            over 'data' and the weights are split over 'model' by `rules` (`decode/mesh.py`).
          profile: how the programs are built (`backend.py`); default: the profile of JAX's default backend.

        Raises:
          ShardingError: the mesh cannot hold the model (e.g. heads 'model' does not divide).
        """
        self.profile = profile or profile_for()
        if not self.profile.int8_head and getattr(model, "head_quant", None) is not None:
            # The int8 head copy only pays on XLA:CPU (quant.py): a copy of the module without it,
            # sharing the weights (the caller's model keeps its copy).
            model = nnx.merge(*nnx.split(model))
            model.head_quant = None
        self.model = model
        self.tokenizer = tokenizer
        self.graphdef, self.params = nnx.split(model)
        self.mesh_plan = None if mesh is None else MeshPlan(mesh, model.cfg, rules)
        if self.mesh_plan is not None:
            self.params = self.mesh_plan.place_params(self.params)
            # Hold the placed copy only: the caller may drop the single-device weights.
            self.model = nnx.merge(self.graphdef, self.params)
        self._cache = None
        self._stops: dict[tuple[str, ...], StopTables | None] = {}
        self._grammars: dict[GrammarSpec, object] = {}  # spec -> GrammarTables (compiled once per process)
        self._batch_grammar_memo: tuple = (None, None)  # (key, BatchGrammar) of the latest batch
        self._host: dict[tuple[str, GrammarSpec], object] = {}  # (kind, spec) -> a host table (`_host_table`)
        self._vocab_host: dict[str, np.ndarray] = {}  # kind -> the vocabulary's tokens it needs
        self._programs: dict = {}  # shape key -> compiled executable (AOT, timed apart)

    def encode(self, prompts: Sequence[str], chat: bool) -> list[list[int]]:
        if chat:  # the template leaves BOS to encode(), like every other prompt
            prompts = [self.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
        return [self.tokenizer.encode(p) for p in prompts]

    def _stop_tables(self, stop: tuple[str, ...]) -> StopTables | None:
        if stop not in self._stops:  # no stop strings, no vocabulary walk (0.5 s of every Gemma start)
            self._stops[stop] = build_stop_tables(stop, self.tokenizer.token_bytes()) if any(stop) else None
        return self._stops[stop]

    def _grammar_tables(self, spec: GrammarSpec, progress):
        if spec not in self._grammars:
            progress(f"compiling grammar {spec.where} (cached on disk)")
            tables = compile_spec(spec, self.tokenizer, tuple(self.model.cfg.eos_ids))
            if tables.vocab_size != self.model.cfg.vocab_size:
                raise GenerationError(f"grammar {spec.where}: the tokenizer has {tables.vocab_size} tokens but the "
                                      f"model's vocabulary has {self.model.cfg.vocab_size}")
            self._grammars[spec] = tables
            if at := spec.unenforced_at():
                more = f" and {len(at) - 3} more" if len(at) > 3 else ""
                progress(f"{spec.where}: not enforced (unenforced=): {', '.join(at[:3])}{more}; complete outputs "
                         "are checked with jsonschema (Completion.violation)")
        return self._grammars[spec]

    def _batch_grammar(self, specs: list[GrammarSpec] | None, batch: int, close: bool):
        """The program's grammar argument for one chunk's row specs (None: unconstrained)."""
        if specs is None:
            return None
        distinct = list(dict.fromkeys(specs))
        key = (tuple(distinct), tuple(distinct.index(g) for g in specs), batch, close)
        # Consecutive batches of one grammar (the CLI's case) reuse the stacked tables.
        if self._batch_grammar_memo[0] != key:
            closings = [self._host_table("closing", g) for g in distinct] if close else None
            bounds = [g.digit_bound for g in distinct]
            loops = [None if b is None else self._host_table("digit_loops", g)
                     for g, b in zip(distinct, bounds, strict=True)]
            self._batch_grammar_memo = (key, constrain.prepare([self._grammars[g] for g in distinct], list(key[1]),
                                                               batch, close, closings, bounds, loops,
                                                               self._vocab_host.get("digit_loops")))
        return self._batch_grammar_memo[1]

    # kind -> (the vocabulary's tokens it needs, the host table from (tables, those tokens))
    _HOST_TABLES = {"closing": (constrain.vocab_byte_tokens, constrain.closing_of),
                    "digit_loops": (constrain.vocab_digit_tokens, constrain.digit_loops_of)}

    def _host_table(self, kind: str, spec: GrammarSpec):
        """A grammar's host-side table, computed once per process: "closing" (`constrain.closing_of`, ~1 s of CPU
        for a 113k-state grammar) or "digit_loops" (`constrain.digit_loops_of`); each reads the [S, 256] table
        back to the host. The vocabulary's tokens each needs (single-byte, digit-only) once per Generator."""
        if (kind, spec) not in self._host:
            tables = self._grammars[spec]
            vocab_tokens, make = self._HOST_TABLES[kind]
            if kind not in self._vocab_host:
                self._vocab_host[kind] = vocab_tokens(tables)
            self._host[kind, spec] = make(tables, self._vocab_host[kind])
        return self._host[kind, spec]

    def _take_cache(self, batch: int, slots: int):
        c = self._cache
        self._cache = None
        if c is None or (c.batch, c.num_slots) != (batch, slots):
            c = self.model.init_cache(batch, slots)
        return c

    def generate(
        self,
        prompts: Sequence[str],
        cfg: GenerateConfig = GenerateConfig(),
        progress: Callable[[str], None] = lambda s: None,
        on_batch: Callable[[list[Completion]], None] | None = None,
    ) -> tuple[list[Completion], Stats]:
        """Generates a completion for every prompt (in batches of cfg.batch_size).

        `on_batch` receives each batch's completions as soon as the batch finishes (the CLI writes them
        out, so an interrupted run keeps what it finished).
        """
        t_start = time.perf_counter()
        if isinstance(prompts, str):
            prompts = [prompts]
        if not prompts:
            raise GenerationError("no prompts given")
        mcfg = self.model.cfg
        cfg.sampling.check_vocab(mcfg.vocab_size)
        ids = self.encode(prompts, cfg.chat)
        for i, p in enumerate(ids):
            if len(p) + cfg.max_new_tokens > mcfg.max_seq_len:
                raise GenerationError(
                    f"prompt {i} has {len(p)} tokens; with max_new_tokens={cfg.max_new_tokens} that exceeds "
                    f"the model's context of {mcfg.max_seq_len} tokens")
            if not p:
                raise GenerationError(f"prompt {i} is empty after tokenization (nothing to condition on)")
        stops = self._stop_tables(cfg.stop)
        if isinstance(cfg.grammar, tuple) and len(cfg.grammar) != len(prompts):
            raise GenerationError(f"{len(cfg.grammar)} grammars given for {len(prompts)} prompts (one per prompt, "
                                  "or a single GrammarSpec for all)")
        stats = Stats(prompts=len(prompts))
        t_grammar = time.perf_counter()
        row_specs = cfg.row_grammars(len(prompts))
        for spec in dict.fromkeys(row_specs or ()):
            self._grammar_tables(spec, progress)
        stats.compile_s += time.perf_counter() - t_grammar  # one-off, like compiling the programs
        completions: list[Completion] = []
        for start in range(0, len(ids), cfg.batch_size):
            chunk = ids[start:start + cfg.batch_size]
            out, first_t, t_call = self._run_batch(chunk, cfg, stops, progress, stats, seed_offset=start)
            if start == 0 and loop.CLOCK.enabled():
                stats.prefill_ms = (first_t - t_call) * 1e3
                stats.ttft_ms = (first_t - t_start - stats.compile_s) * 1e3
            elif start == 0:  # programs from the persistent compile cache carry no clock
                stats.prefill_ms = stats.ttft_ms = float("nan")
            for j in range(len(chunk)):
                completions.append(_checked(self._completion(prompts[start + j], out, j, cfg),
                                            row_specs[start + j] if row_specs else None))
            if on_batch is not None:
                on_batch(completions[start:])
        t_end = time.perf_counter()
        stats.wall_s = t_end - t_start - stats.compile_s
        stats.new_tokens = sum(len(c.tokens) for c in completions)
        stats.tokens_per_s = stats.new_tokens / stats.wall_s
        return completions, stats

    def _rows(self, cfg: GenerateConfig) -> int:
        """Rows of a batch's program: the batch size (on a mesh, rounded to fill the data axis)."""
        return cfg.batch_size if self.mesh_plan is None else self.mesh_plan.rows(cfg.batch_size)

    def _batch_inputs(self, chunk, cfg: GenerateConfig, stops, seed_offset: int, extra_slots: int = 0):
        """Pads a chunk of prompts into the static shapes of one device program.

        Returns (shape key, program arguments (params, KV cache, `BatchInputs`), static keyword arguments);
        the KV cache has prompt bucket + new-token bucket + `extra_slots` slots.
        """
        b = self._rows(cfg)
        t = prompt_bucket(max(len(p) for p in chunk))
        n_out = bucket(cfg.max_new_tokens)
        prompt_bt = np.full((b, t), self.model.cfg.pad_id, np.int32)
        len_b = np.ones((b,), np.int32)
        for j, p in enumerate(chunk):
            prompt_bt[j, :len(p)] = p
            len_b[j] = len(p)
        active_b = np.arange(b) < len(chunk)
        s = cfg.sampling
        # Only what changes the program is static; temperature / top_p values are traced.
        static = {"sampling": SamplingConfig(temperature=0.0 if s.greedy else 1.0, top_k=s.top_k,
                                             top_p=1.0 if s.top_p >= 1.0 else 0.5),
                  "n_out": n_out, "eos_ids": () if cfg.ignore_eos else tuple(self.model.cfg.eos_ids),
                  "profile": self.profile}
        # The chunk starts at prompt `seed_offset` (its seeds are offset by its position too).
        specs = cfg.row_grammars(seed_offset + len(chunk))
        grammar = self._batch_grammar(None if specs is None else specs[seed_offset:], b, cfg.close_grammar)
        key = (b, t, *static.values(), None if stops is None else stops.next_state.shape,
               None if grammar is None else (grammar.tables.trans_sb.shape, grammar.tables.mask_rw.shape,
                                             grammar.dist_s is None, grammar.bound_s is None))
        cache = self._take_cache(b, t + n_out + extra_slots)
        inputs = BatchInputs(prompt_bt=jnp.asarray(prompt_bt), len_b=jnp.asarray(len_b), active_b=jnp.asarray(active_b),
                             max_new=jnp.int32(cfg.max_new_tokens), key=jax.random.key(s.seed + seed_offset),
                             temperature=jnp.float32(s.temperature or 1.0), top_p=jnp.float32(s.top_p),
                             stop_tables=stops, grammar=grammar)
        if self.mesh_plan is not None:
            cache, inputs = self.mesh_plan.place_cache(cache), self.mesh_plan.place_inputs(inputs)
        return key, (self.params, cache, inputs), static

    def _lower(self, program, args: tuple, static: dict):
        """Lowers a jitted decode program for `args` (on the mesh, with its shardings)."""
        if self.mesh_plan is None:
            return program.lower(self.graphdef, *args, **static)
        return self.mesh_plan.lower(program, self.graphdef, args, static)

    def release_programs(self) -> None:
        """Drops this generator's compiled programs and JAX's compilation caches.

        Each compiled decode program maps ~900 memory regions on XLA:CPU (LLVM code sections), and
        Linux allows 65,530 per process by default: a long-running process that compiles many shapes
        (a benchmark sweep, a test session) fails with "LLVM ERROR: Unable to allocate section memory"
        after ~70 programs unless it releases the ones it no longer needs. The next call recompiles.
        """
        self._programs.clear()
        jax.clear_caches()

    def _program(self, key, lower: Callable, what: str, progress, stats: Stats):
        """The compiled executable for `key`, compiling (timed apart) or loading it from the persistent
        compile cache on first use."""
        if key not in self._programs:
            progress(f"compiling {what} (once per shape)")
            t0, hits = time.perf_counter(), persistent_cache_hits()
            lowered = lower()
            t1 = time.perf_counter()
            self._programs[key] = lowered.compile()
            t2 = time.perf_counter()
            stats.compiled += 1
            stats.compile_s += t2 - t0
            stats.trace_s += t1 - t0
            if persistent_cache_hits() > hits:
                stats.cached += 1
                stats.cached_s += t2 - t1
                progress(f"traced in {t1 - t0:.2f} s, loaded from the compile cache in {t2 - t1:.2f} s")
        return self._programs[key]

    def _run_batch(self, chunk, cfg: GenerateConfig, stops, progress, stats: Stats, seed_offset: int):
        key, args, static = self._batch_inputs(chunk, cfg, stops, seed_offset)
        b, t, _, n_out = key[:4]
        program = self._program(key, lambda: self._lower(loop.generate_program, args, static),
                                f"for batch {b}, prompt bucket {t}, {n_out} new tokens", progress, stats)
        loop.CLOCK.t = None
        t_call = time.perf_counter()
        state = program(*args)
        out = sharding.to_host((state.out_bn, state.count_b, state.reason_b, state.steps))
        t_end = time.perf_counter()
        self._cache = state.cache
        first_t = loop.CLOCK.first_token_time(t_call, t_end)
        steps = int(out[3]) - 1  # loop iterations after the one that sampled the first token
        if steps > 0:
            stats.add_decode(t_end - first_t, int(out[1].sum()) - len(chunk), steps)
        return out, first_t, t_call

    def _completion(self, prompt: str, out, j: int, cfg: GenerateConfig) -> Completion:
        out_bn, count_b, reason_b, _ = out
        toks = [int(x) for x in out_bn[j, :count_b[j]]]
        reason = FINISH_REASONS[int(reason_b[j])]
        # A "grammar" finish ends on a real token of the text; a "closed" one on either (EOS or a sentence
        # nothing can extend).
        if reason == "eos" or (reason == "closed" and toks and toks[-1] in self.model.cfg.eos_ids):
            toks = toks[:-1]
        text = self.tokenizer.decode(toks)
        if reason == "stop":
            text, _ = truncate_at_stop(text, cfg.stop)
        return Completion(prompt=prompt, text=text, tokens=toks, finish_reason=reason)


def _checked(c: Completion, spec: GrammarSpec | None) -> Completion:
    """``c`` with its `violation` filled in where its grammar left JSON Schema keywords unenforced. Only a complete
    text is judged (a cut one is incomplete JSON by construction)."""
    if spec is not None and c.finish_reason in ("eos", "grammar", "closed", "stop"):
        c.violation = spec.violation(c.text)
    return c
