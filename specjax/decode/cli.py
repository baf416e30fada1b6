"""The decode command's logic, free of Hydra: options dataclass → load → generate → print.

`python -m specjax.decode` (see __main__.py) parses options with Hydra and calls `run`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from specjax.decode.generate import GenerateConfig, GenerationError, Generator
from specjax.decode.grammar_spec import GrammarSpec, GrammarSpecError
from specjax.decode.sampling import SamplingConfig, SamplingError
from specjax.jsonl import jsonl_rows
from specjax.models.config import ConfigError
from specjax.models.gguf_loader import ModelFileError
from specjax.models.params import WeightsError
from specjax.models.sharding import ShardingError
from specjax.models.tokenizer import TokenizerError

DEFAULT_PROMPT = "The three most important ideas in computer science are"

# Errors that are the user's input, reported as one line without a traceback.
USER_ERRORS = (ConfigError, GenerationError, GrammarSpecError, ModelFileError, SamplingError, ShardingError,
               TokenizerError, WeightsError, FileNotFoundError)


class OptionError(ValueError):
    """A decode option that is missing, malformed or contradictory."""


@dataclasses.dataclass
class DecodeOptions:
    """Options of `python -m specjax.decode` (configs/decode.yaml documents each)."""

    model: str | None = None
    dtype: str = "float32"
    prompt: str | None = None
    prompts_file: str | None = None
    limit: int | None = None
    chat: bool = False
    max_new_tokens: int = 128
    batch_size: int = 1
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: list[str] = dataclasses.field(default_factory=list)
    spec: str = "none"
    spec_k: int = 4
    spec_max_ngram: int = 3
    spec_layers: int = 4
    spec_layer_list: list[int] = dataclasses.field(default_factory=list)
    spec_confidence: float = 0.0
    spec_probe_every: int = 16  # costly drafters: a probe (one draft, no verify) after this many plain rounds
    spec_max_probe_every: int = 256  # ... a gap that doubles after each probe, up to this
    spec_verify_cost: float | None = None  # a speculative round's cost in plain rounds (None: estimated)
    spec_min_best_gain: float = 1.5  # speculation off when a fully accepted round would gain less (0: never off)
    draft_model: str | None = None
    draft_checkpoint: str | None = None
    eagle_depth: int = 4
    eagle_top_k: int = 4
    draft_vocab: int = 0
    draft_vocab_corpus: str | None = None
    compare_plain: bool = True
    mesh_data: int = 1
    mesh_model: int = 1
    output: str | None = None
    quiet: bool = False
    grammar: str | None = None
    json_schema: str | None = None
    regex: str | None = None
    grammar_start: str = "start"
    grammar_max_depth: int = 3
    json_whitespace: str = "compact"
    json_max_whitespace: int = 8
    json_strict_objects: bool = True
    json_max_repeat: int | None = 16
    json_unknown_formats: str = "refuse"
    grammar_max_states: int = 200_000
    grammar_timeout: float | None = 10.0
    grammar_max_ignore: int | None = None


def read_prompts(path: str, limit: int | None) -> list[str]:
    """Prompts from a jsonl file with a "prompt" field (../shared/data/prompts format)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise OptionError(f"prompts_file={path!r}: no such file")
    prompts = []
    for n, row in jsonl_rows(p, OptionError):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise OptionError(f"{p}:{n}: expected an object with a string field \"prompt\"")
        prompts.append(row["prompt"])
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise OptionError(f"{p}: no prompts found")
    return prompts


def collect_prompts(opts: DecodeOptions) -> list[str]:
    if opts.prompt is not None and opts.prompts_file is not None:
        raise OptionError("give either prompt= or prompts_file=, not both")
    if opts.prompts_file is not None:
        return read_prompts(opts.prompts_file, opts.limit)
    return [DEFAULT_PROMPT if opts.prompt is None else str(opts.prompt)]


def grammar_spec(opts: DecodeOptions) -> GrammarSpec | None:
    """The constraint given by grammar= (a .lark file), json_schema= (a .json file) or regex= (a pattern)."""
    given = {k: v for k, v in (("grammar", opts.grammar), ("json_schema", opts.json_schema), ("regex", opts.regex))
             if v is not None}
    if len(given) > 1:
        raise OptionError(f"give at most one of grammar=, json_schema=, regex= (got {', '.join(given)})")
    if not given:
        return None
    (key, value), = given.items()
    options = {"max_depth": opts.grammar_max_depth, "start": opts.grammar_start,
               "whitespace": opts.json_whitespace, "max_whitespace": opts.json_max_whitespace,
               "strict_objects": opts.json_strict_objects, "unknown_formats": opts.json_unknown_formats,
               "max_repeat": opts.json_max_repeat,
               "max_states": opts.grammar_max_states, "timeout": opts.grammar_timeout,
               "max_ignore": opts.grammar_max_ignore}
    if key == "regex":
        return GrammarSpec("regex", str(value), **options)
    return GrammarSpec.from_file("lark" if key == "grammar" else "json_schema", str(value), **options)


def generate_config(opts: DecodeOptions) -> GenerateConfig:
    sampling = SamplingConfig(temperature=float(opts.temperature), top_k=opts.top_k, top_p=float(opts.top_p),
                              seed=opts.seed)
    return GenerateConfig(max_new_tokens=opts.max_new_tokens, sampling=sampling, stop=tuple(opts.stop),
                          batch_size=opts.batch_size, chat=opts.chat, grammar=grammar_spec(opts))


SPEC_METHODS = ("none", "ngram", "layerskip", "draft", "medusa", "eagle")


def spec_config(opts: DecodeOptions):
    """The speculative-decoding config, or None for plain decoding."""
    if opts.spec == "none":
        return None
    if opts.spec not in SPEC_METHODS:
        raise OptionError(f"spec={opts.spec!r} is unknown (available: {', '.join(SPEC_METHODS)})")
    from specjax.decode.speculative import SpecConfig

    return SpecConfig(k=opts.spec_k, max_ngram=opts.spec_max_ngram, method=opts.spec,
                      layers=tuple(opts.spec_layer_list) or opts.spec_layers, confidence=float(opts.spec_confidence),
                      probe_every=opts.spec_probe_every,
                      max_probe_every=opts.spec_max_probe_every, verify_cost=opts.spec_verify_cost,
                      min_best_gain=opts.spec_min_best_gain,
                      draft_model=opts.draft_model, draft_vocab=opts.draft_vocab,
                      draft_vocab_corpus=opts.draft_vocab_corpus, draft_checkpoint=opts.draft_checkpoint,
                      eagle_depth=opts.eagle_depth, eagle_top_k=opts.eagle_top_k)


def device_mesh(opts: DecodeOptions):
    """The ('data', 'model') mesh of mesh_data= / mesh_model=, or None when both are 1."""
    if (opts.mesh_data, opts.mesh_model) == (1, 1):
        return None
    from specjax.models.sharding import make_mesh

    try:
        return make_mesh(opts.mesh_data, opts.mesh_model)
    except ShardingError as e:
        raise OptionError(f"mesh_data={opts.mesh_data} mesh_model={opts.mesh_model}: {e}") from None


def mesh_kwargs(model, mesh, progress) -> dict:
    """Generator keywords for `mesh`. A kv-head count the 'model' size does not divide (Gemma 3
    270M has one) is replicated on every 'model' device instead, as tensor-parallel servers do."""
    if mesh is None:
        return {}
    from specjax.models.sharding import LOGICAL_RULES, with_rules

    if model.cfg.n_kv_heads % mesh.shape["model"] == 0:
        return {"mesh": mesh, "rules": LOGICAL_RULES}
    progress(f"{model.cfg.n_kv_heads} kv head(s) do not split over mesh_model={mesh.shape['model']}: replicating them")
    return {"mesh": mesh, "rules": with_rules(kv_heads=None)}


def _generate(model, tokenizer, prompts, gen_cfg, spec_cfg, compare_plain: bool, progress, mesh=None):
    """Runs plain or speculative generation; with compare_plain, also plain for the speedup."""
    from specjax.decode.speculative import SpeculativeGenerator

    on_mesh = mesh_kwargs(model, mesh, progress)
    if spec_cfg is None:
        completions, stats = Generator(model, tokenizer, **on_mesh).generate(prompts, gen_cfg, progress)
        return completions, stats, None
    completions, stats = SpeculativeGenerator(model, tokenizer, **on_mesh).generate(prompts, gen_cfg, spec_cfg,
                                                                                     progress)
    if not compare_plain:
        return completions, stats, None
    progress("running plain decoding of the same prompts for the speedup")
    _, plain = Generator(model, tokenizer, **on_mesh).generate(prompts, gen_cfg, progress)
    return completions, stats, plain


def run(opts: DecodeOptions) -> int:
    """Runs the command; returns the process exit code (2 for bad input)."""
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not opts.quiet:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        prompts = collect_prompts(opts)
        gen_cfg = generate_config(opts)
        spec_cfg = spec_config(opts)
        mesh = device_mesh(opts)
        from specjax.models.loading import load_model

        model, tokenizer = load_model(opts.model, opts.dtype, progress)
        progress(f"model ready: {model.cfg.family}, {model.cfg.n_layers} layers, vocab {model.cfg.vocab_size}, "
                 f"{opts.dtype}")
        completions, stats, plain = _generate(model, tokenizer, prompts, gen_cfg, spec_cfg, opts.compare_plain,
                                              progress, mesh)
    except (*USER_ERRORS, OptionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for i, c in enumerate(completions):
        if len(completions) > 1:
            print(f"--- [{i}] {c.prompt[:70]!r} ({c.finish_reason})")
        print(c.prompt + c.text if not opts.chat else c.text)
    print(f"stats: {stats.line()}", file=sys.stderr)
    if plain is not None:
        print(f"plain: {plain.line()}", file=sys.stderr)
        # Decoding rates (after the first token) lead: each program's first run in a process pays a warm-up
        # of a few hundred ms before its first token, which swamps the overall rate of a short generation.
        print(f"speedup over plain decoding of the same prompts: "
              f"{stats.decode_tokens_per_s / max(plain.decode_tokens_per_s, 1e-9):.2f}x decoding "
              f"({stats.tokens_per_s / max(plain.tokens_per_s, 1e-9):.2f}x overall, counting prefill and first-run "
              f"warm-up; benchmarks/speculative.py times warm runs)", file=sys.stderr)
    if opts.output:
        with open(opts.output, "w", encoding="utf-8") as f:
            for c in completions:
                f.write(json.dumps(dataclasses.asdict(c)) + "\n")
            f.write(json.dumps({"stats": dataclasses.asdict(stats)}) + "\n")
    return 0
