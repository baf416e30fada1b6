"""JSON Schema front-end coverage and validity over JSONSchemaBench (../shared/data/jsonschemabench).

For every schema: compile it to Lark text (`json_schema_to_lark`); count it converted, refused
(`SchemaError`, tallied by keyword and reason) or crashed (any other exception: a bug). For each
converted schema, sample N strings from the grammar (`LarkSampler`) and validate each with the
`jsonschema` package (the schema's own draft, with FormatChecker); optionally also parse each with
lark itself (--parse, slower). Target: 100% of samples valid.

With --compile, every schema is also compiled to device tables against the Gemma 3 vocabulary (disk cache
off) and timed end to end (front-end, automaton, mask tables), beside llguidance's compile of the same schema
(--peers llguidance): compiled %, compile p50 / p95 / max (CPU seconds) and refusals by keyword per engine.
A schema still compiling after --limit-s CPU seconds counts as a timeout.

  python benchmarks/jsonschemabench_coverage.py --samples 5 [--parse] [--json out.json]
  python benchmarks/jsonschemabench_coverage.py --compile --files Github_hard_dev ... --limit 40 --peers llguidance
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import time
import warnings
from pathlib import Path

import jsonschema
import lark

from specjax.grammar.json_schema import SchemaError, json_schema_to_lark
from specjax.grammar.sample import LarkSampler

# ../shared next to the checkout (a git worktree may sit one level deeper)
SHARED = next((p / "shared" for p in Path(__file__).resolve().parents if (p / "shared" / "data").is_dir()),
              Path(__file__).resolve().parents[2] / "shared")
DATA = SHARED / "data" / "jsonschemabench"
DEV_FILES = ("Github_hard_dev", "Github_medium_dev", "JsonSchemaStore_dev", "Kubernetes_dev", "WashingtonPost_dev")
FILES = ("Github_trivial", "Github_easy", "Glaiveai2K", "Snowplow")


def load(name: str) -> list[dict]:
    with open(DATA / f"{name}.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def validator(schema):
    with warnings.catch_warnings():  # unknown $schema URIs fall back to the latest draft, with a warning
        warnings.simplefilter("ignore")
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_schema(schema, samples: int, rng: random.Random, parse: bool) -> dict:
    """One schema's outcome: status, refusal keyword/reason, sample counts and the first invalid sample."""
    try:
        text = json_schema_to_lark(schema)
    except SchemaError as e:
        reason = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "…", e.why)[:90]
        return {"status": "refused", "keyword": e.keyword, "reason": reason, "message": str(e)}
    except Exception as e:  # noqa: BLE001 - a crash is a bug to report, not to hide
        return {"status": "crashed", "message": f"{type(e).__name__}: {e}"[:300]}
    out = {"status": "converted", "samples": 0, "valid": 0, "parsed": 0, "invalid": None}
    try:
        sampler, check = LarkSampler(text), validator(schema)
        parser = lark.Lark(text, parser="earley", lexer="dynamic") if parse else None
    except Exception as e:  # noqa: BLE001
        return {"status": "crashed", "message": f"grammar does not load: {type(e).__name__}: {e}"[:300]}
    for _ in range(samples):
        s = sampler.sample(rng)
        out["samples"] += 1
        try:
            check.validate(json.loads(s))
            out["valid"] += 1
        except (ValueError, jsonschema.ValidationError) as e:
            out["invalid"] = out["invalid"] or {"sample": s[:300], "error": str(e)[:300]}
        if parser is not None:
            try:
                parser.parse(s)
                out["parsed"] += 1
            except lark.exceptions.LarkError:
                pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=5, help="generated strings per converted schema")
    ap.add_argument("--files", nargs="*", default=list(FILES))
    ap.add_argument("--limit", type=int, default=None, help="first N schemas of each file")
    ap.add_argument("--parse", action="store_true", help="also parse every sample with lark (slower)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write per-schema results here")
    ap.add_argument("--compile", action="store_true", help="compile to device tables and time it (Gemma 3 vocab)")
    ap.add_argument("--peers", default="none", help="with --compile: 'llguidance' or 'none'")
    ap.add_argument("--decode-defaults", action="store_true",
                    help="with --compile: GrammarSpec defaults (strict objects, max_repeat), not the exact language")
    ap.add_argument("--limit-s", type=float, default=60.0, help="with --compile: CPU-time limit per schema")
    ap.add_argument("--unenforced", default="", help="with --compile: keywords to leave unenforced where they cannot "
                                                     "be compiled (JsonSchemaOptions.unenforced), comma-separated")
    args = ap.parse_args()
    if args.compile:
        from jsonschemabench_compile import run_compile

        return run_compile(args, [(name, load(name)[: args.limit]) for name in args.files])
    rng, t0, results = random.Random(args.seed), time.time(), {}
    for name in args.files:
        rows = load(name)[: args.limit]
        results[name] = [{"id": r["id"], **check_schema(r["schema"], args.samples, rng, args.parse)} for r in rows]
    report(results, args, time.time() - t0)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def report(results: dict, args, seconds: float) -> None:
    print(f"| file | schemas | converted | refused | crashed | samples | valid |{' parsed |' if args.parse else ''}")
    print(f"|---|---|---|---|---|---|---|{'---|' if args.parse else ''}")
    total = collections.Counter()
    for name, rows in results.items():
        c = collections.Counter(r["status"] for r in rows)
        n, smp = len(rows), sum(r.get("samples", 0) for r in rows)
        val, par = sum(r.get("valid", 0) for r in rows), sum(r.get("parsed", 0) for r in rows)
        total.update({"n": n, "samples": smp, "valid": val, "parsed": par, **c})
        _row(name, n, c, smp, val, par, args.parse)
    _row("**all**", total["n"], total, total["samples"], total["valid"], total["parsed"], args.parse)
    refusals = collections.Counter(r["keyword"] for rows in results.values() for r in rows if r["status"] == "refused")
    reasons = collections.Counter(f"{r['keyword']}: {r['reason']}" for rows in results.values() for r in rows
                                  if r["status"] == "refused")
    print("\nRefused, by keyword:", ", ".join(f"{k} {v}" for k, v in refusals.most_common()))
    print("\nTop refusal reasons:")
    for reason, count in reasons.most_common(12):
        print(f"- {count} × {reason}")
    bad = [(n, r) for n, rows in results.items() for r in rows if r["status"] == "crashed" or r.get("invalid")]
    print(f"\nCrashed or produced an invalid sample: {len(bad)}")
    for name, r in bad[:10]:
        print(f"- {name} {r['id']}: {r.get('message') or r['invalid']}")
    print(f"\n{seconds:.0f} s, samples per schema {args.samples}, seed {args.seed}")


def _row(name, n, c, smp, val, par, parse) -> None:
    pct = lambda a, b: f"{a} ({100 * a / b:.1f}%)" if b else "0"
    print(f"| {name} | {n} | {pct(c['converted'], n)} | {pct(c['refused'], n)} | {c['crashed']} | {smp} | "
          f"{pct(val, smp)} |" + (f" {pct(par, smp)} |" if parse else ""))


if __name__ == "__main__":
    main()
