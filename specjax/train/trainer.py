"""The training loop: data → sharded jitted steps → metrics, dev evaluation and checkpoints."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from specjax.distributed import is_primary
from specjax.models import sharding
from specjax.models.eagle import EagleConfig
from specjax.train.checkpoint import Checkpointer
from specjax.train.config import TrainConfig, TrainConfigError, to_dict
from specjax.train.data import BatchOrder, PackedRows, dev_batches, pack
from specjax.train.distill_data import load_documents
from specjax.train.features import attach_features
from specjax.train.metrics import MetricsLog
from specjax.train.models import Target, build_target
from specjax.train.step import TrainState, init_state, make_eval_step, make_optimizer, make_train_step
from specjax.train.task import Task
from specjax.train.tasks import build_task
from specjax.train.tau import DevTau, prompt_ids


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN/Inf; the run stopped with its last good checkpoint kept."""


@dataclasses.dataclass
class RunResult:
    """What `train` returns: final state, its dev metrics, and the run directory."""

    state: TrainState
    task: Task
    dev: dict[str, float]
    out_dir: Path
    history: list[dict]


def make_run_mesh(cfg: TrainConfig):
    """The ('data', 'model') mesh of the run (data=-1: all devices not taken by 'model')."""
    n = len(jax.devices())
    data = cfg.mesh.data if cfg.mesh.data > 0 else max(1, n // cfg.mesh.model)
    return sharding.make_mesh(data=data, model=cfg.mesh.model)


def check_batch_fits(cfg: TrainConfig, mesh) -> None:
    """Raises TrainConfigError unless a micro-batch's rows split evenly over the mesh's 'data' axis."""
    micro, data = cfg.batch_size // cfg.optim.accum_steps, mesh.shape[sharding.DATA]
    if micro % data:
        raise TrainConfigError(
            f"batch_size={cfg.batch_size} / optim.accum_steps={cfg.optim.accum_steps} = {micro} rows per micro-batch "
            f"do not split over mesh data={data} devices; choose a multiple of {data} or set mesh.data")


def state_shardings(task: Task, state: TrainState, mesh) -> tuple[TrainState, object]:
    """(TrainState of shardings, frozen shardings): FSDP + data parallel by the project's rule table."""
    repl = sharding.replicated(mesh)
    shard = lambda tree: sharding.param_shardings(tree, mesh, fsdp=True, units=task.units)
    state_sh = TrainState(step=repl, params=shard(state.params), opt_state=shard(state.opt_state), rng=repl)
    return state_sh, shard(task.frozen)


def step_batch_sharding(mesh) -> NamedSharding:
    """[accum, micro_batch, T] batches: micro-batch rows split over 'data'."""
    return NamedSharding(mesh, PartitionSpec(None, sharding.DATA))


def compile_run(cfg: TrainConfig, task: Task, mesh):
    """Initial placed state and frozen arrays, the state shardings, the jitted train and eval steps."""
    tx, schedule = make_optimizer(cfg.optim, cfg.steps)
    state = init_state(task.params, tx, cfg.seed)
    state_sh, frozen_sh = state_shardings(task, state, mesh)
    # A copy: the step donates its state, which must not delete the task's initial parameters.
    state = sharding.shard_state(state, state_sh, may_alias=False)
    frozen = sharding.shard_state(task.frozen, frozen_sh)
    dtype = jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else None
    step_fn = jax.jit(make_train_step(task.loss_fn, tx, schedule, dtype),
                      in_shardings=(state_sh, frozen_sh, step_batch_sharding(mesh)),
                      out_shardings=(state_sh, None), donate_argnums=0)
    eval_fn = jax.jit(make_eval_step(task.loss_fn, dtype))
    return state, frozen, state_sh, step_fn, eval_fn


@dataclasses.dataclass
class Prepared:
    """What a run trains on: the target, packed rows (with cached features for head tasks), the Task and
    the dev prompts' token ids (for the periodic τ evaluation)."""

    target: Target
    train_rows: PackedRows
    dev_rows: PackedRows
    task: Task
    dev_prompts: list[list[int]]


def uses_feature_cache(cfg: TrainConfig) -> bool:
    """Head tasks train from cached target features unless data.feature_cache is off."""
    return cfg.data.feature_cache and cfg.task.kind in ("medusa", "eagle")


def feature_taps(cfg: TrainConfig) -> tuple[int, ...]:
    """Target blocks whose outputs the task reads besides f_t (an EAGLE-3 head's fused layers)."""
    return tuple(cfg.task.eagle_layers) if cfg.task.kind == "eagle" else ()


def prepare(cfg: TrainConfig, target: Target | None = None, tokenizer=None, log=lambda s: None):
    """(target, train rows, dev rows, task) of a run (no device state yet); see `prepare_run`."""
    p = prepare_run(cfg, target, tokenizer, log)
    return p.target, p.train_rows, p.dev_rows, p.task


def prepare_run(cfg: TrainConfig, target: Target | None = None, tokenizer=None, log=lambda s: None) -> Prepared:
    """Target, packed train / dev rows (with their cached target features for head tasks), Task, dev prompts."""
    target = target or build_target(cfg.task, cfg.seed)
    if feature_taps(cfg):  # layers the target lacks: refused now, not after generating the data
        EagleConfig.from_target(target.model.cfg, feature_taps(cfg))
    train_docs, dev_docs = load_documents(cfg.data, target, cfg.progress, log, tokenizer)
    pad = target.model.cfg.pad_id
    train_rows, dev_rows = pack(train_docs, cfg.seq_len, pad), pack(dev_docs, cfg.seq_len, pad)
    cached = uses_feature_cache(cfg)
    if cached:
        train_rows, dev_rows = attach_features(
            target.model, target.identity, train_rows, dev_rows, cfg.data.feature_dir,
            cfg.batch_size // cfg.optim.accum_steps, cfg.compute_dtype, cfg.progress, log, feature_taps(cfg))
    vocab_ids = None
    if cfg.task.kind in ("medusa", "eagle") and cfg.task.draft_vocab:
        from specjax.models.draft_vocab import DraftVocab

        vocab = DraftVocab.from_token_ids([d.ids_n for d in train_docs], target.model.cfg.vocab_size,
                                          cfg.task.draft_vocab, always=target.model.cfg.eos_ids)
        vocab_ids = vocab.ids_n
    task = build_task(cfg.task, cfg.loss, target, seed=cfg.seed, vocab_ids=vocab_ids, cached_features=cached)
    return Prepared(target, train_rows, dev_rows, task, prompt_ids(dev_docs, cfg.tau_prompts))


def evaluate(eval_fn, params, frozen, rows: PackedRows, cfg: TrainConfig, mesh) -> dict[str, float]:
    """Token-weighted dev metrics over the dev split (or its first eval_batches batches)."""
    micro = cfg.batch_size // cfg.optim.accum_steps
    total: dict[str, float] = {}
    sh = NamedSharding(mesh, PartitionSpec(sharding.DATA))
    for b in dev_batches(rows, micro, cfg.eval_batches):
        sums = sharding.to_host(eval_fn(params, frozen, sharding.shard_state(b, sh)))
        for k, v in sums.items():
            total[k] = total.get(k, 0.0) + float(v)
    n = max(total.pop("tokens", 0.0), 1.0)
    return {k: v / n for k, v in total.items()}


def train(cfg: TrainConfig, *, target: Target | None = None, tokenizer=None,
          on_step: Callable[[int, TrainState], None] | None = None) -> RunResult:
    """Runs (or resumes) training as configured.

    Args:
      cfg: the run.
      target: an already built target (tests); default: built from cfg.task.
      tokenizer: tokenizer for text / jsonl corpora when the target has none.
      on_step: called after every optimizer step with (step, state) — hooks for tests and tools.

    Raises:
      TrainingDiverged: NaN/Inf loss or gradient; the last good checkpoint stays the latest.
      TrainConfigError: options that do not fit the data or the devices.
    """
    t_start = time.perf_counter()
    out = Path(cfg.out_dir)
    mesh = make_run_mesh(cfg)
    log = MetricsLog(out, cfg.steps, 0, cfg.progress, cfg.tensorboard, writer=is_primary())
    prep = prepare_run(cfg, target, tokenizer, log.message)
    train_rows, dev_rows, task = prep.train_rows, prep.dev_rows, prep.task
    dev_tau = DevTau(cfg, prep.target.model, task, prep.dev_prompts) if cfg.tau_every and prep.dev_prompts else None
    check_batch_fits(cfg, mesh)
    log.message(f"{task.kind}: {n_params(task.params) / 1e6:.2f}M trainable parameters; "
                f"{train_rows.n_rows} train rows ({train_rows.target_tokens} target tokens), "
                f"{dev_rows.n_rows} dev rows; mesh {dict(mesh.shape)}")
    state, frozen, state_sh, step_fn, eval_fn = compile_run(cfg, task, mesh)
    ckpt = Checkpointer(out, cfg.keep)
    data_pos = 0
    if cfg.resume and ckpt.latest_step() is not None:
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, state_sh)
        state, meta = ckpt.restore(abstract)
        data_pos = int(meta["data_pos"])
        log.message(f"resumed from {out / 'ckpt'} at step {int(state.step)} (data position {data_pos})")
    start = int(sharding.to_host(state.step))
    log.rewind(start)
    batch_sh = step_batch_sharding(mesh)
    order = BatchOrder(train_rows, cfg.batch_size, cfg.optim.accum_steps, cfg.seed)
    meta = lambda pos, dev: {"data_pos": pos, "task": task.meta, "config": to_dict(cfg), "best_loss": ckpt.best_loss,
                             **({"dev": dev} if dev else {})}
    history, dev, dev_step = [], {}, -1
    try:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            state, m = step_fn(state, frozen, sharding.shard_state(order.batch(data_pos), batch_sh))
            data_pos += 1
            m = sharding.to_host(m)
            now = time.perf_counter()
            if not bool(m["finite"]):
                ckpt.wait()
                raise TrainingDiverged(
                    f"step {step + 1}: loss {float(m['loss'])} / gradient norm {float(m['grad_norm'])} is not finite; "
                    f"stopped. Last good checkpoint: step {ckpt.latest_step()} in {out / 'ckpt'}")
            row = {k: float(v) for k, v in m.items() if k != "finite"}
            # wall_s: since this process entered train() (data, features, compiles and dev evaluations included).
            row.update(step_s=now - t0, tok_s=cfg.batch_size * cfg.seq_len / (now - t0), wall_s=now - t_start)
            done = step + 1
            log.advance()
            if done % cfg.log_every == 0 or done == cfg.steps:
                log.log(done, "train", row)
                history.append({"step": done, **row})
            if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
                dev, dev_step = evaluate(eval_fn, state.params, frozen, dev_rows, cfg, mesh), done
                log.log(done, "dev", dev)
                history.append({"step": done, **{f"dev_{k}": v for k, v in dev.items()}})
            if dev_tau is not None and (done % cfg.tau_every == 0 or done == cfg.steps):
                tau = dev_tau(state.params, frozen)
                log.log(done, "tau", tau)
                history.append({"step": done, **tau})
            if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.steps:
                dev_loss = dev["loss"] if dev_step == done else None
                ckpt.save(state, meta(data_pos, dev), dev_loss, task.export(state.params, frozen), done == cfg.steps)
            if on_step is not None:
                on_step(done, state)
    finally:
        ckpt.close()
        log.close()
    return RunResult(state, task, dev, out, history)


def n_params(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))
