"""τ and speedup of the three trained Gemma 3 270M drafters (draft model, Medusa, EAGLE) at T=0 and T=1, with
their training costs, as two markdown tables (README.md of this folder says where they go).

    python experiments/drafts_gemma3_270m/compare.py --draft runs/distill_gemma3_270m \
        --medusa runs/medusa_gemma3_270m --eagle runs/eagle_gemma3_270m [--ngram] [--n-dev 8] \
        [--new-tokens 128] [--batch 1] [--temps 0,1] [--reps 2] [--no-adaptive] > table.md

Decoding goes through benchmarks/speculative.py's `method_setup` (the drafters `spec_methods` builds from a
run directory) on its `dev` prompt set (the first --n-dev prompts of alpaca_80, kept out of the training
data), chat template, `ignore_eos`, every setup compiled first and then timed interleaved per repetition
(median tok/s), speedup against plain specjax decoding measured in the same loop. τ counts the bonus token.
Training cost per run comes from its metrics.jsonl (`wall_s` of the last train row: the run's wall time
since `train()` started, features and dev evaluations included; the last process only if it was resumed)
and its checkpoint's config (steps x batch x seq_len tokens). Any run may be left out.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    """benchmarks/speculative.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_speculative", ROOT / "benchmarks" / "speculative.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def training_cost(run: Path) -> dict:
    """Steps, tokens, minutes and last dev metrics of a training run directory."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in rows if r["split"] == "train"]
    dev = [r for r in rows if r["split"] == "dev"]
    tau = [r for r in rows if r["split"] == "tau"]
    best = sorted((p for p in (run / "best").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))[-1]
    cfg = json.loads((best / "meta" / "metadata").read_text())["config"]
    steps = train[-1]["step"] if train else 0
    if train and "wall_s" in train[-1]:
        minutes = f"{train[-1]['wall_s'] / 60:.1f}"
    else:  # runs from before wall_s: median step time x steps, no setup or evaluations
        minutes = f"≈{statistics.median(r['step_s'] for r in train) * steps / 60:.1f}" if train else "?"
    dev_acc = dev[-1].get("acc", float("nan")) if dev else float("nan")
    return {"steps": steps, "tokens": steps * cfg["batch_size"] * cfg["seq_len"], "minutes": minutes,
            "dev_acc": dev_acc, "dev_tau": tau[-1]["tau"] if tau else float("nan"), "best_step": int(best.name)}


def setups(bench, model, tok, args) -> dict:
    """name -> (generator, SpecConfig or None for plain decoding)."""
    from specjax.decode.generate import Generator

    opts = SimpleNamespace(layers=15, draft_vocab=0, draft_vocab_corpus=None, draft_model=args.draft,
                           medusa_checkpoint=args.medusa, eagle_checkpoint=args.eagle, eagle_depth=args.eagle_depth,
                           eagle_top_k=args.eagle_top_k, no_adaptive=args.no_adaptive,
                           min_expected_accept=args.min_expected_accept, probe_every=args.probe_every,
                           min_best_gain=args.min_best_gain)
    out = {"plain": (Generator(model, tok), None)}
    wanted = [("ngram", args.ngram_k, args.ngram), ("draft", args.draft_k, args.draft),
              ("medusa", args.medusa_k, args.medusa), ("eagle", args.eagle_k, args.eagle)]
    for method, k, enabled in wanted:
        if enabled:
            out[f"{method} k={k}"] = bench.method_setup(method, model, tok, k, opts)
    return out


def _generate(gen, spec, texts, cfg):
    return gen.generate(texts, cfg) if spec is None else gen.generate(texts, cfg, spec)


def decode_rows(bench, model, tok, args) -> list[dict]:
    from specjax.decode.generate import GenerateConfig
    from specjax.decode.sampling import SamplingConfig

    texts = list(bench.dev_prompts(args.n_dev).values())
    gens = setups(bench, model, tok, args)
    rows = []
    for temp in [float(t) for t in args.temps.split(",")]:
        cfg = GenerateConfig(max_new_tokens=args.new_tokens, batch_size=args.batch, ignore_eos=True, chat=True,
                             sampling=SamplingConfig(temperature=temp, seed=0))
        for g, sc in gens.values():  # compile outside the timing
            _generate(g, sc, texts, cfg)
        results = {name: [] for name in gens}
        for _ in range(args.reps):  # interleaved: machine noise hits every setup alike
            for name, (g, sc) in gens.items():
                results[name].append(_generate(g, sc, texts, cfg))
        base = statistics.median(s.tokens_per_s for _, s in results["plain"])
        plain_out = results["plain"][-1][0]
        for name, runs in results.items():
            out, st = runs[-1]
            tps = statistics.median(s.tokens_per_s for _, s in runs)
            rows.append({"T": temp, "setup": name, "tok_s": tps, "speedup": tps / base, "tau": getattr(st, "tau", 1.0),
                         "acc": getattr(st, "acceptance_by_position", ()), "plain_rate": getattr(st, "plain_rate", 1.0),
                         "same": None if temp > 0 else [o.tokens for o in out] == [o.tokens for o in plain_out]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", help="run directory of distill_gemma3_270m")
    ap.add_argument("--medusa", help="run directory of medusa_gemma3_270m")
    ap.add_argument("--eagle", help="run directory of eagle_gemma3_270m")
    ap.add_argument("--ngram", action="store_true", help="also prompt lookup (an untrained reference)")
    ap.add_argument("--draft-k", type=int, default=4, help="draft model chain length")
    ap.add_argument("--medusa-k", type=int, default=10, help="Medusa tree nodes")
    ap.add_argument("--eagle-k", type=int, default=10, help="EAGLE-2 tree nodes")
    ap.add_argument("--ngram-k", type=int, default=4)
    ap.add_argument("--eagle-depth", type=int, default=4)
    ap.add_argument("--eagle-top-k", type=int, default=4)
    ap.add_argument("--n-dev", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-adaptive", action="store_true", help="speculate every round (tau of the drafter alone)")
    ap.add_argument("--min-expected-accept", type=float, default=2.0)
    ap.add_argument("--probe-every", type=int, default=16, help="costly drafters: probe after this many plain rounds")
    ap.add_argument("--min-best-gain", type=float, default=1.5,
                    help="speculation off when a fully accepted round would gain less (0: never off)")
    args = ap.parse_args()
    runs = {m: Path(p) for m, p in (("draft", args.draft), ("medusa", args.medusa), ("eagle", args.eagle)) if p}
    if not runs and not args.ngram:
        sys.exit("error: give at least one of --draft, --medusa, --eagle (or --ngram)")
    for m, p in runs.items():
        if not (p / "metrics.jsonl").is_file() or not (p / "best").is_dir():
            sys.exit(f"error: --{m} {p}: not a finished specjax.train run (no metrics.jsonl or best/)")
    costs = {m: training_cost(p) for m, p in runs.items()}
    bench = _bench()
    from specjax.models.loading import load_model

    model, tok = load_model()
    rows = decode_rows(bench, model, tok, args)
    print(f"### Trained drafters on Gemma 3 270M — {datetime.date.today()}, load avg {os.getloadavg()[0]:.1f}\n\n"
          f"`python experiments/drafts_gemma3_270m/compare.py {' '.join(sys.argv[1:])}`\n\n"
          "Training (2-core CPU; minutes = wall time of the run incl. feature caching and dev evaluations):\n\n"
          "| drafter | run | steps | training tokens | minutes | dev acc | dev τ in training (last) |\n"
          "|---|---|---|---|---|---|---|")
    for m, c in costs.items():
        print(f"| {m} | `{runs[m]}` (best step {c['best_step']}) | {c['steps']} | {c['tokens']:,} | {c['minutes']} | "
              f"{c['dev_acc']:.3f} | {c['dev_tau']:.2f} |")
    print(f"\nDecoding: {args.n_dev} alpaca_80 prompts, chat, batch {args.batch}, {args.new_tokens} new tokens, "
          f"{args.reps} interleaved reps, adaptive {'off' if args.no_adaptive else 'on'}:\n\n"
          "| T | setup | tok/s | speedup vs plain | τ | acceptance by depth | plain rounds | = plain greedy |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['T']:g} | {r['setup']} | {bench.speed_cells(r)} | {bench.same_cell(r)} |")


if __name__ == "__main__":
    main()
