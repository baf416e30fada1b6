"""What is trained and its loss: a `Task` bundles the trainable split, the frozen arrays and the loss.

Batches are dicts of `tokens` [B, T] int32 and `mask` [B, T] float32, where mask[b, t] = 1 says
that token t+1 is a training target (a generated continuation token, not prompt or padding).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.sharding import model_units
from specjax.train import losses
from specjax.train.chunks import logits_nv, scan_row_chunks
from specjax.train.config import LossConfig, TaskConfig
from specjax.train.models import Target, build_draft
from specjax.train.step import LossFn


@dataclasses.dataclass
class Task:
    """A trainable module split for jit, plus everything its loss reads.

    Attributes:
      kind: "draft", "medusa" or "eagle".
      graphdef: static half of the trainable module.
      params: trainable parameters (nnx.State).
      frozen: pytree of arrays the loss reads but never updates (target, frozen draft parts).
      loss_fn: (params, frozen, batch, key) -> (loss sum, dict of sums incl. "tokens").
      meta: JSON-ready description stored with checkpoints (what `load_draft_checkpoint` rebuilds).
      units: head counts for the sharding rules (`sharding.model_units`).
      export: (params, frozen) -> the module's complete nnx.State (what a decoder loads).
    """

    kind: str
    graphdef: Any
    params: Any
    frozen: Any
    loss_fn: LossFn
    meta: dict
    units: dict
    export: Any = None


def positions_like(tokens_bt: jax.Array) -> jax.Array:
    """Packed rows restart positions at 0 in every row."""
    return jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)


def next_tokens(tokens_bt: jax.Array) -> jax.Array:
    """labels[b, t] = tokens[b, t+1] (0 past the row; the mask is 0 there)."""
    return jnp.concatenate([tokens_bt[:, 1:], jnp.zeros_like(tokens_bt[:, :1])], axis=1)


def head_table(model) -> jax.Array:
    """The [V, D] output table of a Transformer (its tied embedding or separate head)."""
    return model.embed[...] if model.head is None else model.head[...]


def accuracy_sums(logits_nv_: jax.Array, labels_n: jax.Array, mask_n: jax.Array, k: int, prefix: str = "") -> dict:
    """Sums of top-1 and top-k hits over masked rows."""
    top1 = (jnp.argmax(logits_nv_, axis=-1) == labels_n).astype(jnp.float32)
    topk = losses.rank_below_n(logits_nv_, labels_n, k)
    return {f"{prefix}acc": jnp.sum(top1 * mask_n), f"{prefix}top{k}": jnp.sum(topk * mask_n)}


def build_distill_task(task: TaskConfig, loss: LossConfig, target: Target, seed: int, abstract: bool) -> Task:
    """Distills the target into a small draft Transformer (KD at a temperature + hard-label CE)."""
    draft = build_draft(task, target.model, seed, abstract)
    trainable = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("embed"))) if task.freeze_embed else nnx.Param
    graphdef, params, rest = nnx.split(draft, trainable, ...)
    t_graphdef, t_state = nnx.split(target.model)
    s_cap, t_cap = draft.cfg.final_logit_softcap, target.model.cfg.final_logit_softcap

    def chunk_fn(tables, hs_nd, ht_nd, labels_n, mask_n):
        ls_nv = logits_nv(hs_nd, tables[0], s_cap)
        lt_nv = logits_nv(ht_nd, tables[1], t_cap)
        loss_n, kl_n, ce_n = losses.kd_n(ls_nv, lt_nv, labels_n, loss.kd_temperature, loss.kd_weight)
        agree = (jnp.argmax(ls_nv, -1) == jnp.argmax(lt_nv, -1)).astype(jnp.float32)
        return {"loss": jnp.sum(loss_n * mask_n), "kl": jnp.sum(kl_n * mask_n), "ce": jnp.sum(ce_n * mask_n),
                "agree": jnp.sum(agree * mask_n), "tokens": jnp.sum(mask_n),
                **accuracy_sums(ls_nv, labels_n, mask_n, loss.top_k)}

    def loss_fn(params, frozen, batch, key):
        del key
        student = nnx.merge(graphdef, params, frozen["draft_rest"])
        teacher = nnx.merge(t_graphdef, frozen["target"])
        tokens_bt, mask_bt = batch["tokens"], batch["mask"]
        pos_bt = positions_like(tokens_bt)
        hs_btd, _ = student(tokens_bt, pos_bt)
        ht_btd = jax.lax.stop_gradient(teacher(tokens_bt, pos_bt)[0])
        tables = (head_table(student), jax.lax.stop_gradient(head_table(teacher)))
        rows = (hs_btd.reshape(-1, hs_btd.shape[-1]), ht_btd.reshape(-1, ht_btd.shape[-1]),
                next_tokens(tokens_bt).reshape(-1), mask_bt.reshape(-1).astype(jnp.float32))
        sums = scan_row_chunks(chunk_fn, tables, rows, loss.logit_chunk)
        return sums.pop("loss"), sums

    meta = {"kind": "draft", "model_config": dataclasses.asdict(draft.cfg), "target": target.identity,
            "freeze_embed": task.freeze_embed}
    export = lambda params, frozen: nnx.state(nnx.merge(graphdef, params, frozen["draft_rest"]))
    return Task("draft", graphdef, params, {"draft_rest": rest, "target": t_state}, loss_fn, meta,
                model_units(draft.cfg), export)


def build_task(task: TaskConfig, loss: LossConfig, target: Target, seed: int = 0, abstract: bool = False,
               vocab_ids=None, cached_features: bool = False) -> Task:
    """The Task of `task.kind`.

    Args:
      vocab_ids: the reduced draft vocabulary of Medusa / EAGLE heads (target ids, sorted) or None.
      cached_features: head tasks read the target's features from `batch["features"]` (`features.py`)
        instead of running the target every step; ignored for kind="draft".
    """
    if task.kind == "draft":
        return build_distill_task(task, loss, target, seed, abstract)
    from specjax.train import head_tasks  # needs the Medusa / EAGLE modules

    if task.kind == "medusa":
        return head_tasks.build_medusa_task(task, loss, target, seed, abstract, cached_features, vocab_ids)
    return head_tasks.build_eagle_task(task, loss, target, seed, abstract, vocab_ids, cached_features)


def task_module(task: Task, params, frozen):
    """The trained module (Transformer, MedusaHeads or EagleHead) holding `params` (what a drafter runs)."""
    rest = (frozen["draft_rest"],) if task.kind == "draft" else ()
    return nnx.merge(task.graphdef, params, *rest)
