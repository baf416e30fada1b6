"""Builds a Transformer from a flat name → array mapping (what every loader produces).

Names follow the module tree, e.g. ``blocks.3.attn.q.w`` (stored [in, out]),
``blocks.3.attn_norm.scale``, ``embed`` ([vocab, d_model]), ``final_norm.scale``, ``head``.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.quant import device_array
from specjax.models.transformer import Transformer


class WeightsError(ValueError):
    """Checkpoint tensors that do not fit the model configuration."""


def abstract_transformer(cfg: ModelConfig, dtype=jnp.float32) -> Transformer:
    """The model's structure with abstract parameters (shapes and dtypes, no allocation), for loaders to fill.

    Built without an rng: drawing 400 keys under `nnx.eval_shape` cost ~0.8 s of Qwen's start (twice)."""
    return nnx.eval_shape(lambda: Transformer(cfg, dtype=dtype, rngs=None))


def param_shapes(cfg: ModelConfig, dtype=jnp.float32) -> dict[str, tuple[int, ...]]:
    """Expected parameter names and shapes, computed abstractly (no allocation)."""
    abstract = abstract_transformer(cfg, dtype)
    flat = nnx.to_flat_state(nnx.state(abstract))
    return {".".join(map(str, p)): tuple(v.get_value().shape) for p, v in flat}


def build_model(
    cfg: ModelConfig, weights: Mapping[str, np.ndarray], dtype=jnp.float32, source: str = "checkpoint"
) -> Transformer:
    """Creates the model with exactly the given weights, checking names and shapes.

    Raises:
      WeightsError: a tensor is missing, unexpected or of the wrong shape (all listed).
    """
    expected = param_shapes(cfg, dtype)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    wrong = sorted(
        f"{k}: {tuple(weights[k].shape)} != {expected[k]}"
        for k in set(expected) & set(weights)
        if tuple(weights[k].shape) != expected[k]
    )
    if missing or extra or wrong:
        parts = [f"missing {missing[:8]}" if missing else "", f"unexpected {extra[:8]}" if extra else "",
                 f"wrong shapes {wrong[:8]}" if wrong else ""]
        raise WeightsError(f"{source} does not match the model: " + "; ".join(p for p in parts if p))
    graphdef, state = nnx.split(abstract_transformer(cfg, dtype))
    flat = nnx.to_flat_state(state)
    for path, var in flat:
        var.set_value(device_array(weights[".".join(map(str, path))], dtype))  # a cached file's pages, in place
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def model_weights(model: Transformer) -> dict[str, np.ndarray]:
    """The inverse of build_model: host copies of every parameter by name."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {".".join(map(str, p)): np.asarray(jax.device_get(v.get_value())) for p, v in flat}
