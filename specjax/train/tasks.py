"""Task builders: `build_task` dispatches on the task kind; the draft-model (distillation) task lives here.

The `Task` type and the helpers every loss shares are in `task.py`; Medusa / EAGLE tasks in `head_tasks.py`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.reductions import argmax
from specjax.models.sharding import model_units
from specjax.train import head_tasks, losses
from specjax.train.chunks import logits_nv, scan_row_chunks
from specjax.train.config import LossConfig, TaskConfig
from specjax.train.models import Target, build_draft
from specjax.train.task import Task, accuracy_sums, next_tokens, positions_like


def build_distill_task(task: TaskConfig, loss: LossConfig, target: Target, *, seed: int, abstract: bool) -> Task:
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
        agree = (argmax(ls_nv) == argmax(lt_nv)).astype(jnp.float32)
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
        tables = (student.head_table(), jax.lax.stop_gradient(teacher.head_table()))
        rows = (hs_btd.reshape(-1, hs_btd.shape[-1]), ht_btd.reshape(-1, ht_btd.shape[-1]),
                next_tokens(tokens_bt).reshape(-1), mask_bt.reshape(-1).astype(jnp.float32))
        sums = scan_row_chunks(chunk_fn, tables, rows, loss.logit_chunk)
        return sums.pop("loss"), sums

    meta = {"kind": "draft", "model_config": dataclasses.asdict(draft.cfg), "target": target.identity,
            "freeze_embed": task.freeze_embed}
    export = lambda params, frozen: nnx.state(nnx.merge(graphdef, params, frozen["draft_rest"]))
    return Task("draft", graphdef, params, {"draft_rest": rest, "target": t_state}, loss_fn, meta,
                model_units(draft.cfg), export)


def build_task(task: TaskConfig, loss: LossConfig, target: Target, *, seed: int = 0, abstract: bool = False,
               vocab_ids=None, cached_features: bool = False) -> Task:
    """The Task of `task.kind`.

    Args:
      vocab_ids: the reduced draft vocabulary of Medusa / EAGLE heads (target ids, sorted) or None.
      cached_features: head tasks read the target's features from `batch["features"]` (`features.py`)
        instead of running the target every step; ignored for kind="draft".
    """
    if task.kind == "draft":
        return build_distill_task(task, loss, target, seed=seed, abstract=abstract)
    build = head_tasks.build_medusa_task if task.kind == "medusa" else head_tasks.build_eagle_task
    return build(task, loss, target, seed=seed, abstract=abstract, cached=cached_features, vocab_ids=vocab_ids)


def task_module(task: Task, params, frozen):
    """The trained module (Transformer, MedusaHeads or EagleHead) holding `params` (what a drafter runs)."""
    rest = (frozen["draft_rest"],) if task.kind == "draft" else ()
    return nnx.merge(task.graphdef, params, *rest)
