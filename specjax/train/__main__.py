"""`python -m specjax.train +experiment=NAME [key=value …]` — Hydra composes, specjax.train.cli runs.

Hydra's compose API (not `@hydra.main`) is used so that a bad option ends with ONE `error:` line
and exit code 2, like every other specjax command, instead of Hydra's multi-line report
(`specjax.cli_errors`); Ctrl-C ends with one line and exit code 130 (checkpoints stay resumable).
"""

from __future__ import annotations

import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"

HELP = """specjax.train: train draft models, Medusa heads and EAGLE heads for speculative decoding.
Usage: python -m specjax.train +experiment=NAME [key=value ...] [check=true]

Experiments (configs/experiment/*.yaml; each file's header gives command, runtime and metric):
{experiments}
Options: every field of configs/train.yaml, e.g. steps=200 batch_size=8 optim.lr=1e-3
  task.kind=draft|medusa|eagle  data.source=self_distill|text|jsonl|synthetic  out_dir=runs/x
  check=true runs the abstract check (shapes, shardings, one traced step) instead of training.
"""


def main(argv: list[str] | None = None) -> int:
    from specjax.cli_errors import config_missing, run_command

    args = sys.argv[1:] if argv is None else argv
    if config_missing(CONFIG_DIR / "train.yaml"):
        return 2
    if any(a in ("-h", "--help", "help") for a in args):
        names = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
        print(HELP.format(experiments="".join(f"  +experiment={n}\n" for n in names)))
        return 0
    from omegaconf import OmegaConf

    from specjax.cli_errors import compose_options
    from specjax.train.cli import command_schema, run

    def body() -> int:
        # The structured schema type-checks the YAML files and every key=value override.
        cfg = compose_options(CONFIG_DIR, "train", args, command_schema(), "train_schema", "specjax.train")
        return run(OmegaConf.to_container(cfg, resolve=True))

    return run_command(body)


if __name__ == "__main__":
    from specjax.compile_cache import enable_compile_cache

    # At the process's edge, not in main(): tests call main() in a process whose other programs keep their clock.
    enable_compile_cache()  # $SPECJAX_COMPILE_CACHE: 0 turns it off, a folder moves it; default <cache>/xla
    sys.exit(main())
