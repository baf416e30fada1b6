"""Training-free token trees (spec=lookup, spec=recycle) vs the chain n-gram drafter and plain decoding.

Batch 1, greedy (T=0), chat template, the first --per-category prompts of every category of
../shared/data/prompts/specbench_dev.jsonl plus --humaneval prompts of humaneval_dev.jsonl. For every
prompt the setups run back to back in one process (plain first, then each method), so machine noise
hits them alike; a call that compiled a program is run again and only the second run counts. Reported
per category and over the whole set: speedup (plain wall time / method wall time, prompt and prefill
included; "decode" excludes the prefill), tau (tokens per target forward, bonus token counted), the
share of plain rounds the adaptive policy chose, and whether the greedy tokens equal plain greedy's.
The whole grid (both targets, T=0/1, batch 1/8, a plot) is experiments/specbench/.

    python benchmarks/token_trees.py [--model PATH|qwen2.5-coder-1.5b-instruct] [--weights q4]
        [--setups ngram:8,lookup:12,recycle:12] [--per-category 2] [--humaneval 4] [--new-tokens 128]
        [--out results.jsonl]

A setup is METHOD:K[:key=value...] with SpecConfig fields, e.g. lookup:16:lookup_depth=6 or
recycle:8:adaptive=0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

from spec_harness import generate_config, load_prompts, markdown, measure_unit, parse_setup, summarize

from specjax.decode import Generator, SpeculativeGenerator
from specjax.models.loading import load_model


def run(args) -> list[dict]:
    model, tok = load_model(args.model, weights=args.weights) if args.model else load_model()
    setups = dict(parse_setup(s) for s in args.setups.split(","))
    cfg = generate_config(args.new_tokens, batch=1, temperature=0.0)
    plain = Generator(model, tok)
    gens = {name: SpeculativeGenerator(model, tok) for name in setups}
    rows = []
    for p in load_prompts(args.per_category, args.humaneval):
        for row in measure_unit(plain, gens, setups, [p], cfg, {"target": args.model or "", "T": 0.0, "batch": 1}):
            rows.append(row)
            if row["setup"] != "plain":
                print(f"{p['id']:<18} {row['setup']:<22} tau {row['tau']:.2f}, {row['wall_s']:.2f} s, "
                      f"plain rounds {row['plain_rate']:.0%}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--weights", default="float32")
    ap.add_argument("--setups", default="ngram:8,lookup:12,recycle:12")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--humaneval", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    start = datetime.datetime.now(datetime.UTC)
    rows = run(args)
    load = os.getloadavg()
    print(f"\n{start:%Y-%m-%d %H:%M} UTC, load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(markdown(summarize(rows)))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
