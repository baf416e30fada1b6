"""Spec-Bench-style reproduction run: every shipped speculative method against plain decoding.

For one target model, every combination of temperature (--temps) and batch size (--batch): the first
--per-category prompts of each category of ../shared/data/prompts/specbench_dev.jsonl plus --humaneval
prompts of humaneval_dev.jsonl, chat-templated, --new-tokens tokens each (EOS ignored, so every setup
produces the same tokens' worth of work). Per unit (a prompt at batch 1, a group of `batch` consecutive
prompts otherwise) plain decoding and every setup run back to back in one process, --reps times in
rotated order, each row reporting its median repetition; a call that compiled is run again
(benchmarks/spec_harness.py has the row format and the definitions). One repetition moves identical
programs by up to ~15% on a shared 2-core machine: use --reps 3 for per-category figures.

Rows are appended to --out as they finish, and a rerun with the same --out skips the units already
measured, so an interrupted run loses nothing. `report.py` turns result files into the table and plot.

    python experiments/specbench/run.py --target gemma3-270m --out experiments/specbench/results/gemma3-270m.jsonl
    python experiments/specbench/run.py --target qwen2.5-coder-1.5b-instruct --weights q4 \
        --out experiments/specbench/results/qwen2.5-coder-1.5b-instruct.jsonl

Setups are METHOD:K[:key=value...] with SpecConfig fields (e.g. recycle:8:adaptive=0). The defaults
are the training-free methods; trained drafters need their run directory, e.g.
eagle:10:draft_checkpoint="/path/to/run".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from spec_harness import (  # noqa: E402
    SHARED,
    generate_config,
    load_prompts,
    markdown,
    measure_unit,
    parse_setup,
    read_rows,
    summarize,
    units,
)

DEFAULT_SETUPS = "ngram:4,ngram:8,lookup:12,recycle:8"


def done_units(out: Path, setups: list[str]) -> set[tuple]:
    """(T, batch, ids) of the units in `out` that have a plain row and a row for every setup."""
    if not out.exists():
        return set()
    have: dict[tuple, set[str]] = {}
    for r in read_rows([out]):
        have.setdefault((r["T"], r["batch"], tuple(r["ids"])), set()).add(r["setup"])
    need = {"plain", *setups}
    return {key for key, got in have.items() if need <= got}


def fail(message: str) -> SystemExit:
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(2)


def plan(args) -> tuple[dict, list[tuple[int, float, list[dict]]]]:
    """(setups, [(batch, temperature, unit)] not yet in --out), or SystemExit(2) after one `error:` line."""
    try:
        setups = dict(parse_setup(s) for s in args.setups.split(","))
        batches = [int(b) for b in args.batch.split(",")]
        temps = [float(t) for t in args.temps.split(",")]
    except (ValueError, TypeError) as e:
        raise fail(f"bad --setups, --batch or --temps: {e}") from None
    try:
        prompts = load_prompts(args.per_category, args.humaneval, Path(args.prompts))[:args.limit or None]
    except (OSError, ValueError, KeyError) as e:  # a missing file, a line that is not JSON, a row without a field
        raise fail(f"cannot read the prompt sets in {args.prompts}: {type(e).__name__}: {e}") from None
    if not prompts:
        raise fail("no prompts selected (--per-category, --humaneval, --limit)")
    if args.reps < 1:
        raise fail(f"--reps must be >= 1, got {args.reps}")
    done = done_units(Path(args.out), list(setups))
    todo = [(b, t, u) for b in batches for t in temps for u in units(prompts, b)
            if (t, b, tuple(p["id"] for p in u)) not in done]
    return setups, todo


def run(args, setups: dict, todo: list) -> None:
    """Measures every pending unit, appending each unit's rows to --out as soon as they exist."""
    from specjax.decode import Generator, SpeculativeGenerator
    from specjax.models.loading import load_model

    try:
        model, tok = load_model(args.target, weights=args.weights, activations=args.activations)
    except (ValueError, OSError) as e:  # ModelFileError is a ValueError
        raise fail(str(e)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plain = Generator(model, tok)
    gens = {name: SpeculativeGenerator(model, tok) for name in setups}
    for i, (batch, temp, unit) in enumerate(todo):
        cfg = generate_config(args.new_tokens, batch, temp, seed=args.seed)
        meta = {"target": args.target, "weights": args.weights, "activations": args.activations, "T": temp,
                "batch": batch, "load": round(os.getloadavg()[0], 2)}
        rows = list(measure_unit(plain, gens, setups, unit, cfg, meta, args.reps))
        with out.open("a") as f:  # a unit lands whole or not at all
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        base = rows[0]["wall_s"]
        print(f"T={temp:g} b={batch} {rows[0]['ids'][0]:<18} plain {base:.2f} s | " + " | ".join(
            f"{r['setup']} {base / r['wall_s']:.2f}x tau {r['tau']:.2f}" for r in rows[1:]), flush=True)
        if i + 1 == len(todo) or todo[i + 1][:2] != (batch, temp):
            for gen in [plain, *gens.values()]:  # a sweep compiles more programs than a process can map
                gen.release_programs()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="gemma3-270m", help="gemma3-270m | qwen2.5-coder-1.5b-instruct | a path")
    ap.add_argument("--weights", default="float32", help="float32 | bfloat16 | int8 | q4")
    ap.add_argument("--activations", default="float32", help="float32 | int8 (int8 / q4 weights only)")
    ap.add_argument("--setups", default=DEFAULT_SETUPS)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--humaneval", type=int, default=3)
    ap.add_argument("--prompts", default=str(SHARED), help="folder of specbench_dev.jsonl and humaneval_dev.jsonl")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts of that list (0: all)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1, help="repetitions per unit, rotated; rows keep the median")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    start = datetime.datetime.now(datetime.UTC)
    setups, todo = plan(args)
    if todo:
        run(args, setups, todo)
    load = os.getloadavg()
    print(f"\nstarted {start:%Y-%m-%d %H:%M} UTC, load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(markdown(summarize(read_rows([Path(args.out)]))))  # the whole file: earlier runs' units too


if __name__ == "__main__":
    main()
