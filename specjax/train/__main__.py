"""`python -m specjax.train +experiment=NAME [key=value …]` — Hydra composes, specjax.train.cli runs.

Hydra's compose API (not `@hydra.main`) is used so that a bad option ends with ONE `error:` line
and exit code 2, like every other specjax command, instead of Hydra's multi-line report.
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


def _one_line(exc: BaseException) -> str:
    """Hydra / OmegaConf messages span lines (key, object type, hints): keep the informative ones."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:  # the cause holds the reason ("Key 'x' is not in struct")
        seen.add(id(exc))
        text = str(exc).split("Config search path")[0]
        for ln in (ln.strip() for ln in text.splitlines()):
            if ln and not ln.startswith(("object_type", "full_key", "To append", "Set the environment")):
                parts.append(ln)
        exc = exc.__cause__
    return " ".join(dict.fromkeys(parts)) or "invalid configuration"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not (CONFIG_DIR / "train.yaml").is_file():
        print(f"error: {CONFIG_DIR}/train.yaml not found; install specjax from its source tree (pip install -e .)",
              file=sys.stderr)
        return 2
    if any(a in ("-h", "--help", "help") for a in args):
        names = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
        print(HELP.format(experiments="".join(f"  +experiment={n}\n" for n in names)))
        return 0
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from specjax.train.cli import command_schema, run

    # The structured schema type-checks the YAML files and every key=value override.
    ConfigStore.instance().store(name="train_schema", node=command_schema())
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=args)
        raw = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    return run(raw)


if __name__ == "__main__":
    from specjax.compile_cache import enable_compile_cache

    # At the process's edge, not in main(): tests call main() in a process whose other programs keep their clock.
    enable_compile_cache()  # $SPECJAX_COMPILE_CACHE: 0 turns it off, a folder moves it; default <cache>/xla
    sys.exit(main())
