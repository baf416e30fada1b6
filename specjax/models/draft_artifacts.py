"""The trained-draft artifact format: what `python -m specjax.train` leaves on disk and decoders load.

Train writes it (`train/checkpoint.py` saves pytrees with `to_nested`, `train/trainer.py` the metadata)
and decode reads it (`decode/spec/drafters/registry.py`), so it lives below both: models <- train, decode.

A finished run leaves ``<run_dir>/best/<step>/`` holding the trained module's complete parameters
(``state/params/...``) and a JSON ``meta`` that says what the module is:

* ``kind == "draft"``: a `Transformer`; ``meta.task.model_config`` is its ModelConfig.
* ``kind == "medusa"``: `MedusaHeads`; ``meta.task.medusa_config`` is its MedusaConfig, and
  ``meta.task.vocab_ids`` the reduced draft vocabulary (target ids) or null.
* ``kind == "eagle"``: `EagleHead`; ``meta.task.eagle_config`` is its EagleConfig, and
  ``meta.task.vocab_ids`` the reduced draft vocabulary (target ids) or null.

``meta.task.target`` is the identity of the target it was trained against (``gguf-sha256:…``):
heads are only meaningful on that target, and `check_target` refuses another one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.loading import config_from_json
from specjax.models.sharding import path_name


def to_nested(tree) -> dict:
    """Nested dict {path part: ... leaf} of a pytree's leaves (nnx's trailing `.value` dropped)."""
    out: dict = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = path_name(path).split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = leaf
    return out


def from_nested(template, nested: dict):
    """The inverse of `to_nested`: `template`'s structure filled with the arrays of `nested`."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)

    def lookup(path):
        node = nested
        for p in path_name(path).split("."):
            node = node[p]
        return node

    return jax.tree_util.tree_unflatten(treedef, [lookup(p) for p, _ in paths])


class DraftCheckpointError(ValueError):
    """A path that holds no loadable draft checkpoint (the message says what is missing)."""


@dataclasses.dataclass
class DraftCheckpoint:
    """A trained draft module ready for a drafter.

    Attributes:
      kind: "draft", "medusa" or "eagle".
      module: the module with its trained weights (Transformer, MedusaHeads or EagleHead).
      params: its parameters (`nnx.state(module)`), for passing to jitted code as an argument.
      config: the module's config (ModelConfig, MedusaConfig or EagleConfig).
      target: identity of the target it was trained for ("gguf-sha256:<hex>" or "random:…").
      vocab_ids: the heads' reduced draft vocabulary (Medusa, EAGLE) (sorted target ids), or None.
      step: training step of the checkpoint.
      meta: the checkpoint's whole metadata (run config, dev metrics).
    """

    kind: str
    module: Any
    params: Any
    config: Any
    target: str
    vocab_ids: np.ndarray | None
    step: int
    meta: dict


def _module_factory(task_meta: dict):
    kind = task_meta["kind"]
    if kind == "draft":
        from specjax.models.transformer import Transformer

        cfg = config_from_json(json.dumps(task_meta["model_config"]))
        return cfg, lambda: Transformer(cfg, rngs=nnx.Rngs(0))
    if kind == "medusa":
        from specjax.models.medusa import MedusaConfig, MedusaHeads

        cfg = MedusaConfig(**task_meta["medusa_config"])
        return cfg, lambda: MedusaHeads(cfg)
    if kind == "eagle":
        from specjax.models.eagle import EagleConfig, EagleHead

        raw = task_meta["eagle_config"]
        layer: ModelConfig = config_from_json(json.dumps(raw["layer"]))
        cfg = EagleConfig(layer=layer, vocab_size=raw["vocab_size"], embed_multiplier=raw["embed_multiplier"],
                          fuse_layers=tuple(raw.get("fuse_layers", ())))
        return cfg, lambda: EagleHead(cfg, rngs=nnx.Rngs(0))
    raise DraftCheckpointError(f"unknown draft kind {kind!r} in checkpoint metadata")


def _step_dir(path: Path, step: int | None) -> Path:
    """`path` itself when it is a step directory, else the step (default: latest) under path/best."""
    if (path / "meta").is_dir() and (path / "state").is_dir():
        return path
    best = path / "best"
    if not best.is_dir():
        raise DraftCheckpointError(f"{path}: no trained draft here (expected {best}/<step>/ from specjax.train)")
    steps = sorted(int(p.name) for p in best.iterdir() if p.name.isdigit())
    if not steps:
        raise DraftCheckpointError(f"{best}: holds no finished checkpoint")
    if step is not None and step not in steps:
        raise DraftCheckpointError(f"{best}: no checkpoint for step {step} (have {steps})")
    return best / str(step if step is not None else steps[-1])


def load_draft_checkpoint(path: str | Path, step: int | None = None, dtype=jnp.float32) -> DraftCheckpoint:
    """Loads the best (or given) checkpoint of a training run.

    Args:
      path: a run directory (``out_dir`` of the run) or one ``best/<step>`` directory.
      step: a specific step under ``best/`` (default: the best one, the only one kept).
      dtype: parameter dtype of the returned module.

    Raises:
      DraftCheckpointError: no checkpoint, or unreadable metadata.
    """
    step_dir = _step_dir(Path(path).expanduser(), step)
    try:
        meta = json.loads((step_dir / "meta" / "metadata").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DraftCheckpointError(f"{step_dir}: unreadable checkpoint metadata ({e})") from None
    config, make = _module_factory(meta["task"])
    graphdef, abstract = nnx.split(nnx.eval_shape(make))
    restored = ocp.StandardCheckpointer().restore(
        (step_dir / "state").absolute(), to_nested({"params": abstract}))
    params = from_nested({"params": abstract}, restored)["params"]
    params = jax_cast(params, dtype)
    module = nnx.merge(graphdef, params)
    vocab = meta["task"].get("vocab_ids")
    return DraftCheckpoint(meta["task"]["kind"], module, params, config, meta["task"]["target"],
                           None if vocab is None else np.asarray(vocab, np.int32), int(step_dir.name), meta)


def jax_cast(tree, dtype):
    """Floating leaves of `tree` as `dtype` (checkpoints are stored float32)."""
    return jax.tree.map(lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def check_target(ckpt: DraftCheckpoint, target_identity: str) -> None:
    """Refuses heads trained for another target (Medusa / EAGLE read that target's features)."""
    if ckpt.kind != "draft" and ckpt.target != target_identity:
        raise DraftCheckpointError(
            f"this {ckpt.kind} checkpoint was trained for target {ckpt.target}, not {target_identity}")
