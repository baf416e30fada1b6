"""Building blocks: RMSNorm, rotary embeddings, linear maps, the gated MLP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models import native_kernels
from specjax.models.backend_profile import one_row_product
from specjax.models.weight_formats import packed_product


def _init(rngs: nnx.Rngs | None, shape: tuple[int, ...], fan_in: int, dtype) -> jax.Array:
    """Normal(0, 1 / fan_in) weights; zeros without `rngs` (a loader fills them: no key is drawn, which under
    `nnx.eval_shape` saves ~2 ms a matrix — drawing one updates the rng counter through a traced set_value)."""
    if rngs is None:
        return jnp.zeros(shape, dtype)
    return (jax.random.normal(rngs.params(), shape, jnp.float32) / jnp.sqrt(fan_in)).astype(dtype)


class RMSNorm(nnx.Module):
    """y = x / rms(x) * scale, computed in float32.

    Checkpoints that store Gemma's (1 + w) convention are converted by the loaders, so the
    module always multiplies by the stored scale.
    """

    def __init__(self, dim: int, eps: float, dtype, rngs: nnx.Rngs | None = None):
        del rngs
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps
        self.fixed_order = False  # set by int8_activations.tile_model (native_kernels.fixed_order_rms_norm)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.fixed_order:
            return native_kernels.fixed_order_rms_norm(x, self.scale[...], self.eps).astype(x.dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


class Linear(nnx.Module):
    """x @ W (+ b) with W stored [in, out], or low-precision [out, in] in `packed`.

    `packed` (a quant.BlockQuant) is attached by weight_formats.attach_packed, which drops `w`;
    the product is then weight_formats.packed_product (the backend's way to dequantize).
    """

    def __init__(self, d_in: int, d_out: int, dtype, rngs: nnx.Rngs | None, bias: bool = False):
        self.w = nnx.Param(_init(rngs, (d_in, d_out), d_in, dtype))
        self.b = nnx.Param(jnp.zeros((d_out,), dtype)) if bias else None
        self.packed = nnx.data(None)

    def __call__(self, x: jax.Array) -> jax.Array:
        packed = self.packed
        y = packed_product(packed, x) if packed is not None else one_row_product(x, self.w[...])
        return y + self.b[...] if self.b is not None else y


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)): GeGLU (tanh GELU) for Gemma, SwiGLU for Llama/Qwen2."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str, dtype, rngs: nnx.Rngs | None):
        self.gate = Linear(d_model, ffn_dim, dtype, rngs)
        self.up = Linear(d_model, ffn_dim, dtype, rngs)
        self.down = Linear(ffn_dim, d_model, dtype, rngs)
        self.activation = activation

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        g = self.gate(x_btd)
        g = jax.nn.gelu(g, approximate=True) if self.activation == "gelu_tanh" else jax.nn.silu(g)
        return self.down(g * self.up(x_btd))


def apply_rope(x_btnh: jax.Array, positions_bt: jax.Array, base: float, scale: float = 1.0) -> jax.Array:
    """Rotary embedding, split-half ("NeoX") layout, angles computed in float32."""
    half = x_btnh.shape[-1] // 2
    inv_freq = 1.0 / (base ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / x_btnh.shape[-1]))
    angles_bth = (positions_bt.astype(jnp.float32) / scale)[..., None] * inv_freq
    cos, sin = jnp.cos(angles_bth)[:, :, None, :], jnp.sin(angles_bth)[:, :, None, :]
    x32 = x_btnh.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_btnh.dtype)


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k` over the last axis (values, int32 indices), run on a 2-D [rows, n] view.

    XLA:CPU runs a 2-D top-k as its TopK kernel, but inside the decode programs it expanded a 3-D one
    ([B, T, V] logits) into a full sort of every row: 9.4 s instead of ~0.8 s per Token Recycling round at
    batch 8 on Gemma's 262,144 ids. Flattening the leading axes keeps the kernel on every backend.
    """
    lead, n = x.shape[:-1], x.shape[-1]
    values, indices = jax.lax.top_k(x.reshape(-1, n), k)
    return values.reshape(*lead, k), indices.astype(jnp.int32).reshape(*lead, k)
