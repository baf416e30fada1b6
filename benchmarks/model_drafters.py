"""Model-based chain drafters on Gemma 3 270M: layer skipping (early exit after N of 18 layers, full or
reduced draft vocabulary) and a separate draft model, vs plain greedy decoding in the same run.

Per configuration: tok/s and its ratio to plain specjax, tau (tokens per target forward, counting the
correction/bonus token), acceptance by draft position, ms per round, and whether the greedy tokens equal
plain greedy's (a divergence is reported with the plain top-2 logit margin at its first position).
The n-gram drafter at the same k is listed as the "free draft" baseline: its ms/round is the verify
forward alone, so a model drafter's extra ms/round is its k draft steps.

    python benchmarks/model_drafters.py [--new-tokens 96] [--k 4] [--layers 2,4,6] [--vocab 0,16384,32768]
                                        [--prompts 3] [--reps 1]

Prompts: the first `--prompts` of ../shared/data/prompts/alpaca_80.jsonl (chat template), and with
--code-edit the code-edit prompt of benchmarks/speculative.py (input-grounded). The reduced draft
vocabulary: the most frequent ids of gsm8k_train + alpaca_eval + alpaca_seed_tasks (prompts and
references; not alpaca_80).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.decode.draft_model import DraftModelDrafter, slice_model
from specjax.decode.drafters import NgramDrafter
from specjax.decode.generate import GenerateConfig, Generator
from specjax.decode.layer_skip import LayerSkipDrafter, reduced_head
from specjax.decode.spec_methods import corpus_texts
from specjax.decode.speculative import SpecConfig, SpeculativeGenerator
from specjax.models.draft_vocab import DraftVocab
from specjax.models.loading import load_model

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "prompts"
CORPUS = ("gsm8k_train.jsonl", "alpaca_eval.jsonl", "alpaca_seed_tasks.jsonl")


def bench_prompts(n: int, tok, code_edit: bool) -> list[str]:
    rows = [json.loads(line)["prompt"] for line in (DATA / "alpaca_80.jsonl").read_text().splitlines()[:n]]
    chat = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in rows]
    if not code_edit:
        return chat
    code = (Path(json.__file__).parent / "encoder.py").read_text()[2000:3200]
    return [*chat, f"Here is some Python code:\n\n{code}\n\nHere is the same code with the comments removed:\n\n"]


def token_counts(tok, vocab: int) -> np.ndarray:
    counts = np.zeros((vocab,), np.int64)
    for name in CORPUS:
        for text in corpus_texts(DATA / name):
            counts += np.bincount(np.asarray(tok.encode(text, add_bos=False)), minlength=vocab)
    return counts


def top2_margin(model, ids: list[int]) -> float:
    """Plain greedy's top-2 logit margin for the token after `ids` (uncached forward)."""
    x = jnp.asarray([ids])
    logits = np.asarray(model.logits(model(x, jnp.arange(len(ids))[None])[0][:, -1:])[0, 0])
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--layers", default="2,4,6")
    ap.add_argument("--vocab", default="0,16384,32768", help="draft vocabulary sizes (0 = full)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--code-edit", action="store_true", help="add benchmarks/speculative.py's code-edit prompt")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--draft-slice", type=int, default=2, help="layers of the sliced 'separate' draft model (0: skip)")
    args = ap.parse_args()
    model, tok = load_model()
    prompts = bench_prompts(args.prompts, tok, args.code_edit)
    cfg = GenerateConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    counts = token_counts(tok, model.cfg.vocab_size)

    configs = [("ngram", NgramDrafter(), ())]
    for n in (int(x) for x in args.layers.split(",")):
        for v in (int(x) for x in args.vocab.split(",")):
            params = () if v == 0 else reduced_head(model, DraftVocab.from_counts(counts, v, model.cfg.eos_ids))
            configs.append((f"layerskip N={n}" + (f" vocab {v}" if v else ""), LayerSkipDrafter.early_exit(n), params))
    if args.draft_slice:
        d, p = DraftModelDrafter.create(slice_model(model, range(args.draft_slice)), model)
        configs.append((f"draft model = layers 0-{args.draft_slice - 1} (own cache)", d, p))

    plain = Generator(model, tok)
    spec = SpecConfig(k=args.k, adaptive=False)
    results = {name: [] for name, _, _ in configs}
    gens = {name: SpeculativeGenerator(model, tok, drafter, params) for name, drafter, params in configs}
    for pi, prompt in enumerate(prompts):
        plain.generate([prompt], cfg)  # compile
        base_runs = [plain.generate([prompt], cfg) for _ in range(args.reps)]
        ref = base_runs[-1][0][0].tokens
        base = statistics.median(s.tokens_per_s for _, s in base_runs)
        for v in (int(x) for x in args.vocab.split(",")):
            if v:
                kept = DraftVocab.from_counts(counts, v, model.cfg.eos_ids)
                print(f"prompt {pi}: vocab {v} covers {np.isin(ref, kept.ids_n).mean():.1%} of plain greedy's tokens",
                      file=sys.stderr)
        for name, gen in gens.items():
            gen.generate([prompt], cfg, spec)  # compile
            runs = [gen.generate([prompt], cfg, spec) for _ in range(args.reps)]
            out, st = runs[-1]
            tps = statistics.median(s.tokens_per_s for _, s in runs)
            got = out[0].tokens
            first = next((i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b), None)
            margin = None if first is None else top2_margin(model, tok.encode(prompt) + ref[:first])
            results[name].append((base, tps, st.tau, st.acceptance_by_position, st.ms_per_round, first, margin))
            print(f"prompt {pi} {name}: {tps / base:.2f}x tau {st.tau:.2f} {st.ms_per_round:.1f} ms/round "
                  f"(plain {1000 / base:.1f} ms/token) diverges at {first} margin {margin}", file=sys.stderr)

    print(f"| drafter (k={args.k}, {args.new_tokens} tokens, {len(prompts)} prompts) | speedup vs plain | tau "
          "| acceptance by position | ms/round | plain ms/token | = plain greedy |\n|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        speed = statistics.mean(r[1] / r[0] for r in rows)
        tau = statistics.mean(r[2] for r in rows)
        acc = np.mean([r[3] for r in rows], axis=0)
        same = sum(r[5] is None for r in rows)
        ties = [f"{r[6]:.3f}" for r in rows if r[5] is not None]
        print(f"| {name} | {speed:.2f}x | {tau:.2f} | {' '.join(f'{a:.2f}' for a in acc)} | "
              f"{statistics.mean(r[4] for r in rows):.1f} | {statistics.mean(1000 / r[0] for r in rows):.1f} | "
              f"{same}/{len(rows)}" + (f" (diverged at margins {', '.join(ties)})" if ties else "") + " |")


if __name__ == "__main__":
    main()
