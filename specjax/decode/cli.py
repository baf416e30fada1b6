"""The decode command's logic, free of Hydra: options (`options.py`) → load → generate → print.

`python -m specjax.decode` (see __main__.py) parses options with Hydra and calls `run`.
"""

from __future__ import annotations

import io
import sys
import time

from specjax.cli_errors import EXIT_INTERRUPTED, UsageError, check_finite
from specjax.decode.errors import GenerationError
from specjax.decode.generate import GenerateConfig, Generator
from specjax.decode.grammar_spec import GrammarSpec, GrammarSpecError
from specjax.decode.options import DecodeOptions
from specjax.decode.output import CompletionWriter, SoftInterrupt
from specjax.decode.prompts import OptionError, check_grammar_inputs, check_limit, collect_prompts
from specjax.decode.sampling import SamplingConfig, SamplingError
from specjax.decode.spec.drafters.registry import METHODS
from specjax.distributed import DistributedError, initialize, is_primary
from specjax.grammar.errors import GrammarError
from specjax.models.config import ConfigError
from specjax.models.gguf_loader import ModelFileError
from specjax.models.params import WeightsError
from specjax.models.sharding import ShardingError
from specjax.models.tokenizer import TokenizerError

# Errors that are the user's input, reported as one line without a traceback.
# GrammarError: the compiler's own, should one escape `compile_spec`'s translation to GrammarSpecError.
USER_ERRORS = (ConfigError, GenerationError, GrammarError, GrammarSpecError, ModelFileError, SamplingError,
               ShardingError, TokenizerError, WeightsError, FileNotFoundError)




def grammar_spec(opts: DecodeOptions) -> GrammarSpec | None:
    """The constraint given by grammar= (a .lark file), json_schema= (a .json file) or regex= (a pattern)."""
    given = {k: v for k, v in (("grammar", opts.grammar), ("json_schema", opts.json_schema), ("regex", opts.regex))
             if v is not None}
    if len(given) > 1:
        raise OptionError(f"give at most one of grammar=, json_schema=, regex= (got {', '.join(given)})")
    if not given:
        return None
    check_grammar_inputs(opts.grammar, opts.json_schema, opts.regex)
    (key, value), = given.items()
    options = {"max_depth": opts.grammar_max_depth, "start": opts.grammar_start,
               "whitespace": opts.json_whitespace, "max_whitespace": opts.json_max_whitespace,
               "strict_objects": opts.json_strict_objects, "unknown_formats": opts.json_unknown_formats,
               "max_repeat": opts.json_max_repeat, "max_digits": opts.json_max_digits,
               "unenforced": tuple(str(k) for k in opts.json_unenforced),
               "max_states": opts.grammar_max_states, "timeout": opts.grammar_timeout,
               "max_ignore": opts.grammar_max_ignore}
    if key == "regex":
        return GrammarSpec("regex", str(value), **options)
    return GrammarSpec.from_file("lark" if key == "grammar" else "json_schema", str(value), **options)


def generate_config(opts: DecodeOptions) -> GenerateConfig:
    sampling = SamplingConfig(temperature=float(opts.temperature), top_k=opts.top_k, top_p=float(opts.top_p),
                              seed=opts.seed)
    return GenerateConfig(max_new_tokens=opts.max_new_tokens, sampling=sampling, stop=tuple(opts.stop),
                          batch_size=opts.batch_size, chat=opts.chat, grammar=grammar_spec(opts),
                          close_grammar=opts.grammar_close)


SPEC_METHODS = ("none", *METHODS)  # the registry's, plus plain decoding


def spec_config(opts: DecodeOptions):
    """The speculative-decoding config, or None for plain decoding."""
    if opts.spec.method not in SPEC_METHODS:
        raise OptionError(f"spec={opts.spec.method!r} is unknown (available: {', '.join(SPEC_METHODS)})")
    return opts.spec.config()


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


def _generate(model, tokenizer, prompts, gen_cfg, spec_cfg, compare_plain: bool, progress, mesh=None,
              on_batch=None, between_batches=None):
    """Runs plain or speculative generation; with compare_plain, also plain for the speedup.

    `on_batch` receives each finished batch of the run whose completions are printed (not the comparison's);
    `between_batches` is called after each batch of the comparison run (a Ctrl-C check).
    """
    from specjax.decode.spec.driver import SpeculativeGenerator

    on_mesh = mesh_kwargs(model, mesh, progress)
    if spec_cfg is None:
        completions, stats = Generator(model, tokenizer, **on_mesh).generate(prompts, gen_cfg, progress, on_batch)
        return completions, stats, None
    completions, stats = SpeculativeGenerator(model, tokenizer, **on_mesh).generate(prompts, gen_cfg, spec_cfg,
                                                                                     progress, on_batch)
    if not compare_plain:
        return completions, stats, None
    progress("running plain decoding of the same prompts for the speedup")
    _, plain = Generator(model, tokenizer, **on_mesh).generate(prompts, gen_cfg, progress, between_batches)
    return completions, stats, plain


def _print_stats(stats, plain) -> None:
    print(f"stats: {stats.line()}", file=sys.stderr)
    if plain is not None:
        print(f"plain: {plain.line()}", file=sys.stderr)
        # Decoding rates (after the first token) lead: each program's first run in a process pays a warm-up
        # of a few hundred ms before its first token, which swamps the overall rate of a short generation.
        print(f"speedup over plain decoding of the same prompts: "
              f"{stats.decode_tokens_per_s / max(plain.decode_tokens_per_s, 1e-9):.2f}x decoding "
              f"({stats.tokens_per_s / max(plain.tokens_per_s, 1e-9):.2f}x overall, counting prefill and first-run "
              f"warm-up; benchmarks/speculative.py times warm runs)", file=sys.stderr)


def run(opts: DecodeOptions) -> int:
    """Runs the command; returns the process exit code (2 for bad input, 130 when interrupted).

    Completions are printed (and written to output=) batch by batch as they finish: a Ctrl-C keeps
    the finished ones.
    """
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not opts.quiet:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    writer = None
    try:
        check_finite(opts)
        check_limit(opts.limit)
        prompts = collect_prompts(opts.prompt, opts.prompt_file, opts.prompts_file, opts.limit)
        gen_cfg = generate_config(opts)
        spec_cfg = spec_config(opts)
        if opts.distributed:
            initialize()
        mesh = device_mesh(opts)
        # Every process holds the whole result; process 0 alone prints and writes it.
        primary = not opts.distributed or is_primary()
        writer = CompletionWriter(opts.output if primary else None, len(prompts), opts.chat,
                                  None if primary else io.StringIO())
        from specjax.models.int8_activations import resolve as resolve_activations
        from specjax.models.loading import load_model, resolved_weights

        model, tokenizer = load_model(opts.model, opts.dtype, progress, weights=opts.weights,
                                      activations=opts.activations)
        weights = resolved_weights(opts.model, opts.weights)
        acts = f", activations={resolve_activations(opts.activations, weights, opts.dtype)}"
        progress(f"model ready: {model.cfg.family}, {model.cfg.n_layers} layers, vocab {model.cfg.vocab_size}, "
                 f"{opts.dtype}, weights={weights if weights == opts.weights else f'{opts.weights} ({weights})'}{acts}")
        with writer, SoftInterrupt() as interrupt:  # Ctrl-C: stop after the batch in flight, keep what is done

            def write_batch(completions):
                writer.batch(completions)
                interrupt.check()

            _, stats, plain = _generate(model, tokenizer, prompts, gen_cfg, spec_cfg, opts.compare_plain,
                                        progress, mesh, write_batch, interrupt.check)
            writer.finish(stats)
    except (*USER_ERRORS, OptionError, UsageError, DistributedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        done = f"; {writer.written} of {len(prompts)} completion(s) written to {writer.where()}" if writer else ""
        print(f"error: interrupted{done}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if primary:
        _print_stats(stats, plain)
    return 0
