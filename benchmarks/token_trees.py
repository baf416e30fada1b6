"""Training-free token trees (spec=lookup, spec=recycle) vs the chain n-gram drafter and plain decoding.

Batch 1, greedy (T=0), chat template, the first --per-category prompts of every category of
../shared/data/prompts/specbench_dev.jsonl plus --humaneval prompts of humaneval_dev.jsonl. For every
prompt the setups run back to back in one process (plain first, then each method), so machine noise
hits them alike; a call that compiled a program is run again and only the second run counts. Reported
per category and over the whole set: speedup (plain wall time / method wall time, prompt and prefill
included; "decode" excludes the prefill), tau (tokens per target forward, bonus token counted), the
share of plain rounds the adaptive policy chose, and whether the greedy tokens equal plain greedy's.

    python benchmarks/token_trees.py [--model PATH|qwen2.5-coder-1.5b-instruct] [--weights q4]
        [--setups ngram:8,lookup:12,recycle:12] [--per-category 2] [--humaneval 4] [--new-tokens 128]
        [--out results.jsonl]

A setup is METHOD:K[:key=value...] with SpecConfig fields, e.g. lookup:16:lookup_depth=6 or
recycle:8:adaptive=0.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
from pathlib import Path

from specjax.decode import GenerateConfig, Generator, SpecConfig, SpeculativeGenerator
from specjax.models.loading import load_model

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "prompts"


def load_prompts(per_category: int, humaneval: int) -> list[dict]:
    """[{id, category, prompt}]: the first per_category of each Spec-Bench category, then HumanEval."""
    rows, seen = [], collections.Counter()
    for line in (SHARED / "specbench_dev.jsonl").read_text().splitlines():
        r = json.loads(line)
        if seen[r["category"]] < per_category:
            seen[r["category"]] += 1
            rows.append({"id": r["id"], "category": r["category"], "prompt": r["prompt"]})
    for line in (SHARED / "humaneval_dev.jsonl").read_text().splitlines()[:humaneval]:
        r = json.loads(line)
        rows.append({"id": r["id"], "category": "humaneval", "prompt": r["prompt"]})
    return rows


def parse_setup(text: str) -> tuple[str, SpecConfig]:
    """'lookup:16:lookup_depth=6' → (the name as typed, SpecConfig)."""
    method, k, *kv = text.split(":")
    extra = {}
    for item in kv:
        key, _, value = item.partition("=")
        extra[key] = json.loads(value)
    if "adaptive" in extra:
        extra["adaptive"] = bool(extra["adaptive"])
    return text, SpecConfig(k=int(k), method=method, **extra)


def timed(gen, text: str, cfg: GenerateConfig, spec: SpecConfig | None):
    """(completion, stats) of one prompt; rerun once when the call compiled a program."""
    for _ in range(2):
        out, st = gen.generate([text], cfg) if spec is None else gen.generate([text], cfg, spec)
        if st.compiled == 0:
            break
    return out[0], st


def run(args) -> list[dict]:
    model, tok = load_model(args.model, weights=args.weights) if args.model else load_model()
    setups = dict(parse_setup(s) for s in args.setups.split(","))
    cfg = GenerateConfig(max_new_tokens=args.new_tokens, batch_size=1, ignore_eos=True, chat=True)
    plain = Generator(model, tok)
    gens = {name: SpeculativeGenerator(model, tok) for name in setups}
    rows = []
    for p in load_prompts(args.per_category, args.humaneval):
        meta = {"id": p["id"], "category": p["category"]}
        base, pst = timed(plain, p["prompt"], cfg, None)
        rows.append({**meta, "setup": "plain", "wall_s": pst.wall_s, "decode_s": pst.decode_s,
                     "tokens": pst.new_tokens, "rounds": pst.new_tokens, "tau": 1.0, "plain_rate": 1.0, "same": True})
        for name, spec in setups.items():
            out, st = timed(gens[name], p["prompt"], cfg, spec)
            rows.append({**meta, "setup": name, "wall_s": st.wall_s, "decode_s": st.decode_s, "tokens": st.new_tokens,
                         "rounds": st.rounds, "tau": st.tau, "plain_rate": st.plain_rate,
                         "same": out.tokens == base.tokens})
            print(f"{p['id']:<18} {name:<22} tau {st.tau:.2f}, {st.wall_s:.2f} s (plain {pst.wall_s:.2f} s), "
                  f"plain rounds {st.plain_rate:.0%}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: per category and overall, each setup's speedup (end to end / decode only) and tau."""
    setups = [s for s in dict.fromkeys(r["setup"] for r in rows) if s != "plain"]
    cats = list(dict.fromkeys(r["category"] for r in rows)) + ["all"]
    head = "| category | n | " + " | ".join(f"{s} speedup (decode) | τ | plain rounds" for s in setups) + " |"
    lines = [head, "|" + " --- |" * (2 + 3 * len(setups))]
    for cat in cats:
        sel = [r for r in rows if cat == "all" or r["category"] == cat]
        by = collections.defaultdict(list)
        for r in sel:
            by[r["setup"]].append(r)
        pw, pd = sum(r["wall_s"] for r in by["plain"]), sum(r["decode_s"] for r in by["plain"])
        cells = []
        for s in setups:
            rs = by[s]
            rounds = sum(r["rounds"] for r in rs)
            tau = sum(r["tau"] * r["rounds"] for r in rs) / max(rounds, 1)
            pr = sum(r["plain_rate"] * r["rounds"] for r in rs) / max(rounds, 1)
            same = "" if all(r["same"] for r in rs) else " (differs)"
            cells.append(f"{pw / sum(r['wall_s'] for r in rs):.2f}× ({pd / sum(r['decode_s'] for r in rs):.2f}×)"
                         f"{same} | {tau:.2f} | {pr:.0%}")
        lines.append(f"| {cat} | {len(by['plain'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    print(table(rows))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
