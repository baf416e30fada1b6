"""Decoder-only transformer in Flax NNX (Gemma 3, Llama, Qwen2)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models import native_kernels
from specjax.models.backend_profile import profile_for
from specjax.models.config import ConfigError, ModelConfig
from specjax.models.kv_cache import (
    KVCache,
    attention_masks,
    causal_block_mask,
    transposed,
    write_block,
    write_transposed,
)
from specjax.models.layers import GatedMLP, Linear, RMSNorm, _init, apply_rope, top_k
from specjax.models.quant import BlockQuant
from specjax.models.reductions import argmax

SPLIT_MAX_T = 64  # decode steps and verification blocks; a prefill block keeps one attention
_NEG_INF = -2.3819763e38  # finite, so fully masked rows give uniform (unused) weights, not NaN


class Attention(nnx.Module):
    """Grouped-query attention with optional QK-norm, reading and writing a KV cache."""

    def __init__(self, cfg: ModelConfig, kind: str, dtype, rngs: nnx.Rngs | None):
        d, n, k, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q = Linear(d, n * h, dtype, rngs, bias=cfg.qkv_bias)
        self.k = Linear(d, k * h, dtype, rngs, bias=cfg.qkv_bias)
        self.v = Linear(d, k * h, dtype, rngs, bias=cfg.qkv_bias)
        self.o = Linear(n * h, d, dtype, rngs)
        self.q_norm = RMSNorm(h, cfg.norm_eps, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(h, cfg.norm_eps, dtype) if cfg.qk_norm else None
        self.n, self.kv, self.h = n, k, h
        self.q_scale = cfg.q_scale
        # Set by int8_activations.tile_model: attention in the native fixed-order kernel (greedy speculation
        # then reproduces plain decoding bit for bit; see native_kernels.fixed_order_attention).
        self.fixed_order = False
        if kind == "global":
            self.rope_base, self.rope_scale = cfg.rope_base_global, cfg.rope_scale_global
        else:
            self.rope_base, self.rope_scale = cfg.rope_base_local, 1.0

    def __call__(self, x_btd, positions_bt, mask_bts, kv, start_b):
        b, t, _ = x_btd.shape
        q_btnh = self.q(x_btd).reshape(b, t, self.n, self.h)
        k_btkh = self.k(x_btd).reshape(b, t, self.kv, self.h)
        v_btkh = self.v(x_btd).reshape(b, t, self.kv, self.h)
        if self.q_norm is not None:
            q_btnh, k_btkh = self.q_norm(q_btnh), self.k_norm(k_btkh)
        q_btnh = apply_rope(q_btnh, positions_bt, self.rope_base, self.rope_scale)
        k_btkh = apply_rope(k_btkh, positions_bt, self.rope_base, self.rope_scale)
        q_btkgh = (q_btnh * self.q_scale).reshape(b, t, self.kv, self.n // self.kv, self.h)
        if self.fixed_order:
            return self._fixed_order(x_btd, q_btkgh, k_btkh, v_btkh, mask_bts, kv, start_b)
        if kv is None:
            new_kv = None
            out_btkgh = _attend(q_btkgh, k_btkh, transposed(v_btkh), mask_bts)
        else:
            new_kv = write_block(kv[0], k_btkh, start_b), write_transposed(kv[1], v_btkh, start_b)
            if t <= SPLIT_MAX_T:  # reads the cache as it was before the write above (see _split_attention)
                out_btkgh = _split_attention(q_btkgh, kv, k_btkh, v_btkh, mask_bts, start_b)
            else:
                out_btkgh = _attend(q_btkgh, *new_kv, mask_bts)
        y_btd = self.o(out_btkgh.reshape(b, t, self.n * self.h).astype(x_btd.dtype))
        return y_btd, new_kv

    def _fixed_order(self, x_btd, q_btkgh, k_btkh, v_btkh, mask_bts, kv, start_b):
        """`__call__`'s attention and output projection through `native_kernels.fixed_order_attention`."""
        b, t = k_btkh.shape[:2]
        if kv is None:  # an uncached forward: an empty cache of the block's length, the block at slot 0
            kv = (jnp.zeros_like(k_btkh), jnp.zeros((b, self.kv, self.h, t), v_btkh.dtype))
            new_kv = None
        else:
            new_kv = write_block(kv[0], k_btkh, start_b), write_transposed(kv[1], v_btkh, start_b)
        out_btnh = native_kernels.fixed_order_attention(q_btkgh.reshape(b, t, self.n, self.h), kv[0], kv[1], k_btkh,
                                                        v_btkh, start_b, mask_bts)
        return self.o(out_btnh.reshape(b, t, self.n * self.h).astype(x_btd.dtype)), new_kv


def _scores(q_btkgh, k_bskh, mask_bts):
    scores = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_bskh.astype(q_btkgh.dtype), preferred_element_type=jnp.float32)
    return jnp.where(mask_bts[:, None, None], scores, _NEG_INF)


def _attend(q_btkgh, k_bskh, v_bkhs, mask_bts):
    """Softmax attention of the queries over keys / values [B, S, ...] / [B, kv, h, S] (S: slots)."""
    probs = jax.nn.softmax(_scores(q_btkgh, k_bskh, mask_bts), axis=-1).astype(v_bkhs.dtype)
    return jnp.einsum("bkgts,bkhs->btkgh", probs, v_bkhs)


def _split_attention(q_btkgh, kv, k_btkh, v_btkh, mask_bts, start_b):
    """Attention over the committed cache (read before this block's write) and the block itself.

    The same visibility as attending to the cache after the write (`attention_masks`: committed slots
    s < start_b, and block slots as the block mask allows), one softmax over both parts. Reading the
    cache before the write is what lets XLA:CPU update it in place: attending to the written cache
    made it compute the write twice (in place for the loop carry, into a copy for the attention) and
    copy every layer's keys and values each step. Callers keep start_b + T <= slots (as `write_block`
    requires), so the block's own mask entries are in range.
    """
    b, t = k_btkh.shape[:2]
    slots = kv[0].shape[1]
    committed_bts = mask_bts & (jnp.arange(slots)[None, :] < start_b[:, None])[:, None, :]
    block_slots_bt = start_b[:, None] + jnp.arange(t)[None, :]
    block_mask_btt = jnp.take_along_axis(mask_bts, jnp.broadcast_to(block_slots_bt[:, None, :], (b, t, t)), axis=2)
    scores = jnp.concatenate([_scores(q_btkgh, kv[0], committed_bts), _scores(q_btkgh, k_btkh, block_mask_btt)],
                             axis=-1)
    probs = jax.nn.softmax(scores, axis=-1)
    p_cache, p_block = probs[..., :slots].astype(kv[1].dtype), probs[..., slots:].astype(v_btkh.dtype)
    return (jnp.einsum("bkgts,bkhs->btkgh", p_cache, kv[1])
            + jnp.einsum("bkgtj,bjkh->btkgh", p_block, v_btkh).astype(kv[1].dtype))


class Block(nnx.Module):
    """Pre-norm attention and MLP, with Gemma's extra post-norms when configured."""

    def __init__(self, cfg: ModelConfig, kind: str, dtype, rngs: nnx.Rngs | None):
        self.kind = kind
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype)
        self.attn = Attention(cfg, kind, dtype, rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype)
        self.mlp = GatedMLP(cfg.d_model, cfg.ffn_dim, cfg.activation, dtype, rngs)
        self.post_attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype) if cfg.sandwich_norms else None
        self.post_mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype) if cfg.sandwich_norms else None

    def __call__(self, x_btd, positions_bt, mask_bts, kv, start_b):
        y_btd, kv = self.attn(self.attn_norm(x_btd), positions_bt, mask_bts, kv, start_b)
        if self.post_attn_norm is not None:
            y_btd = self.post_attn_norm(y_btd)
        x_btd = x_btd + y_btd
        y_btd = self.mlp(self.mlp_norm(x_btd))
        if self.post_mlp_norm is not None:
            y_btd = self.post_mlp_norm(y_btd)
        return x_btd + y_btd, kv


def _run_block(block: Block, *args):
    """`block(*args)` through one jitted program per block structure: tracing reuses it for every block of the
    same kind and shapes (2 traces per forward for Gemma's 18 layers, not 18); XLA inlines the calls."""
    graphdef, state = nnx.split(block)
    return _block_program(graphdef, state, *args)


@functools.partial(jax.jit, static_argnums=0)
def _block_program(graphdef, state, *args):
    return nnx.merge(graphdef, state)(*args)


class Transformer(nnx.Module):
    """Token embedding, decoder blocks, final norm and (tied or separate) output head.

    `__call__` returns final-normed hidden states; `logits` maps chosen hidden states to
    the vocabulary, so callers pay the 262k-wide head only for the rows they need.
    """

    def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None):
        self.cfg = cfg
        self.dtype = dtype
        self.embed = nnx.Param(_init(rngs, (cfg.vocab_size, cfg.d_model), cfg.d_model, dtype))
        self.blocks = nnx.List([Block(cfg, kind, dtype, rngs) for kind in cfg.layer_kinds])
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype)
        self.head = None if cfg.tie_embeddings else nnx.Param(
            _init(rngs, (cfg.vocab_size, cfg.d_model), cfg.d_model, dtype))
        self.head_quant: BlockQuant | None = nnx.data(None)  # attached by the GGUF loader
        # A low-precision embedding replaces `embed` (weight_formats.attach_packed); a tied
        # head_quant is then the same object.
        self.embed_packed: BlockQuant | None = nnx.data(None)

    def embed_tokens(self, tokens_bt: jax.Array) -> jax.Array:
        if self.embed_packed is not None:
            x_btd = self.embed_packed.rows(tokens_bt).astype(self.dtype)
        else:
            x_btd = jnp.take(self.embed[...], tokens_bt, axis=0)
        return x_btd * jnp.asarray(self.cfg.embed_multiplier, self.dtype)

    def __call__(
        self,
        tokens_bt: jax.Array,
        positions_bt: jax.Array,
        cache: KVCache | None = None,
        start_b: jax.Array | None = None,
        block_mask_btt: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Runs a block of T tokens per row.

        Args:
          tokens_bt: token ids [B, T].
          positions_bt: RoPE position of each token [B, T].
          cache: KV cache to read and write; None for an uncached forward over the block.
          start_b: first cache slot written by each row (required with a cache).
          block_mask_btt: visibility among the block's tokens (default causal); a token
            tree passes its ancestor mask here.

        Returns:
          (hidden_btd after the final norm, updated cache or None).
        """
        hidden_btd, new_cache, _ = self.forward(tokens_bt, positions_bt, cache, start_b, block_mask_btt)
        return hidden_btd, new_cache

    def forward(self, tokens_bt, positions_bt, cache=None, start_b=None, block_mask_btt=None,
                taps: tuple[int, ...] = ()) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
        """`__call__`, also returning the residual stream after the blocks listed in `taps` (EAGLE-3's
        low / mid / high features): (hidden_btd, cache, taps [B, T, len(taps) * D] or None without taps)."""
        b, t = tokens_bt.shape
        if block_mask_btt is None:
            block_mask_btt = jnp.broadcast_to(causal_block_mask(t), (b, t, t))
        if start_b is None:
            start_b = jnp.zeros((b,), jnp.int32)
        slots = t if cache is None else cache.num_slots
        window = self.cfg.sliding_window if "local" in self.cfg.layer_kinds else None
        mask_global, mask_local = attention_masks(positions_bt, start_b, slots, block_mask_btt, window)
        kv = None if cache is None else (cache.k, cache.v)
        x_btd, kv, tapped = self.run_blocks(self.embed_tokens(tokens_bt), positions_bt, (mask_global, mask_local), kv,
                                            start_b, taps=taps)
        new_cache = None if cache is None else KVCache(k=kv[0], v=kv[1])
        return self.final_norm(x_btd), new_cache, (jnp.concatenate(tapped, axis=-1) if taps else None)

    def run_blocks(self, x_btd, positions_bt, masks, kv, start_b, layers=None, taps: tuple[int, ...] = ()):
        """Runs decoder blocks over embedded inputs (no final norm): the loop `__call__` and the
        self-speculative drafters (layer skip, a draft model's cache feed) share.

        Args:
          x_btd: the block's inputs [B, T, D]; positions_bt their positions.
          masks: (global mask, local mask) from `kv_cache.attention_masks`.
          kv: (keys, values), one cache array per run block, or None for an uncached forward.
          start_b: first cache slot written per row.
          layers: indices of the blocks to run, in order (static; default all).
          taps: indices of blocks whose outputs are also returned (static; each must be run).

        Returns:
          (outputs [B, T, D], (new keys, new values) or None, [the tapped blocks' outputs, in `taps` order]).
        """
        layers = range(len(self.blocks)) if layers is None else layers
        missing = sorted(set(taps) - set(layers))
        if missing:
            raise ConfigError(f"taps {missing} are not among the run layers {list(layers)}")
        new_k, new_v, tapped = [], [], {}
        for j, i in enumerate(layers):
            block = self.blocks[i]
            mask = masks[1] if block.kind == "local" else masks[0]
            x_btd, kv_j = _run_block(block, x_btd, positions_bt, mask, None if kv is None else (kv[0][j], kv[1][j]),
                                     start_b)
            if kv_j is not None:
                new_k.append(kv_j[0])
                new_v.append(kv_j[1])
            if i in taps:
                tapped[i] = x_btd
        return x_btd, (None if kv is None else (tuple(new_k), tuple(new_v))), [tapped[i] for i in taps]

    def head_table(self) -> jax.Array:
        """The [V, D] output table: the tied embedding, or the separate head (dequantized when the `weights=`
        format packed it)."""
        table = self._float_table()
        return table[...] if table is not None else self.head_quant.dequantized().astype(self.dtype)

    def logits(self, hidden_btd: jax.Array, live: jax.Array | None = None) -> jax.Array:
        """Vocabulary logits (float32) for the given hidden states.

        When the loader attached a low-precision head (an exact int8 copy of a quantised float32
        head, or the `weights=` format's), one row uses its fused product and, on CPU, up to
        `BackendProfile.head_blockwise_rows` rows (every row count without a float32 table) its
        block-wise product (`quant.py` explains why only then); everything else uses the float32
        table, or the dequantized low-precision one on accelerators.
        """
        b, t, d = hidden_btd.shape
        if self._native_head(b * t):
            logits = native_kernels.block_quant_product(self.head_quant, hidden_btd.reshape(b * t, d)).reshape(b, t, -1)
        elif self.head_quant is not None and b * t == 1:
            logits = self.head_quant.matvec(hidden_btd.reshape(1, -1), live).reshape(1, 1, -1)
        elif self._head_in_blocks(b * t):
            # Few rows on CPU (verification, batches): block-wise int8 conversion beats the
            # float32 GEMM; accelerators keep the one large product.
            logits = self.head_quant.matmul_chunked(hidden_btd.reshape(b * t, d),
                                                    profile_for().head_chunk_rows).reshape(b, t, -1)
        else:
            table_vd = self.head_table()
            # A 2-D product: XLA:CPU runs [B*T, D] @ [V, D]^T ~2x faster than the batched
            # einsum over [B, T, D] at one row (docs/performance.md).
            logits_nv = jax.lax.dot_general(hidden_btd.reshape(b * t, d).astype(table_vd.dtype), table_vd,
                                            (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            logits = logits_nv.reshape(b, t, -1)
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else jnp.tanh(logits / cap) * cap

    def greedy_tokens(self, hidden_btd: jax.Array, live: jax.Array | None = None) -> jax.Array:
        """argmax of `logits(hidden_btd, live)` (int32 [B, T]); few rows on CPU never build the logits."""
        b, t, d = hidden_btd.shape
        if b * t > 1 and self.cfg.final_logit_softcap is None and self._chunked_head(b * t):
            return self.head_quant.argmax_chunked(hidden_btd.reshape(b * t, d)).reshape(b, t)
        return argmax(self.logits(hidden_btd, live))

    def top_tokens(self, hidden_btd: jax.Array, r: int) -> jax.Array:
        """The r most likely tokens of `logits(hidden_btd)`, best first (int32 [B, T, r]; [..., 0] is
        `greedy_tokens`' argmax). Few rows on CPU never build the logits (`BlockQuant.top_k_chunked`)."""
        b, t, d = hidden_btd.shape
        if b * t > 1 and self.cfg.final_logit_softcap is None and self._chunked_head(b * t):
            return self.head_quant.top_k_chunked(hidden_btd.reshape(b * t, d), r).reshape(b, t, r)
        return top_k(self.logits(hidden_btd), r)[1]

    def _float_table(self):
        """The float32 / bfloat16 head table (the embedding when tied), or None when packed."""
        return self.embed if self.head is None and self.cfg.tie_embeddings else self.head

    def _head_in_blocks(self, rows: int) -> bool:
        """Whether `rows` head products take the block-wise low-precision path (CPU; quant.py)."""
        prof = profile_for()
        return (self.head_quant is not None and prof.blockwise
                and (rows <= prof.head_blockwise_rows or self._float_table() is None))

    def _native_head(self, rows: int) -> bool:
        """Whether `rows` head products run in the native kernel (CPU, where it was built; `native_kernels`)."""
        return (self.head_quant is not None and (rows == 1 or self._head_in_blocks(rows))
                and native_kernels.applies(self.head_quant, rows, profile_for().native_max_rows))

    def _chunked_head(self, rows: int) -> bool:
        """Whether argmax / top-k of `rows` head products reduce block by block (`BlockQuant.argmax_chunked`)."""
        return self._head_in_blocks(rows) and not self._native_head(rows)

    def init_cache(self, batch: int, slots: int) -> KVCache:
        c = self.cfg
        return KVCache.zeros(c.n_layers, batch, slots, c.n_kv_heads, c.head_dim, self.dtype)
