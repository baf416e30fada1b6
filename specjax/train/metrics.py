"""Run metrics: console progress bar, metrics.jsonl, and TensorBoard events (tensorboardX)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm


class MetricsLog:
    """Appends one JSON object per logged step to `<out_dir>/metrics.jsonl` and mirrors it to TensorBoard.

    Args:
      out_dir: run directory.
      total_steps: length of the progress bar.
      start_step: where a resumed run starts (the bar and the files continue from there).
      progress: show a tqdm bar on stderr.
      tensorboard: also write `<out_dir>/tb` events; needs tensorboardX (pip install tensorboardX).
      writer: whether this process writes at all; in a multi-process job only process 0 does (the
        others compute the same values), so files and console are not repeated per host.
    """

    def __init__(self, out_dir: str | Path, total_steps: int, start_step: int = 0, progress: bool = True,
                 tensorboard: bool = True, writer: bool = True):
        self.dir = Path(out_dir)
        self.writer = writer
        self.jsonl = None
        if writer:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.jsonl = open(self.dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in close()
        self.bar = tqdm(total=total_steps, initial=start_step, disable=not (progress and writer), file=sys.stderr,
                        dynamic_ncols=True, desc="train")
        self.tb = None
        if tensorboard and writer:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                self.message("tensorboardX is not installed: TensorBoard events are off (pip install tensorboardX)")
            else:
                self.tb = SummaryWriter(str(self.dir / "tb"))

    def rewind(self, step: int) -> None:
        """Drops logged rows after `step` (a resumed run redoes those steps) and moves the bar there."""
        self.bar.update(step - self.bar.n)
        if not self.writer:
            return
        self.jsonl.close()
        path = self.dir / "metrics.jsonl"
        kept = [line for line in path.read_text().split("\n") if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in kept))
        self.jsonl = open(path, "a")  # noqa: SIM115 - closed in close()

    def message(self, text: str) -> None:
        """A console line that does not break the progress bar."""
        if self.writer:
            tqdm.write(text, file=sys.stderr)

    def advance(self) -> None:
        self.bar.update(1)

    def log(self, step: int, split: str, values: dict[str, float]) -> None:
        """Records `values` for `step` under `split` ("train" or "dev")."""
        if not self.writer:
            return
        row = {"step": step, "split": split, **{k: float(v) for k, v in values.items()}}
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(f"{split}/{k}", float(v), step)
        if split == "train":
            self.bar.set_postfix({k: f"{values[k]:.3g}" for k in ("loss", "acc", "tok_s") if k in values})
        else:
            self.message(f"step {step} {split}: " + " ".join(f"{k}={v:.4g}" for k, v in values.items()))

    def close(self) -> None:
        self.bar.close()
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
