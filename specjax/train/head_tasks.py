"""Tasks that train heads on a frozen target: Medusa-1 heads and the EAGLE head.

Both read the target's final-normed hidden states f_t (what `Transformer.__call__` returns, the
feature the head modules are defined on) under `stop_gradient`: the backbone is frozen and only
the heads' parameters are trainable. Logits go through the target's frozen tied head (for EAGLE
optionally restricted to a reduced draft vocabulary).

With `cached=True` the features come with the batch (`batch["features"]`, computed once by
`features.py`) and the frozen arrays are only the target's embedding / head tables: a step runs the
heads and their losses, not the target.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.draft_vocab import DraftVocab
from specjax.models.eagle import EagleConfig, EagleHead
from specjax.models.medusa import MedusaConfig, MedusaHeads
from specjax.models.reductions import argmax
from specjax.models.sharding import model_units
from specjax.train import eagle_ttt, losses
from specjax.train.chunks import logits_nv, scan_row_chunks
from specjax.train.config import LossConfig, TaskConfig
from specjax.train.features import target_features
from specjax.train.models import Target
from specjax.train.task import Task, accuracy_sums


def _make(factory, abstract: bool):
    return nnx.eval_shape(factory) if abstract else factory()


def _frozen(model, cached: bool) -> dict:
    """What the loss reads of the target: the whole model, or (cached) only its embedding and head tables."""
    if not cached:
        return {"target": nnx.split(model)[1]}
    return {"embed": model.embed[...], **({} if model.head is None else {"head": model.head[...]})}


def _features(t_graphdef, frozen, batch, taps: tuple[int, ...] = ()):
    """(f_btd, embed_vd, head table_vd, tapped layers [B, T, n·D] or None) under stop_gradient, from the
    target or from the batch's cache (`features.py` stores the taps after f_t)."""
    if "target" in frozen:
        target = nnx.merge(t_graphdef, frozen["target"])
        full = target_features(target, batch["tokens"], taps)
        embed_vd, table_vd = target.embed[...], target.head_table()
    else:
        # In the tables' dtype: under bf16 compute the uncached target would have produced bf16 features.
        embed_vd = frozen["embed"]
        full, table_vd = batch["features"].astype(embed_vd.dtype), frozen.get("head", embed_vd)
    d = embed_vd.shape[-1]
    f_btd, taps_btx = full[..., :d], (full[..., d:] if taps else None)
    return tuple(None if x is None else jax.lax.stop_gradient(x) for x in (f_btd, embed_vd, table_vd, taps_btx))


def build_medusa_task(task: TaskConfig, loss: LossConfig, target: Target, *, seed: int, abstract: bool,
                      cached: bool = False, vocab_ids: np.ndarray | None = None) -> Task:
    """Medusa-1: per-head CE on shifted targets (head k predicts token t+k+1), weights decay^(k-1).

    Args:
      cached: read the target's features from `batch["features"]` instead of running the target.
      vocab_ids: a reduced draft vocabulary (sorted target ids) the heads draft over, or None (all
        262k ids: four full-vocabulary head products per token then dominate a step). Labels outside
        it add no loss and count as misses.
    """
    tcfg = target.model.cfg
    mcfg = MedusaConfig.from_target(tcfg, n_heads=task.medusa_heads)
    graphdef, params = nnx.split(_make(lambda: MedusaHeads(mcfg, rngs=nnx.Rngs(seed)), abstract))
    t_graphdef = nnx.graphdef(target.model)
    n_heads, cap = mcfg.n_heads, tcfg.final_logit_softcap
    weights_h = losses.medusa_weights(n_heads, loss.medusa_decay)
    frozen = {**_frozen(target.model, cached), **_vocab_arrays(vocab_ids, tcfg.vocab_size)}

    def chunk_fn(table_vd, h_nhd, labels_nh, valid_nh, in_vocab_nh):
        n, _, d = h_nhd.shape
        logits = logits_nv(h_nhd.reshape(n * n_heads, d), table_vd, cap)
        ce_nh = losses.cross_entropy_n(logits, labels_nh.reshape(-1)).reshape(n, n_heads)
        hit_nh = (argmax(logits).reshape(n, n_heads) == labels_nh).astype(jnp.float32)
        scored_nh = valid_nh * in_vocab_nh  # an out-of-vocabulary label can never be drafted
        out = {"loss": jnp.sum(ce_nh * scored_nh * weights_h), "tokens": jnp.sum(valid_nh[:, 0])}
        out.update(accuracy_sums(logits.reshape(n, n_heads, -1)[:, 0], labels_nh[:, 0], scored_nh[:, 0], loss.top_k))
        for k in range(n_heads):
            out[f"ce_head{k + 1}"] = jnp.sum(ce_nh[:, k] * scored_nh[:, k])
            out[f"acc_head{k + 1}"] = jnp.sum(hit_nh[:, k] * scored_nh[:, k])
        return out

    def loss_fn(params, frozen, batch, key):
        del key
        f_btd, _, table, _ = _features(t_graphdef, frozen, batch)
        heads = nnx.merge(graphdef, params)
        h_bthd = heads(f_btd)
        labels_kbt, valid_kbt = losses.medusa_targets(batch["tokens"], batch["mask"], n_heads)
        table, labels_kbt, in_vocab_kbt = _restrict(frozen, table, labels_kbt)
        d = h_bthd.shape[-1]
        rows = (h_bthd.reshape(-1, n_heads, d), labels_kbt.reshape(n_heads, -1).T,
                valid_kbt.reshape(n_heads, -1).T, in_vocab_kbt.reshape(n_heads, -1).T)
        sums = scan_row_chunks(chunk_fn, table, rows, max(2, loss.logit_chunk // n_heads))
        return sums.pop("loss"), sums

    meta = {"kind": "medusa", "medusa_config": dataclasses.asdict(mcfg), "target": target.identity,
            "vocab_ids": None if vocab_ids is None else [int(i) for i in vocab_ids]}
    return Task("medusa", graphdef, params, frozen, loss_fn, meta, {}, lambda p, f: p)


def _vocab_arrays(vocab_ids, vocab_size: int) -> dict:
    """Frozen arrays of a reduced draft vocabulary: its ids and the target-id -> draft-index map (-1: out)."""
    if vocab_ids is None:
        return {}
    vocab = DraftVocab(np.asarray(vocab_ids), vocab_size)
    return {"vocab_ids": jnp.asarray(vocab.ids_n), "vocab_index": jnp.asarray(vocab.index_of())}


def _restrict(frozen, table_vd, labels):
    """(head table, labels as draft indices, in-vocabulary mask) over the reduced vocabulary, if any."""
    if "vocab_ids" not in frozen:
        return table_vd, labels, jnp.ones(labels.shape, jnp.float32)
    idx = jnp.take(frozen["vocab_index"], labels, axis=0)
    return jnp.take(table_vd, frozen["vocab_ids"], axis=0), jnp.maximum(idx, 0), (idx >= 0).astype(jnp.float32)


def _eagle_chunk(loss: LossConfig, cap, weight: float, prefix: str):
    """Chunk body of one unrolled step's EAGLE loss (weighted by `weight`; metrics named with `prefix`)."""

    def chunk_fn(table_nd, pred_nd, feat_nd, labels_n, reg_mask_n, label_n, in_vocab_n):
        logits = logits_nv(pred_nd, table_nd, cap)
        _, reg_n, ce_n = losses.eagle_n(pred_nd, feat_nd, logits, labels_n, in_vocab_n, 1.0, 1.0)
        reg, ce = jnp.sum(reg_n * reg_mask_n), jnp.sum(ce_n)
        out = {"loss": weight * (loss.eagle_feature_weight * reg + loss.eagle_ce_weight * ce),
               f"{prefix}reg": reg, f"{prefix}ce": ce}
        # Accuracy counts out-of-vocabulary labels as misses: such a token can never be drafted.
        out.update(accuracy_sums(logits, labels_n, label_n * in_vocab_n, loss.top_k, prefix))
        if not prefix:
            out.update(tokens=jnp.sum(label_n), in_vocab=jnp.sum(in_vocab_n))
        return out

    return chunk_fn


def build_eagle_task(task: TaskConfig, loss: LossConfig, target: Target, *, seed: int, abstract: bool,
                     cached: bool = False, vocab_ids: np.ndarray | None = None) -> Task:
    """EAGLE: from (f_t, x_{t+1}) predict f_{t+1} (smooth-L1) and x_{t+2} through the frozen head (CE).

    With `loss.eagle_ttt_steps` = n > 1 the head is also trained on its own predicted features for
    n - 1 further steps (training-time test, `eagle_ttt.py`); step j's loss weighs
    `loss.eagle_ttt_decay ** j` and its metrics are named `d{j+1}_acc`, `d{j+1}_ce`, … (the
    teacher-forced acceptance of draft depth j + 1 when the earlier depths were right; normalised,
    like every metric, by depth 1's label count, which differs by a few tokens per document).

    With `task.eagle_layers` the head is an EAGLE-3 head: at committed positions (step 0) it reads the
    fusion of those target blocks' outputs (`EagleHead.fuse_features`), not f_t; the regression target
    stays f_{t+1} (EAGLE-3 drops that term: `loss.eagle_feature_weight=0`).

    cached: read the target's features from `batch["features"]` instead of running the target.
    """
    tcfg = target.model.cfg
    ecfg = EagleConfig.from_target(tcfg, tuple(task.eagle_layers))
    graphdef, params = nnx.split(_make(lambda: EagleHead(ecfg, rngs=nnx.Rngs(seed)), abstract))
    t_graphdef = nnx.graphdef(target.model)
    frozen = {**_frozen(target.model, cached), **_vocab_arrays(vocab_ids, tcfg.vocab_size)}
    n_steps = loss.eagle_ttt_steps
    chunks = [_eagle_chunk(loss, tcfg.final_logit_softcap, loss.eagle_ttt_decay ** j, f"d{j + 1}_" if j else "")
              for j in range(n_steps)]

    def loss_fn(params, frozen, batch, key):
        del key
        tokens_bt, mask_bt = batch["tokens"], batch["mask"]
        f_btd, embed_vd, table_vd, taps_btx = _features(t_graphdef, frozen, batch, ecfg.fuse_layers)
        head = nnx.merge(graphdef, params)
        preds = eagle_ttt.unrolled(head, head.committed_features(f_btd, taps_btx), tokens_bt, embed_vd, n_steps)
        total = {}
        for j, pred_bld in enumerate(preds):
            tg = eagle_ttt.step_targets(tokens_bt, mask_bt, f_btd, j)
            table, labels_bl, in_vocab_bl = _restrict(frozen, table_vd, tg["labels"])
            d = pred_bld.shape[-1]
            rows = (pred_bld.reshape(-1, d), tg["feat"].reshape(-1, d), labels_bl.reshape(-1),
                    tg["reg_mask"].reshape(-1), tg["label"].reshape(-1), (in_vocab_bl * tg["label"]).reshape(-1))
            sums = scan_row_chunks(chunks[j], table, rows, loss.logit_chunk)
            total.update({k: total.get(k, 0.0) + v for k, v in sums.items()})
        return total.pop("loss"), total

    meta = {"kind": "eagle", "eagle_config": {"layer": dataclasses.asdict(ecfg.layer), "vocab_size": ecfg.vocab_size,
                                              "embed_multiplier": ecfg.embed_multiplier,
                                              "fuse_layers": list(ecfg.fuse_layers)},
            "target": target.identity, "vocab_ids": None if vocab_ids is None else [int(i) for i in vocab_ids]}
    return Task("eagle", graphdef, params, frozen, loss_fn, meta, model_units(ecfg.layer), lambda p, f: p)
