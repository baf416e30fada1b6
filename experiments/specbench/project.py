"""What a Spec-Bench run's rounds would cost on an accelerator: speedups projected from measured round costs.

A greedy run's rounds do not depend on the machine (up to near-ties in other precisions), only their
cost does. This script takes the rounds each setup ran on the real weights (experiments/specbench/run.py
rows: rounds and the share of plain rounds, here on the CPU) and the cost of a round in plain steps that
benchmarks/accelerator.py measured on the accelerator with random weights of the same shapes:

    projected steps = rounds x (plain_rate x p + (1 - plain_rate) x c)

where c is the cost of a speculative round of that method and k (the accelerator row with every round
speculative) and p that of the speculative program's plain round (`--plain-round-cost`: 1 is a plain
step; shadow proposals make it a little more). Plain decoding takes one step per token. The speedup per
category is plain's steps over the setup's, as in report.py's table.

Run the CPU rows with the policy the accelerator would use (its verify cost and bar), e.g.
`ngram:8:verify_cost=1.16:min_expected_accept=1`, since the policy decides which rounds speculate.

    python experiments/specbench/project.py ROWS.jsonl --costs benchmarks/results/accelerator_h200_….jsonl \
        [--plain-round-cost 1.03] [--md out.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from spec_harness import markdown, read_rows, summarize  # noqa: E402


def round_costs(path: Path) -> dict[tuple, float]:
    """{(target, T, batch, 'method:k'): c} from benchmarks/accelerator.py rows whose setup has no keys
    (every round speculative)."""
    costs = {}
    for row in read_rows([path]):
        setup = row.get("setup")
        if setup and setup != "plain" and setup.count(":") == 1:
            costs[(row["target"], float(row["T"]), int(row["batch"]), setup)] = float(row["cost"])
    return costs


def cost_of(costs: dict, row: dict) -> float:
    """The measured c of a Spec-Bench row's method and k, at its temperature (else the other's: the H200
    measured T = 0 and 1 alike)."""
    method_k = ":".join(row["setup"].split(":")[:2]).replace("eagle:", "eagle3:")
    key = (row["target"], float(row["T"]), int(row["batch"]), method_k)
    if key in costs:
        return costs[key]
    others = [c for (t, _, b, s), c in costs.items() if (t, b, s) == (key[0], key[2], key[3])]
    if not others:
        raise KeyError(f"no measured round cost for {row['target']} batch {row['batch']} {method_k}")
    return others[0]


def project(rows: list[dict], costs: dict, plain_round_cost: float) -> list[dict]:
    """Rows with wall_s and decode_s replaced by projected steps (plain: one per token)."""
    out = []
    for r in rows:
        if r["setup"] == "plain":
            steps = float(r["rounds"])
        else:
            c = cost_of(costs, r)
            steps = r["rounds"] * (r["plain_rate"] * plain_round_cost + (1.0 - r["plain_rate"]) * c)
        out.append({**r, "wall_s": steps, "decode_s": steps})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="JSONL files written by run.py")
    ap.add_argument("--costs", required=True, type=Path, help="JSONL rows of benchmarks/accelerator.py")
    ap.add_argument("--plain-round-cost", type=float, default=1.0)
    ap.add_argument("--md", type=Path, default=None, help="write the markdown table here (else print it)")
    args = ap.parse_args()
    missing = [p for p in [*args.results, args.costs] if not Path(p).is_file()]
    if missing:
        print(f"error: no such file: {missing[0]}", file=sys.stderr)
        return 2
    if args.plain_round_cost <= 0:
        print("error: --plain-round-cost must be > 0", file=sys.stderr)
        return 2
    try:
        rows = project(read_rows(Path(p) for p in args.results), round_costs(args.costs), args.plain_round_cost)
    except KeyError as e:
        print(f"error: {e.args[0]} in {args.costs}", file=sys.stderr)
        return 2
    except (json.JSONDecodeError, TypeError) as e:
        print(f"error: not a result file: {e}", file=sys.stderr)
        return 2
    text = markdown(summarize(rows)).replace("speedup (decode)", "projected speedup")
    if args.md:
        args.md.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
