"""The optimizer and the jitted train / eval steps over (graphdef, state) splits.

A task supplies `loss_fn(params, frozen, batch, rng) -> (loss_sum, sums)`: sums over the loss
tokens of a micro-batch (``sums["tokens"]`` counts them). The train step accumulates gradients of
those sums over `accum` micro-batches with `lax.scan` and divides by the token count once, so a
step weighs every token equally however the batch is split (micro-batches, data-parallel shards).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from specjax.train.config import OptimConfig

LossFn = Callable[[Any, Any, dict, jax.Array], tuple[jax.Array, dict]]


@struct.dataclass
class TrainState:
    """Everything that changes during training (and is checkpointed).

    Attributes:
      step: optimizer steps taken (int32 scalar).
      params: trainable parameters (an nnx.State).
      opt_state: the optax state.
      rng: raw uint32 key data (jax.random.key_data), split once per step.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def make_optimizer(cfg: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, Callable]:
    """AdamW with linear warmup then cosine decay to lr·min_lr_ratio, after global-norm clipping.

    Weight decay skips vectors (norm scales, biases): decaying them only hurts.

    Returns:
      (transformation, learning-rate schedule).
    """
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
        decay_steps=max(total_steps, cfg.warmup_steps + 1), end_value=cfg.lr * cfg.min_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask),
    )
    return tx, schedule


def init_state(params, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """Step 0: the given parameters, a fresh optimizer state and the run's key."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(jax.random.key(seed)))


def cast_floats(tree, dtype):
    """Casts floating leaves to `dtype` (the bf16 compute copy; master weights stay float32)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, schedule: Callable, compute_dtype=None):
    """Builds `step(state, frozen, batch) -> (state, metrics)` (not jitted; the trainer jits it).

    `batch` holds arrays shaped [accum, micro_batch, ...]. When the loss or the gradient norm is
    not finite the returned state is the input state unchanged and metrics["finite"] is False,
    so the caller can stop with the last good parameters.
    """

    def grads_of(params, frozen, mb, rng):
        def f(p):
            if compute_dtype is not None:
                p, fz = cast_floats(p, compute_dtype), cast_floats(frozen, compute_dtype)
            else:
                fz = frozen
            return loss_fn(p, fz, mb, rng)

        return jax.value_and_grad(f, has_aux=True)(params)

    def step(state: TrainState, frozen, batch: dict):
        key = jax.random.wrap_key_data(state.rng)
        key, sub = jax.random.split(key)
        accum = jax.tree.leaves(batch)[0].shape[0]
        first = jax.tree.map(lambda x: x[0], batch)
        (_, sums0), _ = jax.eval_shape(grads_of, state.params, frozen, first, sub)
        zeros = (jax.tree.map(jnp.zeros_like, state.params),
                 jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums0), jnp.zeros((), jnp.float32))

        def micro(carry, xs):
            g_acc, m_acc, l_acc = carry
            mb, i = xs
            (loss, sums), g = grads_of(state.params, frozen, mb, jax.random.fold_in(sub, i))
            return (_add(g_acc, g), _add(m_acc, sums), l_acc + loss), None

        (g, sums, loss_sum), _ = jax.lax.scan(micro, zeros, (batch, jnp.arange(accum)))
        n = jnp.maximum(sums["tokens"], 1.0)
        g = jax.tree.map(lambda x: (x / n).astype(x.dtype), g)
        grad_norm = optax.tree.norm(g)
        updates, opt_state = tx.update(g, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        loss = loss_sum / n
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new = TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=jax.random.key_data(key))
        new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, state)
        metrics = {k: v / n for k, v in sums.items() if k != "tokens"}
        metrics.update(loss=loss, grad_norm=grad_norm, lr=schedule(state.step), tokens=sums["tokens"],
                       finite=finite)
        return new, metrics

    return step


def make_eval_step(loss_fn: LossFn, compute_dtype=None):
    """Builds `eval(params, frozen, batch) -> sums` for one [batch, ...] dev batch (sums, not means)."""

    def evaluate(params, frozen, batch):
        if compute_dtype is not None:
            params, frozen = cast_floats(params, compute_dtype), cast_floats(frozen, compute_dtype)
        loss, sums = loss_fn(params, frozen, batch, jax.random.key(0))
        return {**sums, "loss": loss}

    return evaluate
