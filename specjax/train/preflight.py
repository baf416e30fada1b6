"""Checks of a training run that need no model: done before anything loads or any directory is created.

A missing corpus or prompts file used to surface after the target loaded (and left an empty run
directory behind); resuming an out_dir written by a run of another kind used to end in orbax's
140-line restore traceback. Both are `TrainConfigError`s here, one line each.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax.train.config import TrainConfig, TrainConfigError, to_dict


def check_data_files(cfg: TrainConfig) -> None:
    """Raises TrainConfigError when a data file the run reads does not exist."""
    d = cfg.data
    if d.source in ("text", "jsonl") and d.path is not None and not Path(d.path).expanduser().is_file():
        raise TrainConfigError(f"data.path={d.path!r}: no such file")
    if d.source == "self_distill":
        for p in d.prompts:
            if not Path(p).expanduser().is_file():
                raise TrainConfigError(f"data.prompts: no such file {p!r}")


def latest_checkpoint_meta(out_dir: str | Path) -> tuple[int, dict] | None:
    """(step, metadata) of the newest saved checkpoint under `out_dir`/ckpt, or None when there is none."""
    ckpt = Path(out_dir) / "ckpt"
    steps = sorted((int(p.name), p) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else []
    for step, path in reversed(steps):
        meta = path / "meta" / "metadata"
        if (path / "commit_success.txt").is_file() or meta.is_file():
            try:
                return step, json.loads(meta.read_text())
            except (OSError, ValueError) as e:
                raise TrainConfigError(f"out_dir={str(out_dir)!r}: checkpoint {step} has unreadable metadata ({e}); "
                                       "set another out_dir= or resume=false") from None
    return None


# The task fields that shape what a checkpoint holds (parameters and optimizer state), by task kind;
# the others (init_layers, init_embed) only choose how a fresh run starts.
SHAPING_FIELDS = {"draft": ("target", "target_arch", "draft_arch", "freeze_embed"),
                  "medusa": ("target", "target_arch", "medusa_heads", "draft_vocab"),
                  "eagle": ("target", "target_arch", "draft_vocab", "eagle_layers")}


def check_resume(cfg: TrainConfig) -> None:
    """Raises TrainConfigError when resuming would restore a checkpoint of another task into this run."""
    out = Path(cfg.out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise TrainConfigError(f"out_dir={cfg.out_dir!r}: exists and is not a directory")
    found = latest_checkpoint_meta(out) if cfg.resume else None
    if found is None:
        return
    step, meta = found
    saved = (meta.get("config") or {}).get("task") or {}
    ours = json.loads(json.dumps(to_dict(cfg)["task"]))  # tuples → lists, as the metadata holds them
    how = "set another out_dir= or resume=false to start afresh"
    if saved.get("kind") != ours["kind"]:
        raise TrainConfigError(f"out_dir={cfg.out_dir!r} holds a {saved.get('kind')!r} run (checkpoint at step "
                               f"{step}); this run is task.kind={ours['kind']!r}: {how}")
    differ = [f"task.{k}" for k in SHAPING_FIELDS.get(ours["kind"], ours) if k in saved and saved[k] != ours[k]]
    if differ:
        raise TrainConfigError(f"out_dir={cfg.out_dir!r} holds a run (checkpoint at step {step}) whose "
                               f"task settings differ from this run's ({', '.join(differ)}): {how}")


def preflight(cfg: TrainConfig) -> None:
    """All checks of this module (data files, then the run directory)."""
    check_data_files(cfg)
    check_resume(cfg)
