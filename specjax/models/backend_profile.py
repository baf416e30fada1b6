"""Backend profiles: every XLA:CPU workaround of the project, chosen once per backend.

One frozen `BackendProfile` says how programs are built on a backend; there are two, `CPU` and
`ACCELERATOR`, and `profile_for()` picks one from JAX's backend. What the CPU profile turns on
(docs/performance.md, `quant.py`, `weight_formats.py`):

* the exact int8 copy of a quantised head, read by one-row products: XLA:CPU fuses its conversion
  into the product; other backends read the float32 table (`Generator` drops the copy);
* the loop counter passed as `live` to that one-row int8 head, a no-op XLA cannot prove, so that
  loop-invariant code motion does not hoist a float32 copy of the head out of the loop;
* a fusion fence before the one-row head (`fusion_fence`), so the final norm stays out of the head's
  fused product;
* `IN_PLACE_COMPILER_OPTIONS` (XLA:CPU's copy insertion with region analysis: the donated KV cache
  is updated in place inside the while loops);
* the first-token clock as a `lax.cond` on the loop counter inside the loop body (one program, no
  second copy of the body);
* low-precision matrices multiplied by specjax's native kernel (`native_kernels`: an XLA FFI custom call
  built on first use) for up to `native_max_rows` rows; otherwise, or where it cannot be built, converted
  one cache-sized block of output rows at a time inside a `lax.scan` (`weight_formats.packed_product`),
  and the head's few-row products block-wise.

On GPU / TPU these are noise or worse (a fence blocks fusions, a flag another backend does not
know, a scan serialises a product XLA would fuse), so the accelerator profile uses plain fused ops,
and peels the first token's iteration out of the loop for the clock instead of branching every token.
Tokens are the same either way: every trick is a no-op on values (`tests/decode/test_backend.py`
runs both profiles on CPU).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from specjax.models.kv_cache import IN_PLACE_COMPILER_OPTIONS
from specjax.models.quant import CHUNK_ROWS, MAX_CHUNKED_ROWS


@dataclasses.dataclass(frozen=True)
class BackendProfile:
    """How programs are built for one backend (static: part of every decode program's key).

    Attributes:
      name: "cpu" or "accelerator".
      int8_head: keep the model's int8 head copy for one-row products (else the float32 table).
      live_counter: pass the loop counter to the head as `live` (see the module doc).
      head_barrier: a fusion fence (`fusion_fence`) between the final norm and the head.
      first_token_cond: mark the first-token clock with a `lax.cond` inside the loop (CPU) instead of
        running the first iteration outside the loop (accelerators).
      compiler_options: XLA compiler options of the jitted programs, as sorted (name, value) pairs.
      blockwise: multiply low-precision matrices a block of output rows at a time inside a
        `lax.scan` (XLA:CPU); False: dequantize the whole matrix and call one dot_general.
      block_bytes: float32 bytes of one converted block of a decoder matrix (cache-resident).
      min_block_rows: at least this many output rows per block of a many-row product, however wide
        the matrix: the GEMM of a block is slow with few output columns (Qwen's 1536 × 8960 down
        projection at 9 rows: 14 ms in blocks of 32 rows, 7 ms in blocks of 256).
      gemv_max_cols: one-row products of low-precision matrices run as fused matrix-vector dots
        over chunks of at most this many input columns (`BlockQuant.gemv`); 0: off. XLA:CPU fuses
        the conversion into such a dot only while the vector is under 16 KiB: 4,095 float32.
      head_chunk_rows: rows of the head's blocks (its one-row product is fused, quant.py).
      head_blockwise_rows: up to this many rows the head uses its blocks when a float32 table
        also exists (beyond it the float32 GEMM); without a float32 table, always.
      prefill_chunk: longest block of prompt tokens one prefill step runs (longer prompts go in
        blocks: attention memory grows with block x slots, not prompt²). Accelerators take larger
        blocks (more parallel work per step, more memory).
      min_product_rows: a one-row matrix product (`one_row_padded`: float `Linear`s and the accelerator
        path of packed ones) runs on this many rows, the rest zeros (0: as is). See `one_row_padded`.
      native_max_rows: products of low-precision matrices with up to this many rows of x run in specjax's
        native kernel (`native_kernels`, an XLA FFI custom call; XLA:CPU only) when it is available; 0: never.
        Past ~32 rows XLA's GEMM on converted blocks catches up (docs/performance.md).
      spec_min_accept: the adaptive speculation bar's floor (expected accepted draft tokens per round)
        when `Adaptive.min_expected_accept` is None. A margin over break-even, since a moving average
        overshoots after a lucky streak and a wrongly bought round costs its whole verify forward: on
        XLA:CPU break-even at batch 1 is ~0.8 (k=4) to ~1.3 (k=8) and the floor 2.0; on one H200 a cheap
        drafter's round costs 0.83-1.42 plain steps at batch 1 (break-even ~0.2), where 2.0 kept rows
        averaging 1-2 accepted tokens (a round there buys ~1.7-2.6x) in plain rounds; 1.0 keeps ~0.8.
    """

    name: str
    int8_head: bool
    live_counter: bool
    head_barrier: bool
    first_token_cond: bool
    compiler_options: tuple[tuple[str, object], ...] = ()
    blockwise: bool = False
    block_bytes: int = 3 << 19  # 1.5 MiB: Gemma gate 512 rows, Qwen gate 256 rows (fits a 2 MiB L2)
    min_block_rows: int = 256
    gemv_max_cols: int = 0
    head_chunk_rows: int = CHUNK_ROWS
    head_blockwise_rows: int = 0
    prefill_chunk: int = 2048
    min_product_rows: int = 0
    native_max_rows: int = 0
    spec_min_accept: float = 1.0

    def live(self, steps: jax.Array) -> jax.Array | None:
        """The `live` argument of `Transformer.logits` / `greedy_tokens` inside a loop."""
        return steps if self.live_counter else None

    def head_input(self, hidden: jax.Array, steps: jax.Array) -> jax.Array:
        """The hidden states as the head should see them: on CPU behind a fusion fence keyed on the loop
        counter `steps` (`fusion_fence`)."""
        return fusion_fence(hidden, steps) if self.head_barrier else hidden

    @property
    def options(self) -> dict:
        """compiler_options as the dict `jax.jit` takes."""
        return dict(self.compiler_options)


CPU = BackendProfile("cpu", int8_head=True, live_counter=True, head_barrier=True, first_token_cond=True,
                     compiler_options=tuple(sorted(IN_PLACE_COMPILER_OPTIONS.items())),
                     blockwise=True, gemv_max_cols=4095, head_blockwise_rows=MAX_CHUNKED_ROWS, prefill_chunk=512,
                     native_max_rows=32, spec_min_accept=2.0)
ACCELERATOR = BackendProfile("accelerator", int8_head=False, live_counter=False, head_barrier=False,
                             first_token_cond=False, min_product_rows=8)


def fusion_fence(x: jax.Array, counter: jax.Array) -> jax.Array:
    """`x`, computed where XLA cannot fuse its producers into its consumers: a while loop of one trip.

    XLA:CPU fuses the final RMSNorm's multiplies into the one-row head's fused product and recomputes
    them for every output column: 1.5 ms of a 7.5 ms Gemma 3 270M head (docs/performance.md). The plain
    decode loop avoids it by carrying the hidden state across iterations; rounds that run the forward
    and the head in one iteration (speculation's plain rounds, draft chains) need this fence.
    `lax.optimization_barrier` does not work: the CPU pipeline removes it before fusion. A loop boundary
    is opaque to fusion, but XLA inlines a loop whose one trip it can prove and forwards a value the body
    passes through unchanged; so, as with the head's `live` argument, the loop counter decides what XLA
    cannot: the trip count is `counter >= 0` (1 inside a decode loop) and the body multiplies by it.
    Values are unchanged for any counter (no trip leaves `x` as it is).
    """
    one = (counter >= 0).astype(jnp.int32)
    body = lambda c: (c[0] + 1, c[1] * one.astype(c[1].dtype))
    return jax.lax.while_loop(lambda c: c[0] < one, body, (jnp.zeros((), jnp.int32), x))[1]


def one_row_padded(x_mi: jax.Array, product) -> jax.Array:
    """`product(x_mi)` ([m, in] → [m, out]), a one-row x_mi run on the profile's `min_product_rows` rows.

    On one H200 (XLA:GPU, bfloat16, docs/benchmarks.md) a one-row product of Qwen 1.5B's MLP matrices
    took longer than an eight-row one (XLA strength-reduces small one-row dots to reductions and picks
    a slower GEMM tiling for the large ones), and a batch-1 plain step (2.33 ms) more than a batch-8 one
    (1.62 ms). Padded to 8 rows the batch-1 step took 1.89 ms (Gemma 3 270M: 1.10 → 0.94 ms). Zero rows
    cost no extra weight reads; the optimization barriers keep XLA from slicing the product back down
    to one row. On CPU (min_product_rows 0), and at any other row count, this is `product(x_mi)`.
    """
    pad = profile_for().min_product_rows - 1
    if pad <= 0 or x_mi.shape[0] != 1:
        return product(x_mi)
    x_8i = jax.lax.optimization_barrier(jnp.pad(x_mi, ((0, pad), (0, 0))))
    return jax.lax.optimization_barrier(product(x_8i))[:1]


def one_row_product(x: jax.Array, w_io: jax.Array) -> jax.Array:
    """x [..., in] @ w [in, out] (a float `Linear`), a one-row x padded as `one_row_padded` says."""
    if math.prod(x.shape[:-1]) != 1 or profile_for().min_product_rows <= 1:
        return jnp.einsum("...i,io->...o", x, w_io)  # the product as it always was
    return one_row_padded(x.reshape(1, -1), lambda x_mi: x_mi @ w_io).reshape(*x.shape[:-1], -1)


def profile_for(backend: str | None = None) -> BackendProfile:
    """The profile of `backend` (default: `jax.default_backend()`): CPU's, or the accelerators' one."""
    return CPU if (backend or jax.default_backend()) == "cpu" else ACCELERATOR
