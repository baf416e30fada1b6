"""Abstract check of a run: shapes, shardings and one traced train step, with no parameter allocated.

This is how `distill_1b` (a 1B draft of a 12B target) is checked on a CPU: the target and draft
are built under `nnx.eval_shape`, the optimizer state under `jax.eval_shape`, and the jitted step
is traced and lowered with every input carrying its NamedSharding on the run's mesh (8 forced
CPU devices in the tests), which verifies that the rule table splits every array evenly.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.train.config import TrainConfig
from specjax.train.models import build_target
from specjax.train.step import init_state, make_optimizer, make_train_step
from specjax.train.tasks import build_task
from specjax.train.trainer import check_batch_fits, make_run_mesh, state_shardings, step_batch_sharding


@dataclasses.dataclass(frozen=True)
class AbstractReport:
    """What the check found (sizes in parameters and bytes; per-device bytes after sharding)."""

    kind: str
    mesh: dict
    trainable_params: int
    frozen_params: int
    state_bytes_per_device: int
    frozen_bytes_per_device: int
    metrics: tuple[str, ...]

    def line(self) -> str:
        gib = 2.0**30
        return (f"{self.kind}: {self.trainable_params / 1e6:.1f}M trainable, {self.frozen_params / 1e6:.1f}M frozen "
                f"parameters on mesh {self.mesh}; per device: train state {self.state_bytes_per_device / gib:.2f} GiB, "
                f"frozen {self.frozen_bytes_per_device / gib:.2f} GiB; step outputs {list(self.metrics)}")


def _count(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def _bytes_per_device(tree, shardings) -> int:
    sizes = jax.tree.map(lambda x, s: int(np.prod(s.shard_shape(x.shape))) * jnp.dtype(x.dtype).itemsize,
                         tree, shardings)
    return int(sum(jax.tree.leaves(sizes)))


def abstract_check(cfg: TrainConfig, lower: bool = True) -> AbstractReport:
    """Builds the run abstractly (target shape: task.target_arch) and traces one sharded train step.

    Args:
      cfg: the run; task.target is ignored (a random target of shape task.target_arch stands in).
      lower: also lower the jitted step to StableHLO with its shardings (catches layout errors
        that shape evaluation alone does not).

    Raises:
      ShardingError / TrainConfigError: a split that does not divide, or an inconsistent option.
    """
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, target=None))
    mesh = make_run_mesh(cfg)
    check_batch_fits(cfg, mesh)
    target = build_target(cfg.task, cfg.seed, abstract=True)
    vocab_ids = np.arange(cfg.task.draft_vocab, dtype=np.int32) if cfg.task.draft_vocab else None
    task = build_task(cfg.task, cfg.loss, target, seed=cfg.seed, abstract=True, vocab_ids=vocab_ids)
    tx, schedule = make_optimizer(cfg.optim, cfg.steps)
    state = jax.eval_shape(lambda p: init_state(p, tx, cfg.seed), task.params)
    state_sh, frozen_sh = state_shardings(task, state, mesh)
    micro = cfg.batch_size // cfg.optim.accum_steps
    batch_sh = step_batch_sharding(mesh)
    shape = (cfg.optim.accum_steps, micro, cfg.seq_len)
    batch = {"tokens": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sh),
             "mask": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch_sh)}
    with_sh = lambda tree, sh: jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh)
    args = (with_sh(state, state_sh), with_sh(task.frozen, frozen_sh), batch)
    dtype = jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else None
    step = jax.jit(make_train_step(task.loss_fn, tx, schedule, dtype),
                   in_shardings=(state_sh, frozen_sh, batch_sh), out_shardings=(state_sh, None))
    new_state, metrics = step.eval_shape(*args)
    if jax.tree.structure(new_state) != jax.tree.structure(state):
        raise AssertionError("the train step changed the structure of the train state")
    if lower:
        step.lower(*args)
    return AbstractReport(task.kind, dict(mesh.shape), _count(state.params), _count(task.frozen),
                          _bytes_per_device(state, state_sh), _bytes_per_device(task.frozen, frozen_sh),
                          tuple(sorted(metrics)))

