"""What a plain round costs inside the speculative program, against plain decoding's step (Gemma 3 270M, CPU).

A speculative program runs plain one-token rounds whenever the adaptive policy backs off; they should cost
what plain decoding does. Per call: plain decoding, then the speculative program with every round plain
(the bar out of reach: `verify_cost=60, min_best_gain=0`, n-gram proposals backing off) and with the default
adaptive n-gram policy, each with the CPU profile's fusion fence before the one-row head and without it
(`head_barrier=False`: what the removed optimization barrier gave, docs/benchmarks.md). Greedy, the CLI's
default prompt, EOS ignored, calls interleaved; ms per generated token after the first, the upper median of
the warm reps (the first rep is dropped).

    python benchmarks/plain_rounds.py [--weights q4] [--k 8] [--tokens 128] [--reps 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_harness import timed  # noqa: E402

from specjax.decode import GenerateConfig, Generator, SamplingConfig, SpecConfig, SpeculativeGenerator  # noqa: E402
from specjax.decode.backend import CPU  # noqa: E402
from specjax.decode.prompts import DEFAULT_PROMPT  # noqa: E402
from specjax.models import load_model  # noqa: E402

WEIGHTS = ("float32", "bfloat16", "int8", "q4")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="q4")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.weights not in WEIGHTS:
        fail(f"--weights: unknown {args.weights!r} (known: {', '.join(WEIGHTS)})")
    if args.k < 1 or args.tokens < 2 or args.reps < 2:
        fail("--k must be ≥ 1, --tokens ≥ 2 and --reps ≥ 2 (the first rep is dropped)")
    model, tok = load_model("gemma3-270m", weights=args.weights)
    gens = {"plain": Generator(model, tok)}
    for name, profile in (("fence", CPU), ("no fence", dataclasses.replace(CPU, head_barrier=False))):
        gens[name] = SpeculativeGenerator(model, tok, profile=profile)
    setups = {"every round plain": SpecConfig(k=args.k, verify_cost=60.0, min_best_gain=0.0),
              f"adaptive n-gram k={args.k}": SpecConfig(k=args.k)}
    cfg = GenerateConfig(max_new_tokens=args.tokens, ignore_eos=True, sampling=SamplingConfig(temperature=0.0))
    runs = [("plain decoding", "plain", None)] + [(f"{s}, {g}", g, c) for s, c in setups.items()
                                                   for g in ("fence", "no fence")]
    ms = {label: [] for label, _, _ in runs}
    for _ in range(args.reps):
        for label, gen, spec in runs:
            _, st = timed(gens[gen], [DEFAULT_PROMPT], cfg, spec)
            ms[label].append(st.decode_s * 1e3 / (args.tokens - 1))
    print(f"Gemma 3 270M {args.weights}, greedy, {args.tokens} tokens, load {os.getloadavg()[0]:.2f}\n")
    print("| program | ms per token | vs plain decoding |\n| --- | --- | --- |")
    plain = sorted(ms["plain decoding"][1:])[(args.reps - 1) // 2]
    for label, v in ms.items():
        m = sorted(v[1:])[(args.reps - 1) // 2]  # the upper median of the warm reps
        print(f"| {label} | {m:.2f} | {m / plain - 1:+.1%} |")


if __name__ == "__main__":
    main()
