"""Spec-Bench-style table and plot from the result files of experiments/specbench/run.py.

    python experiments/specbench/report.py experiments/specbench/results/*.jsonl \
        --md experiments/specbench/results/table.md --png experiments/specbench/results/speedup.png

The table has one section per (target, temperature, batch): per category and over the whole set,
each setup's speedup over plain decoding (decode phase only in parentheses), τ and the share of plain
rounds, and at the end the worst whole-set speedup of any setting. The plot shows the speedup per
category per method, one panel per setting (matplotlib, from the `bench` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from spec_harness import markdown, read_rows, summarize  # noqa: E402


def plot(summary: dict, path: Path) -> None:
    """One panel per setting: grouped bars, speedup per category per setup, a line at 1×."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(summary)
    fig, axes = plt.subplots(len(settings), 1, figsize=(12, 3.2 * len(settings)), squeeze=False)
    for ax, key in zip(axes[:, 0], settings, strict=True):
        cats = summary[key]
        setups = list(dict.fromkeys(s for cells in cats.values() for s in cells))
        width = 0.8 / max(len(setups), 1)
        for j, s in enumerate(setups):
            xs = [i + j * width for i in range(len(cats))]
            ax.bar(xs, [cats[c].get(s, {}).get("speedup", 0.0) for c in cats], width, label=s)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))], list(cats), rotation=30, ha="right")
        ax.set_ylabel("speedup vs plain")
        target, temp, batch = key
        ax.set_title(f"{target}, T={temp:g}, batch {batch}")
        ax.legend(fontsize=7, ncol=len(setups))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="JSONL files written by run.py")
    ap.add_argument("--md", default=None, help="write the markdown table here (else print it)")
    ap.add_argument("--png", default=None, help="write the plot here")
    args = ap.parse_args()
    missing = [p for p in args.results if not Path(p).is_file()]
    if missing:
        print(f"error: no such result file: {missing[0]}", file=sys.stderr)
        return 2
    summary = summarize(read_rows(Path(p) for p in args.results))
    if not summary:
        print("error: the result files hold no rows", file=sys.stderr)
        return 2
    text = markdown(summary)
    if args.md:
        Path(args.md).write_text(text)
    else:
        print(text)
    if args.png:
        try:
            plot(summary, Path(args.png))
        except ImportError:
            print("error: the plot needs matplotlib: pip install -e '.[bench]'", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
