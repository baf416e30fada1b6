"""Compile JSONSchemaBench schemas to device tables, timed, beside llguidance (jsonschemabench_coverage.py --compile).

Works with older checkouts of specjax too (run with PYTHONPATH pointing at one): options the older
``GrammarOptions`` lacks are left out, and a CPU-time alarm (SIGPROF) stops any schema past ``--limit-s``
seconds of CPU. Times are CPU seconds of the compiling thread (``time.thread_time``): on a shared, loaded
machine wall time says more about the neighbours than about the compiler.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import os
import re
import signal
import sys
import time

import numpy as np


class _Alarm(BaseException):  # not an Exception: code under test must not catch it as its own error
    pass


def _on_alarm(signum, frame):
    raise _Alarm


def _specjax_compile(schema, tokenizer, decode_defaults: bool,
                     unenforced: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """("compiled" | "refused", refusal keyword); raises _Alarm past the limit."""
    from specjax.decode import GrammarSpec
    from specjax.grammar import GrammarError, GrammarOptions, compile_grammar
    from specjax.grammar.json_schema import JsonSchemaOptions, SchemaError, json_schema_to_lark

    try:  # decode_defaults: GrammarSpec's (strict objects, max_repeat) instead of the exact language
        options = GrammarSpec("json_schema", "{}").json_schema_options() if decode_defaults else JsonSchemaOptions()
        text = json_schema_to_lark(schema, dataclasses.replace(options, unenforced=unenforced))
        compile_grammar(text, tokenizer, GrammarOptions(cache=False))
        return "compiled", None
    except SchemaError as e:
        return "refused", e.keyword
    except GrammarError as e:
        msg = str(e)
        kind = "time limit" if "time limit" in msg else "too large" if "too large" in msg else \
            "regex size" if "character positions" in msg else "grammar: " + re.sub(r"[^a-z ]", "", msg[:30])
        return "refused", kind


def _llg_engine(tokenizer):
    import llguidance

    pieces = tokenizer.token_bytes()

    class Wrapper:  # llguidance's duck-typed tokenizer: raw bytes per token, specials 0xFF-prefixed
        tokens = [b or b"\xff" + tokenizer.id_to_piece(i).encode() for i, b in enumerate(pieces)]
        eos_token_id, bos_token_id = tokenizer.eos_ids[0], tokenizer.bos_id
        special_token_ids = [i for i, b in enumerate(pieces) if not b]

        def __call__(self, s):
            return tokenizer.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s, add_bos=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapper()), eos_token=list(tokenizer.eos_ids))


def _llg_compile(schema, llg_tok) -> tuple[str, str | None]:
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        m = llguidance.LLMatcher(llg_tok, grammar, log_level=0)
    except (ValueError, RuntimeError) as e:
        return "refused", str(e)[:40]
    return ("refused", m.get_error()[:40]) if m.is_error() else ("compiled", None)


def _timed(fn, limit_s: float) -> dict:
    # The garbage of earlier compiles is collected first, so that a collection it triggers is not charged to this
    # schema (without it the same schema's time moved by ±25% with what ran before it in the process).
    gc.collect()
    signal.setitimer(signal.ITIMER_PROF, limit_s)
    t0, w0 = time.thread_time(), time.perf_counter()
    try:
        status, why = fn()
    except _Alarm:
        status, why = "timeout", None
    except Exception as e:  # noqa: BLE001 - a crash is a bug to report, not to hide
        status, why = "crashed", f"{type(e).__name__}: {e}"[:120]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    if time.thread_time() - t0 >= limit_s:  # the alarm hit inside someone's broad except
        status, why = "timeout", None
    return {"status": status, "why": why, "s": time.thread_time() - t0, "wall_s": time.perf_counter() - w0}


def run_compile(args, files: list[tuple[str, list[dict]]]) -> None:
    from specjax.models.loading import load_model

    signal.signal(signal.SIGPROF, _on_alarm)
    _, tokenizer = load_model(None)
    from specjax.grammar.compiler import vocabulary_of

    vocabulary_of(tokenizer)  # the vocabulary tables are built once per tokenizer: not part of a compile
    strict = getattr(args, "decode_defaults", False)
    unenforced = tuple(k for k in (getattr(args, "unenforced", "") or "").split(",") if k)
    label = "specjax" + (" (decode defaults)" if strict else "") + (f" (unenforced {','.join(unenforced)})"
                                                                   if unenforced else "")
    engines = {label: lambda schema: _specjax_compile(schema, tokenizer, strict, unenforced)}
    if "llguidance" in args.peers:
        llg_tok = _llg_engine(tokenizer)
        engines["llguidance"] = lambda schema: _llg_compile(schema, llg_tok)
    results, t0 = {}, time.time()
    for name, rows in files:
        for row in rows:
            for engine, fn in engines.items():
                r = _timed(lambda fn=fn, schema=row["schema"]: fn(schema), args.limit_s)
                results.setdefault(engine, []).append({"file": name, "id": row["id"], **r})
            print(f"{name} {row['id']}: " + ", ".join(f"{e} {results[e][-1]['status']} {results[e][-1]['s']:.2f} s"
                                                      for e in engines), file=sys.stderr, flush=True)
    print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}, "
          f"{time.time() - t0:.0f} s, files {', '.join(n for n, _ in files)}, first {args.limit} rows each\n")
    print("| engine | schemas | compiled | refused | timeout | crashed | compile p50 / p95 / max (CPU s, compiled) |")
    print("|---|---|---|---|---|---|---|")
    for engine, rs in results.items():
        c = collections.Counter(r["status"] for r in rs)
        s = [r["s"] for r in rs if r["status"] == "compiled"]
        q = (lambda p, s=s: f"{np.percentile(s, p):.3f}") if s else (lambda p: "-")
        print(f"| {engine} | {len(rs)} | {c['compiled']} ({100 * c['compiled'] / len(rs):.1f}%) | {c['refused']} | "
              f"{c['timeout']} | {c['crashed']} | {q(50)} / {q(95)} / {max(s, default=0):.3f} |")
    print_per_file(results)
    for engine, rs in results.items():
        why = collections.Counter(r["why"] for r in rs if r["status"] == "refused")
        print(f"\n{engine} refusals: " + ", ".join(f"{k} {v}" for k, v in why.most_common()))
        crashed = [f"{r['id']}: {r['why']}" for r in rs if r["status"] == "crashed"]
        if crashed:
            print(f"{engine} crashed: " + "; ".join(crashed[:5]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def print_per_file(results: dict) -> None:
    """Compiled schemas per file and engine, and specjax's compile p50 / p95 per file (CPU s, compiled ones)."""
    files = list(dict.fromkeys(r["file"] for rs in results.values() for r in rs))
    print("\n| file | " + " | ".join(f"{e} compiled" for e in results) + " | specjax p50 / p95 (s) |")
    print("|---|" + "---|" * len(results) + "---|")
    for name in files:
        cells = []
        for rs in results.values():
            mine = [r for r in rs if r["file"] == name]
            cells.append(f"{sum(r['status'] == 'compiled' for r in mine)} / {len(mine)}")
        s = [r["s"] for r in next(iter(results.values())) if r["file"] == name and r["status"] == "compiled"]
        q = f"{np.percentile(s, 50):.2f} / {np.percentile(s, 95):.2f}" if s else "-"
        print(f"| {name} | " + " | ".join(cells) + f" | {q} |")


__all__ = ["print_per_file", "run_compile"]
