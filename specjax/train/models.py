"""Building the target (teacher / frozen backbone) and the trainable draft modules.

With `abstract=True` every module is created under `nnx.eval_shape`: shapes and dtypes only, no
allocation, so a 12B target and a 1B draft can be checked on a laptop.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.transformer import Transformer
from specjax.train.config import TaskConfig, TrainConfigError
from specjax.train.presets import model_config


@dataclasses.dataclass
class Target:
    """The frozen model every task reads.

    Attributes:
      model: the Transformer (abstract when built with abstract=True).
      identity: what the data cache and checkpoints key on: "gguf-sha256:<hex>" for a file,
        "random:<preset>:<seed>" for a randomly initialised target.
      tokenizer: its tokenizer, or None for a random target.
    """

    model: Transformer
    identity: str
    tokenizer: object | None


def build_target(task: TaskConfig, seed: int = 0, abstract: bool = False) -> Target:
    """Loads the target named by `task.target`, or builds a random one of shape `task.target_arch`."""
    if task.target is None:
        cfg = model_config(task.target_arch)
        make = lambda: Transformer(cfg, rngs=nnx.Rngs(seed))
        model = nnx.eval_shape(make) if abstract else make()
        return Target(model, f"random:{task.target_arch.preset}:{cfg.n_layers}x{cfg.d_model}:{seed}", None)
    if abstract:
        raise TrainConfigError("an abstract check needs task.target=null (a real target is loaded, not traced)")
    from specjax.models.loading import DEFAULT_MODEL, default_model_path, file_sha256, load_model

    model, tokenizer = load_model(task.target)
    path = default_model_path() if task.target in ("", DEFAULT_MODEL) else Path(task.target).expanduser()
    # The int8 head copy only serves one-row decoding; training reads the float table.
    model.head_quant = None
    identity = f"gguf-sha256:{file_sha256(path)}" if path.is_file() else f"dir:{path.resolve()}"
    return Target(model, identity, tokenizer)


def draft_model_config(task: TaskConfig, target_cfg: ModelConfig) -> ModelConfig:
    """The draft's shape: its arch preset with the target's vocabulary and special tokens."""
    cfg = model_config(task.draft_arch)
    if cfg.vocab_size != target_cfg.vocab_size:
        raise TrainConfigError(
            f"task.draft_arch vocab_size {cfg.vocab_size} != target vocab_size {target_cfg.vocab_size}: a draft "
            "must share the target's tokenizer")
    return cfg.replace(bos_id=target_cfg.bos_id, eos_ids=target_cfg.eos_ids, pad_id=target_cfg.pad_id,
                       max_seq_len=target_cfg.max_seq_len)


def build_draft(task: TaskConfig, target: Transformer, seed: int = 0, abstract: bool = False) -> Transformer:
    """A draft Transformer, optionally starting from the target's embedding and some of its layers.

    Raises:
      TrainConfigError: init_layers / init_embed asked for with shapes that differ from the target's.
    """
    cfg = draft_model_config(task, target.cfg)
    make = lambda: Transformer(cfg, rngs=nnx.Rngs(seed + 1))
    draft = nnx.eval_shape(make) if abstract else make()
    t = target.cfg
    same_width = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim) == (
        t.d_model, t.n_heads, t.n_kv_heads, t.head_dim, t.ffn_dim)
    if task.init_layers:
        if not same_width:
            raise TrainConfigError("task.init_layers needs the draft's layer widths to equal the target's")
        if len(task.init_layers) != cfg.n_layers or max(task.init_layers) >= t.n_layers:
            raise TrainConfigError(
                f"task.init_layers={list(task.init_layers)} must name {cfg.n_layers} target layers (< {t.n_layers})")
        if not abstract:
            for i, j in enumerate(task.init_layers):
                nnx.update(draft.blocks[i], jax.tree.map(jnp.copy, nnx.state(target.blocks[j])))
    if task.init_embed:
        if cfg.d_model != t.d_model:
            raise TrainConfigError(f"task.init_embed needs draft d_model {cfg.d_model} == target {t.d_model}")
        if not abstract:
            draft.embed.set_value(jnp.array(target.embed[...]))
            draft.final_norm.scale.set_value(jnp.array(target.final_norm.scale[...]))
    return draft
