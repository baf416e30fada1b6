"""Medusa heads (Cai et al. 2024): extra next-next-… token predictors on the target's last hidden state.

Head i (0-based) reads the target feature f_t — the final-normed hidden state that
`Transformer.__call__` returns at position t, whose own logits predict token t+1 — and predicts
token t+2+i. Each head is `n_layers` residual SiLU blocks, h ← h + SiLU(W h + b), and its output
feature goes through the target's frozen (tied) output head, or a `HeadTable` over a reduced
draft vocabulary.

Why no per-head LM head: the Medusa paper gives every head its own [V, D] output matrix
(initialised from the base head). At Gemma 3's 262,144 × 640 that is 168M parameters per head —
four heads would be 2.5× the whole 270M target, and each head's product would cost as much as the
target's own head. Sharing the frozen head keeps a head at D² + D = 410k parameters per block;
the residual block learns to move the feature to where the shared head reads the later token.

W and b start at zero, so an untrained head is the identity and predicts exactly what the base
head predicts at t (token t+1) — a "shifted" guess that is still a sensible draft for repetitive
text, and the starting point Medusa-1 training moves away from.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.config import ConfigError, ModelConfig


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
    """Shape of a set of Medusa heads.

    Attributes:
      d_model: width of the target's hidden state.
      n_heads: number of heads (head i predicts token t+2+i).
      n_layers: residual blocks per head.
    """

    d_model: int
    n_heads: int = 4
    n_layers: int = 1

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"MedusaConfig.{name} must be a positive integer, got {value!r}")

    @classmethod
    def from_target(cls, target: ModelConfig, n_heads: int = 4, n_layers: int = 1) -> MedusaConfig:
        """Heads sized for a target model."""
        return cls(d_model=target.d_model, n_heads=n_heads, n_layers=n_layers)


class MedusaHeads(nnx.Module):
    """All heads at once: weights stacked [H, L, D, D] so the heads run as one batched product."""

    def __init__(self, cfg: MedusaConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        # Zero init (see the module docstring): rngs is accepted for the NNX constructor convention
        # and for callers that want random heads (`randomize`).
        del rngs
        h, n, d = cfg.n_heads, cfg.n_layers, cfg.d_model
        self.cfg = cfg
        self.w = nnx.Param(jnp.zeros((h, n, d, d), dtype))
        self.b = nnx.Param(jnp.zeros((h, n, d), dtype))

    def __call__(self, feat_xd: jax.Array) -> jax.Array:
        """Head features [..., H, D] of target features [..., D] (apply a head table for logits)."""
        if feat_xd.shape[-1] != self.cfg.d_model:
            raise ConfigError(f"Medusa heads expect features of width {self.cfg.d_model}, got {feat_xd.shape[-1]}")
        h_xhd = jnp.broadcast_to(feat_xd[..., None, :], (*feat_xd.shape[:-1], self.cfg.n_heads, self.cfg.d_model))
        w, b = self.w[...], self.b[...]
        for layer in range(self.cfg.n_layers):
            pre_xhd = jnp.einsum("...hd,hde->...he", h_xhd, w[:, layer].astype(h_xhd.dtype)) + b[:, layer]
            h_xhd = h_xhd + jax.nn.silu(pre_xhd)
        return h_xhd


def randomize(heads: MedusaHeads, key: jax.Array, scale: float = 1.0) -> MedusaHeads:
    """Gives the heads random weights (std scale/sqrt(D)), in place; for tests of "any weights"."""
    kw, kb = jax.random.split(key)
    d = heads.cfg.d_model
    heads.w[...] = (jax.random.normal(kw, heads.w.shape) * scale / jnp.sqrt(d)).astype(heads.w.dtype)
    heads.b[...] = (jax.random.normal(kb, heads.b.shape) * scale * 0.1).astype(heads.b.dtype)
    return heads
