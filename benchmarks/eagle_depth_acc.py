"""Teacher-forced acceptance by draft depth of trained EAGLE heads, on their runs' dev rows.

For each run directory: the run's own config (from the checkpoint's metadata) with `loss.eagle_ttt_steps`
set to --depth, the saved head's weights (the best checkpoint), and one pass over the whole dev split
(cached data and target features are reused). Depth j+1's accuracy is the head's top-1 for x_{r+j+2} from
its own features of the j steps before, fed the data's tokens (`specjax/train/eagle_ttt.py`): what the
drafter's depth j+1 sees when its first j drafts were right. An EAGLE head trained without training-time
test is measured the same way, so runs with and without it compare on the same rows. Depth 1 is the
trainer's dev `acc`. Rows are normalised by depth 1's label count (a few tokens per document differ).

    python benchmarks/eagle_depth_acc.py RUN_DIR [RUN_DIR ...] [--depth 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def depth_accuracies(run_dir: str, depth: int) -> tuple[int, list[float]]:
    """(checkpoint step, [acc at depth 1 … depth]) of the EAGLE head saved in `run_dir`."""
    from specjax.models import load_draft_checkpoint
    from specjax.train.config import from_dict
    from specjax.train.step import make_eval_step
    from specjax.train.trainer import evaluate, make_run_mesh, prepare_run

    ckpt = load_draft_checkpoint(run_dir)
    if ckpt.kind != "eagle":
        fail(f"{run_dir}: a {ckpt.kind!r} run; only EAGLE heads are measured here")
    cfg = from_dict(ckpt.meta["config"])
    cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, eagle_ttt_steps=depth), eval_batches=0,
                              progress=False)
    prep = prepare_run(cfg)
    eval_fn = make_eval_step(prep.task.loss_fn, None)
    out = evaluate(eval_fn, ckpt.params, prep.task.frozen, prep.dev_rows, cfg, make_run_mesh(cfg))
    return ckpt.step, [out["acc"]] + [out[f"d{j}_acc"] for j in range(2, depth + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="training run directories (out_dir of an EAGLE run)")
    ap.add_argument("--depth", type=int, default=4)
    args = ap.parse_args()
    if not 1 <= args.depth <= 16:
        fail("--depth must be in [1, 16]")
    missing = [r for r in args.runs if not (Path(r) / "best").is_dir()]
    if missing:
        fail(f"no saved best checkpoint under {', '.join(missing)}")
    print("| run | step | " + " | ".join(f"depth {j}" for j in range(1, args.depth + 1)) + " |")
    print("|---" * (args.depth + 2) + "|")
    for run in args.runs:
        step, accs = depth_accuracies(run, args.depth)
        print(f"| {run} | {step} | " + " | ".join(f"{a:.3f}" for a in accs) + " |", flush=True)


if __name__ == "__main__":
    main()
