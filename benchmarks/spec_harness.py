"""Shared harness of the speculative benchmarks: Spec-Bench-style prompts, setups, paired timed runs, tables.

Used by benchmarks/token_trees.py and experiments/specbench/run.py. One *unit* is one generate call:
a single prompt at batch 1, a group of `batch` consecutive prompts otherwise. For every unit, plain
decoding runs first and then every setup, back to back in one process, so machine noise hits them
alike; a call that compiled a program is run again and only the warm run counts.

A row (one unit × one setup) is a flat dict, written as one JSON line:
  target, T, batch, ids, category, setup, wall_s, decode_s, tokens, rounds, tau, plain_rate,
  mean_draft, same (greedy: tokens equal plain's; None when sampling), note.
Speedup is always computed from rows of the same run: plain wall time / setup wall time, summed over
the units of a category (prompt and prefill included); "decode" speedup uses the time after the first
token. τ is tokens per target forward with the correction/bonus token counted (plain rounds: 1).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from specjax.decode import GenerateConfig, SamplingConfig, SpecConfig

# ../shared/data/prompts of the checkout (or of a folder above a worktree)
SHARED = next((p / "shared" / "data" / "prompts" for p in Path(__file__).resolve().parents[1:]
               if (p / "shared" / "data" / "prompts").is_dir()), Path("../shared/data/prompts"))
MIXED = "mixed"  # the category of a batch whose prompts come from several categories


def load_prompts(per_category: int, humaneval: int, shared: Path = SHARED) -> list[dict]:
    """[{id, category, prompt}]: the first `per_category` of each Spec-Bench dev category, then HumanEval dev."""
    rows, seen = [], collections.Counter()
    for line in filter(str.strip, (shared / "specbench_dev.jsonl").read_text().splitlines()):  # blank lines skipped
        r = json.loads(line)
        if seen[r["category"]] < per_category:
            seen[r["category"]] += 1
            rows.append({"id": r["id"], "category": r["category"], "prompt": r["prompt"]})
    for line in list(filter(str.strip, (shared / "humaneval_dev.jsonl").read_text().splitlines()))[:humaneval]:
        r = json.loads(line)
        rows.append({"id": r["id"], "category": "humaneval", "prompt": r["prompt"]})
    return rows


def parse_setup(text: str) -> tuple[str, SpecConfig]:
    """'lookup:16:lookup_depth=6' → (the name as typed, SpecConfig); values are JSON ('adaptive=0' is False)."""
    method, k, *kv = text.split(":")
    extra = {}
    for item in kv:
        key, _, value = item.partition("=")
        extra[key] = json.loads(value)
    if "adaptive" in extra:
        extra["adaptive"] = bool(extra["adaptive"])
    return text, SpecConfig(k=int(k), method=method, **extra)


def units(prompts: list[dict], batch: int) -> Iterator[list[dict]]:
    """Consecutive groups of `batch` prompts (the last one may be short)."""
    for i in range(0, len(prompts), batch):
        yield prompts[i:i + batch]


def unit_category(unit: list[dict]) -> str:
    cats = {p["category"] for p in unit}
    return cats.pop() if len(cats) == 1 else MIXED


def timed(gen, texts: list[str], cfg: GenerateConfig, spec: SpecConfig | None):
    """(completions, stats) of one generate call; rerun once when the call compiled a program."""
    for _ in range(2):
        outs, st = gen.generate(texts, cfg) if spec is None else gen.generate(texts, cfg, spec)
        if st.compiled == 0:
            break
    return outs, st


def generate_config(new_tokens: int, batch: int, temperature: float, seed: int = 0) -> GenerateConfig:
    """Chat-templated, EOS ignored (every setup produces the same number of tokens)."""
    return GenerateConfig(max_new_tokens=new_tokens, batch_size=batch, ignore_eos=True, chat=True,
                          sampling=SamplingConfig(temperature=temperature, seed=seed))


def measure_unit(plain, gens: dict, setups: dict[str, SpecConfig], unit: list[dict], cfg: GenerateConfig,
                 meta: dict, reps: int = 1) -> Iterator[dict]:
    """Rows of one unit: plain and every setup, `reps` times. Repetition r starts at the r-th of them
    (plain, then the setups in order, rotated), so no setup always runs right after the same one; each
    row reports its setup's median-time repetition (the lower median for an even count)."""
    texts = [p["prompt"] for p in unit]
    meta = {**meta, "ids": [p["id"] for p in unit], "category": unit_category(unit), "reps": reps}
    greedy = cfg.sampling.temperature == 0
    names = ["plain", *setups]
    runs = {n: [] for n in names}
    for r in range(reps):
        for n in names[r % len(names):] + names[:r % len(names)]:
            runs[n].append(timed(plain if n == "plain" else gens[n], texts, cfg, setups.get(n)))

    def median(results):
        return sorted(results, key=lambda o: o[1].wall_s)[(len(results) - 1) // 2]

    base, pst = median(runs["plain"])
    yield {**meta, "setup": "plain", "wall_s": pst.wall_s, "decode_s": pst.decode_s, "tokens": pst.new_tokens,
           "rounds": pst.new_tokens, "tau": 1.0, "plain_rate": 1.0, "mean_draft": 0.0, "same": True if greedy else None,
           "note": ""}
    for name in setups:
        outs, st = median(runs[name])
        same = all([o.tokens for o in outs] == [o.tokens for o in base] for outs, _ in runs[name]) if greedy else None
        yield {**meta, "setup": name, "wall_s": st.wall_s, "decode_s": st.decode_s, "tokens": st.new_tokens,
               "rounds": st.rounds, "tau": st.tau, "plain_rate": st.plain_rate, "mean_draft": st.mean_draft_len,
               "same": same, "note": st.note}


def read_rows(paths: Iterable[Path]) -> list[dict]:
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return rows


def summarize(rows: list[dict]) -> dict:
    """{(target, T, batch): {category or 'all': {setup: cell}}} with cell = speedup, decode_speedup, tau,
    plain_rate, same (all greedy units equal plain; None when sampling), n (units). Only units that have
    a plain row count (`_cells`); categories keep first-seen order, 'all' last."""
    by_setting = collections.defaultdict(list)
    for r in rows:
        by_setting[(r.get("target", ""), r["T"], r["batch"])].append(r)
    out = {}
    for key, rs in by_setting.items():
        cats = list(dict.fromkeys(r["category"] for r in rs)) + ["all"]
        out[key] = {c: _cells([r for r in rs if c == "all" or r["category"] == c]) for c in cats}
    return out


def _cells(rs: list[dict]) -> dict:
    by = collections.defaultdict(list)
    for r in rs:
        by[r["setup"]].append(r)
    plain = {tuple(r["ids"]): r for r in by.pop("plain", [])}
    cells = {}
    for setup, srs in by.items():
        srs = [r for r in srs if tuple(r["ids"]) in plain]
        if not srs:
            continue
        pw = sum(plain[tuple(r["ids"])]["wall_s"] for r in srs)
        pd = sum(plain[tuple(r["ids"])]["decode_s"] for r in srs)
        rounds = sum(r["rounds"] for r in srs)
        sames = [r["same"] for r in srs]
        cells[setup] = {
            "speedup": pw / sum(r["wall_s"] for r in srs),
            "decode_speedup": pd / max(sum(r["decode_s"] for r in srs), 1e-9),
            "tau": sum(r["tau"] * r["rounds"] for r in srs) / max(rounds, 1),
            "plain_rate": sum(r["plain_rate"] * r["rounds"] for r in srs) / max(rounds, 1),
            "same": None if None in sames else all(sames),
            "n": len(srs),
        }
    return cells


def table(cats: dict) -> str:
    """Markdown of one setting of `summarize`: a row per category, per setup speedup (decode) | τ | plain rounds."""
    setups = list(dict.fromkeys(s for cells in cats.values() for s in cells))
    head = "| category | n | " + " | ".join(f"{s} speedup (decode) | τ | plain rounds" for s in setups) + " |"
    lines = [head, "|" + " --- |" * (2 + 3 * len(setups))]
    for cat, cells in cats.items():
        n = max((c["n"] for c in cells.values()), default=0)
        parts = []
        for s in setups:
            c = cells.get(s)
            if c is None:
                parts.append("— | — | —")
                continue
            flag = "" if c["same"] in (True, None) else " (differs)"
            parts.append(f"{c['speedup']:.2f}× ({c['decode_speedup']:.2f}×){flag} | {c['tau']:.2f} | "
                         f"{c['plain_rate']:.0%}")
        lines.append(f"| {cat} | {n} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def markdown(summary: dict, heading: str = "###") -> str:
    """Every setting of `summarize` as a headed table, then the worst whole-set speedup."""
    parts = [f"{heading} {target}, T={temp:g}, batch {batch}\n\n{table(cats)}\n"
             for (target, temp, batch), cats in summary.items()]
    if (w := worst(summary)) is not None:
        parts.append(f"Worst whole-set speedup of any setting: **{w[0]:.2f}×** ({w[1]}).\n")
    return "\n".join(parts)


def worst(summary: dict) -> tuple[float, str] | None:
    """The lowest whole-set speedup over every setting and setup, with its label (the number to report)."""
    cells = [(c["speedup"], f"{t} T={T:g} batch {b} {s}") for (t, T, b), cats in summary.items()
             for s, c in cats["all"].items()]
    return min(cells) if cells else None
