"""The target-feature cache of head tasks: same loss and gradients as running the target, resumable caching."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.train.features import feature_root, split_features
from specjax.train.step import make_eval_step
from specjax.train.trainer import prepare, uses_feature_cache


def _loss_and_grads(task, rows, compute_dtype=None):
    batch = {k: jnp.asarray(v[:8]) for k, v in rows.arrays().items()}
    eval_fn = make_eval_step(task.loss_fn, compute_dtype)
    # Jitted: run eagerly, each op of the forward and its gradient compiles on its own.
    sums, grads = jax.jit(jax.value_and_grad(lambda p, f, b: eval_fn(p, f, b)["loss"]))(task.params, task.frozen, batch)
    return float(sums), grads


@pytest.mark.parametrize("kind", ["eagle", "medusa", "eagle3"])
def test_cached_features_give_the_uncached_loss_and_gradients(tiny_train_config, kind):
    cfg = tiny_train_config(kind.rstrip("3"))
    if kind == "eagle3":  # fused target layers: stored after f_t, one more d_model each
        cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, eagle_layers=(0, 1)))
    width = 32 * (3 if kind == "eagle3" else 1)
    assert uses_feature_cache(cfg)
    _, rows_c, dev_c, task_c = prepare(cfg)
    _, rows_u, _, task_u = prepare(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, feature_cache=False)))
    assert rows_u.features is None and rows_c.features.shape == (*rows_c.tokens.shape, width)
    assert dev_c.features.shape == (*dev_c.tokens.shape, width)
    assert "target" in task_u.frozen and "target" not in task_c.frozen  # a cached step never runs the target
    loss_c, g_c = _loss_and_grads(task_c, rows_c)
    loss_u, g_u = _loss_and_grads(task_u, rows_u)
    # The features come from a separate jit of the same forward: equal up to float32 reassociation.
    assert loss_c == pytest.approx(loss_u, rel=1e-5)
    for a, b in zip(jax.tree.leaves(g_c), jax.tree.leaves(g_u), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)  # entries are O(1)


@pytest.mark.slow
def test_cached_features_under_bfloat16_match_the_bfloat16_target(tiny_train_config):
    cfg = tiny_train_config("eagle", compute_dtype="bfloat16")
    _, rows_c, _, task_c = prepare(cfg)
    _, rows_u, _, task_u = prepare(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, feature_cache=False)))
    loss_c, _ = _loss_and_grads(task_c, rows_c, jnp.bfloat16)
    loss_u, _ = _loss_and_grads(task_u, rows_u, jnp.bfloat16)
    assert loss_c == pytest.approx(loss_u, rel=1e-2)  # bf16 compute: a few ulps of bf16 at most


def test_feature_cache_is_keyed_and_an_interrupted_computation_resumes(tiny_train_config, tmp_path):
    cfg = tiny_train_config("eagle")
    target, rows, _, _ = prepare(cfg)
    root = feature_root(cfg.data.feature_dir)
    (key,) = [p for p in root.iterdir() if p.is_dir()]
    full = np.array(np.load(key / "train.npy"))
    # Another seq_len packs other rows: another key, the first cache untouched.
    prepare(dataclasses.replace(cfg, seq_len=16))
    assert len([p for p in root.iterdir() if p.is_dir()]) == 2
    # Simulate a kill after 24 rows: a partial file with garbage past them and the finished-row count.
    folder = tmp_path / "resume"
    folder.mkdir()
    part = np.lib.format.open_memmap(folder / "train.npy.partial", mode="w+", dtype=np.float32, shape=full.shape)
    part[:24] = full[:24]
    part[24:] = np.nan
    part.flush()
    del part
    (folder / "train.done").write_text("24")
    resumed = split_features(target.model, rows, folder, "train", 8, "float32", progress=False)
    np.testing.assert_allclose(np.asarray(resumed), full, rtol=1e-6, atol=1e-6)
    assert not (folder / "train.done").exists() and (folder / "train.npy").is_file()
