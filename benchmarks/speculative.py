"""Prompt-lookup (n-gram) speculative decoding vs plain decoding on Gemma 3 270M.

First increment of the speculative benchmark: specjax only (HF prompt lookup and llama.cpp side
by side are still to come). For each prompt and draft length k: plain greedy tok/s, speculative
tok/s, speedup, tau (tokens per target forward, counting the correction/bonus token), acceptance
by draft position, the share of plain one-token rounds and the mean draft length per round that
adaptive drafting chose, and whether the speculative tokens equal plain greedy's.

    python benchmarks/speculative.py [--new-tokens 128] [--k 2,4,8] [--reps 2] [--min-expected-accept 2.0]
                                     [--no-adaptive]

Prompts: an input-grounded code-edit prompt built from the Python standard library's json/encoder.py
(text every install has) and two open-ended ones.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

from specjax.decode.generate import GenerateConfig, Generator
from specjax.decode.speculative import SpecConfig, SpeculativeGenerator
from specjax.models.loading import load_model


def prompts() -> dict[str, str]:
    code = (Path(json.__file__).parent / "encoder.py").read_text()[2000:3200]
    return {
        "code-edit": f"Here is some Python code:\n\n{code}\n\nHere is the same code with the comments removed:\n\n",
        "story": "Once upon a time, in a small village at the foot of the mountains, there lived an old clockmaker who",
        "facts": "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", default="2,4,8", help="comma list of draft lengths")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--min-expected-accept", type=float, default=SpecConfig.min_expected_accept,
                    help="adaptive drafting threshold (accepted draft tokens per round)")
    ap.add_argument("--no-adaptive", action="store_true", help="speculate every round")
    args = ap.parse_args()
    model, tok = load_model()
    plain, spec = Generator(model, tok), SpeculativeGenerator(model, tok)
    cfg = GenerateConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    ks = [int(k) for k in args.k.split(",")]

    def spec_cfg(k: int) -> SpecConfig:
        return SpecConfig(k=k, adaptive=not args.no_adaptive, min_expected_accept=args.min_expected_accept)

    rows = []
    for name, p in prompts().items():
        plain.generate([p], cfg)  # compile
        for k in ks:
            spec.generate([p], cfg, spec_cfg(k))
        base_runs = [plain.generate([p], cfg) for _ in range(args.reps)]
        base = statistics.median(s.tokens_per_s for _, s in base_runs)
        for k in ks:
            runs = [spec.generate([p], cfg, spec_cfg(k)) for _ in range(args.reps)]
            out, st = runs[-1]
            tps = statistics.median(s.tokens_per_s for _, s in runs)
            rows.append((name, k, base, tps, st.tau, st.acceptance_by_position, st.plain_rate, st.mean_draft_len,
                         out[0].tokens == base_runs[-1][0][0].tokens))
    print(f"### n-gram speculative decoding, Gemma 3 270M, greedy, {args.new_tokens} new tokens, batch 1 — "
          f"{datetime.date.today().isoformat()}\n\n`python benchmarks/speculative.py --k {args.k} "
          f"--reps {args.reps}{' --no-adaptive' if args.no_adaptive else ''} "
          f"--min-expected-accept {args.min_expected_accept}`\n\n"
          "| prompt | k | plain tok/s | spec tok/s | speedup | tau | acceptance by position | plain rounds "
          "| mean draft | = plain greedy |\n|---|---|---|---|---|---|---|---|---|---|")
    for name, k, base, tps, tau, acc, plain_rate, mean_draft, same in rows:
        print(f"| {name} | {k} | {base:.1f} | {tps:.1f} | {tps / base:.2f}x | {tau:.2f} | "
              f"{' '.join(f'{a:.2f}' for a in acc)} | {plain_rate:.0%} | {mean_draft:.2f} | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
