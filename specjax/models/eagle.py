"""EAGLE draft head (Li et al. 2024, EAGLE-1/2): one decoder layer that extrapolates the target's features.

At position t the head reads the pair (target feature f_t, embedding of token x_{t+1}) and predicts
the next feature f_{t+1}; the target's frozen head turns that into a distribution over x_{t+2}.
Drafting runs it autoregressively over its own predicted features (`decode/eagle_drafter.py`):

    ĝ_{t+1} = EagleHead(f_t, x_{t+1}),   x̂_{t+2} ~ head(ĝ_{t+1}),   ĝ_{t+2} = EagleHead(ĝ_{t+1}, x̂_{t+2}), …

Architecture: RMSNorm on each input (Gemma scales embeddings by √D ≈ 25 while features are
normed, so without it one input would drown the other — EAGLE-3 normalises both the same way),
fc [2D → D] on their concatenation, ONE `transformer.Block` of the target's shape (RoPE, GQA,
QK-norm, its own KV cache from `kv_cache`), and a final RMSNorm.

EAGLE-3 (Li et al. 2025) feeds the head, at committed positions, a fusion of low, mid and high target
layers instead (`EagleConfig.fuse_layers`): the residual streams after those blocks, each RMS-normed
(their scales differ by orders of magnitude across Gemma's layers), concatenated and projected
[n·D → D] by `fuse_features`. Drafting past depth 1 still feeds back the head's own outputs.

Without fusion, the feature is the target's FINAL-NORMED hidden state — what `Transformer.__call__` returns —
not the pre-norm residual stream EAGLE-1 uses. Reasons: it is what the target already exposes (no
second output from the 18-layer body), the head reads it directly (logits = f @ E^T), and its
scale is fixed by the norm, which keeps the feature-regression loss well conditioned across
layers and positions. The final norm only removes the residual stream's magnitude, which the
tied head would see as a per-position temperature; the trailing RMSNorm here maps the draft's
output into the same normed space so its features can be fed back in and compared with the
target's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.config import ConfigError, ModelConfig, increasing_layers
from specjax.models.kv_cache import KVCache, attention_masks, causal_block_mask
from specjax.models.layers import Linear, RMSNorm
from specjax.models.transformer import Block


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    """Shape of an EAGLE head.

    Attributes:
      layer: configuration of its single decoder layer (n_layers == 1, a "global" layer: the draft
        attends to the whole context, with the target's global RoPE base).
      vocab_size: rows of the target embedding the head reads tokens from.
      embed_multiplier: the target's embedding scale (√D for Gemma), applied to looked-up rows.
      fuse_layers: EAGLE-3 feature fusion: target blocks whose outputs the head reads at committed
        positions (`Transformer.forward(taps=...)`); empty: the target's final-normed hidden state.
    """

    layer: ModelConfig
    vocab_size: int
    embed_multiplier: float = 1.0
    fuse_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.layer.n_layers != 1 or self.layer.layer_kinds != ("global",):
            raise ConfigError(f"EagleConfig.layer must have one global layer, got {self.layer.layer_kinds}")
        if self.vocab_size < 1:
            raise ConfigError(f"EagleConfig.vocab_size must be positive, got {self.vocab_size}")
        if not increasing_layers(self.fuse_layers):
            raise ConfigError(f"EagleConfig.fuse_layers must be increasing non-negative layer indices, "
                              f"got {self.fuse_layers}")

    @property
    def d_model(self) -> int:
        return self.layer.d_model

    @classmethod
    def from_target(cls, target: ModelConfig, fuse_layers: tuple[int, ...] = ()) -> EagleConfig:
        """One decoder layer of the target's own shape (heads, widths, norms, activation).

        fuse_layers: target blocks to fuse (EAGLE-3: blocks 2, L/2 and L-3), or empty for the final-normed feature.
        """
        bad = [i for i in fuse_layers if not 0 <= i < target.n_layers]
        if bad:
            raise ConfigError(f"fuse_layers {bad} are outside the target's {target.n_layers} layers")
        layer = target.replace(n_layers=1, layer_kinds=("global",), final_logit_softcap=None)
        return cls(layer=layer, vocab_size=target.vocab_size, embed_multiplier=target.embed_multiplier,
                   fuse_layers=tuple(fuse_layers))


class EagleHead(nnx.Module):
    """fc(norm(embed(x_{t+1})) ‖ norm(f_t)) → one decoder layer → RMSNorm → ĝ_{t+1}."""

    def __init__(self, cfg: EagleConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        d, eps = cfg.d_model, cfg.layer.norm_eps
        self.cfg = cfg
        self.dtype = dtype
        self.emb_norm = RMSNorm(d, eps, dtype)
        self.feat_norm = RMSNorm(d, eps, dtype)
        self.fc = Linear(2 * d, d, dtype, rngs, bias=True)
        self.block = Block(cfg.layer, "global", dtype, rngs)
        self.out_norm = RMSNorm(d, eps, dtype)
        n = len(cfg.fuse_layers)
        self.fuse_norms = nnx.List([RMSNorm(d, eps, dtype) for _ in range(n)])
        self.fuse = Linear(n * d, d, dtype, rngs) if n else None

    @property
    def fused(self) -> bool:
        """Whether the head reads fused target layers (EAGLE-3) at committed positions."""
        return bool(self.cfg.fuse_layers)

    def fuse_features(self, taps_btx: jax.Array) -> jax.Array:
        """The head's feature at committed positions from the target's tapped layers [B, T, n·D] (EAGLE-3)."""
        d = self.cfg.d_model
        parts = [norm(taps_btx[..., i * d:(i + 1) * d].astype(self.dtype)) for i, norm in enumerate(self.fuse_norms)]
        return self.fuse(jnp.concatenate(parts, axis=-1))

    def committed_features(self, hidden_btd: jax.Array, taps_btx: jax.Array | None) -> jax.Array:
        """What the head reads at committed positions: the fused taps (EAGLE-3), else the final-normed states."""
        if not self.fused:
            return hidden_btd
        if taps_btx is None:
            raise ConfigError(f"this EAGLE-3 head reads target layers {self.cfg.fuse_layers}; no tapped features given")
        return self.fuse_features(taps_btx)

    def init_cache(self, batch: int, slots: int) -> KVCache:
        """A one-layer KV cache for `batch` rows of `slots` positions."""
        c = self.cfg.layer
        return KVCache.zeros(1, batch, slots, c.n_kv_heads, c.head_dim, self.dtype)

    def __call__(
        self,
        feat_btd: jax.Array,
        tokens_bt: jax.Array,
        embed_vd: jax.Array,
        positions_bt: jax.Array,
        cache: KVCache | None = None,
        start_b: jax.Array | None = None,
        block_mask_btt: jax.Array | None = None,
        mask_bts: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Predicts the next features of a block of T (feature, next token) pairs per row.

        Args:
          feat_btd: features f_t [B, T, D] (the target's, or the head's own predictions).
          tokens_bt: the tokens x_{t+1} that follow them [B, T].
          embed_vd: the target's (frozen) embedding table [V, D].
          positions_bt: RoPE position t of each pair [B, T].
          cache: the head's KV cache; None for an uncached forward over the block.
          start_b: first cache slot written by each row (required with a cache; default 0).
          block_mask_btt: visibility among the block's pairs (default causal).
          mask_bts: full visibility of cache slots [B, T, S], overriding the two above — for tree
            drafting, where ancestors written by earlier calls must be told apart from siblings.

        Returns:
          (predicted features ĝ_{t+1} [B, T, D], updated cache or None).
        """
        b, t, d = feat_btd.shape
        if d != self.cfg.d_model or embed_vd.shape != (self.cfg.vocab_size, d):
            raise ConfigError(f"EAGLE head of width {self.cfg.d_model} over {self.cfg.vocab_size} tokens got "
                              f"features {feat_btd.shape} and an embedding {embed_vd.shape}")
        if start_b is None:
            start_b = jnp.zeros((b,), jnp.int32)
        if mask_bts is None:
            if block_mask_btt is None:
                block_mask_btt = jnp.broadcast_to(causal_block_mask(t), (b, t, t))
            slots = t if cache is None else cache.num_slots
            mask_bts, _ = attention_masks(positions_bt, start_b, slots, block_mask_btt, None)
        emb_btd = jnp.take(embed_vd, tokens_bt, axis=0).astype(self.dtype) * self.cfg.embed_multiplier
        x_btd = self.fc(jnp.concatenate([self.emb_norm(emb_btd), self.feat_norm(feat_btd.astype(self.dtype))], -1))
        kv = None if cache is None else (cache.k[0], cache.v[0])
        y_btd, kv = self.block(x_btd, positions_bt, mask_bts, kv, start_b)
        new_cache = None if cache is None else KVCache(k=(kv[0],), v=(kv[1],))
        return self.out_norm(y_btd), new_cache
