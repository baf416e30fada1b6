"""Orbax checkpoints of a run: the latest N for resuming, and the best one by dev loss.

Layout under the run's out_dir::

    ckpt/<step>/state   the TrainState (step, params, optimizer state, RNG) as nested dicts
    ckpt/<step>/meta    JSON: data position, task meta (module kind and config), metrics, run config
    best/<step>/...     the same, for the checkpoint with the lowest dev loss so far

Pytrees are stored as nested dicts keyed by their path names (``params/blocks/0/attn/q/w``), so a
checkpoint can be read back into any pytree with the same paths: the trainer restores the full
TrainState with its shardings, `load_draft_checkpoint` only the parameters. Saves are
asynchronous; orbax commits a step directory atomically, so a process killed mid-save leaves
the previous checkpoint as the latest complete one.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from specjax.models.draft_artifacts import from_nested, to_nested


def _manager(directory: Path, keep: int, best: bool) -> ocp.CheckpointManager:
    # Orbax names a multi-process save's commit barrier after the step ("async_write_complete.<step>"): the
    # latest and the best manager saving the same step at once would share it ("Barrier ... is already
    # ongoing", then every process hangs until the barrier's timeout). A prefix per manager keeps them apart.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=True,
        best_fn=(lambda m: m["dev_loss"]) if best else None, best_mode="min",
        multiprocessing_options=ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=directory.name))
    return ocp.CheckpointManager(directory.absolute(), options=options, item_names=("state", "meta"))


class Checkpointer:
    """Saves and restores a run's TrainState with its data position and metadata."""

    def __init__(self, out_dir: str | Path, keep: int):
        self.root = Path(out_dir)
        self.last = _manager(self.root / "ckpt", keep, best=False)
        self.best = _manager(self.root / "best", 1, best=True)
        self.best_loss = float("inf")

    def latest_step(self) -> int | None:
        return self.last.latest_step()

    def save(self, state, meta: dict, dev_loss: float | None = None, module_params=None, final: bool = False) -> None:
        """Saves (asynchronously) as the latest checkpoint, and the module as the best when dev_loss improves.

        Args:
          state: the TrainState.
          meta: JSON metadata (data position, task description, config).
          dev_loss: dev loss of this state, if it was evaluated.
          module_params: the trained module's complete parameters (what `load_draft_checkpoint` reads);
            needed for a best checkpoint.
          final: the run's last save: also written as "best" when no best exists yet (no dev
            evaluation), so every finished run leaves a loadable module.
        """
        step = int(jax.device_get(state.step))
        args = ocp.args.Composite(state=ocp.args.StandardSave(to_nested(state)), meta=ocp.args.JsonSave(meta))
        self.last.save(step, args=args, force=True)
        improved = dev_loss is not None and dev_loss < self.best_loss
        if module_params is not None and (improved or (final and self.best.latest_step() is None)):
            self.best_loss = dev_loss if improved else self.best_loss
            loss = float("inf") if dev_loss is None else dev_loss
            args = ocp.args.Composite(state=ocp.args.StandardSave(to_nested({"params": module_params})),
                                      meta=ocp.args.JsonSave({**meta, "dev_loss": loss, "step": step}))
            self.best.save(step, args=args, metrics={"dev_loss": loss}, force=True)

    def restore(self, abstract_state, step: int | None = None):
        """(state, meta) of `step` (default latest); `abstract_state` carries shapes and shardings."""
        step = self.last.latest_step() if step is None else step
        nested = to_nested(abstract_state)
        out = self.last.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(nested), meta=ocp.args.JsonRestore()))
        meta = out["meta"]
        if "best_loss" in meta:
            self.best_loss = float(meta["best_loss"])
        return from_nested(abstract_state, out["state"]), meta

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are committed."""
        self.last.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self.last.close()
        self.best.close()
