"""What a costly drafter's k-token draft costs, in plain target steps, for the adaptive policy.

A speculative round pays the verify forward (`spec_rounds.estimated_verify_cost`) plus the draft. A
network drafter's draft is not free next to the target: a layer-skip draft step runs N of the
target's layers and its 262,144-row head, which alone is ~30% of a Gemma 3 270M step. The policy
(`spec_rounds.Adaptive.bar`) adds this estimate to the verify cost, so that a drafter speculates only
when its expected accepted tokens pay for both.

The model: decoding one token is memory-bound, so a forward costs about the bytes of weights it reads
— bytes, not parameters: the loaded Gemma head is an int8 copy (~1.1 B per weight, quant.py) while
the blocks are float32 (4 B), so a block costs ~1.8x its parameter share. A draft step that reads
W bytes costs STEP_FIXED + (1 - STEP_FIXED) * W / W_target of a plain step, where STEP_FIXED is the
per-step overhead that does not shrink with the network (dispatch, sampling, cache update). Fitted
to `benchmarks/model_drafters.py --profile` (docs/performance.md, "Draft cost"): within ~4% for
early exits after 2-15 layers through the full or a 32k-row head. Drafters declare their per-round
cost with a `draft_cost(model, draft_params, k)` method built from `step_fraction`; a costly drafter
that declares none is charged `UNDECLARED_STEP` per draft token.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from specjax.decode.spec.drafters.base import is_cheap
from specjax.models.weight_formats import iter_linears

STEP_FIXED = 0.03
UNDECLARED_STEP = 0.5


def nbytes(tree) -> int:
    """Bytes of the arrays in a pytree or nnx module (shapes and dtypes only: abstract arrays work)."""
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree)
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def head_bytes(model, table=None) -> int:
    """Bytes one head product reads: a reduced `draft_vocab.HeadTable`'s rows, else `model`'s own head
    (its exact int8 copy when the GGUF loader attached one, as plain steps use it; else the table)."""
    if table is not None:
        return nbytes(table.table_nd)
    if model.head_quant is not None:
        return nbytes(model.head_quant)
    return nbytes(model.embed if model.head is None else model.head)


def blocks_bytes(model, layers=None) -> int:
    """Bytes of `model`'s decoder blocks (the given layer indices, else all)."""
    layers = range(len(model.blocks)) if layers is None else layers
    return sum(nbytes(model.blocks[i]) for i in layers)


def target_bytes(model) -> int:
    """Bytes a plain target step reads: every block and the vocabulary-wide head."""
    return blocks_bytes(model) + head_bytes(model)


def packed_share(model, profile) -> float:
    """The share of a plain step's weight bytes in packed decoder matrices that the backend multiplies by
    one row faster than by many (`BackendProfile.gemv_max_cols`); 0 without such a one-row path.

    On XLA:CPU a one-row product of a packed matrix is a fused matrix-vector dot (`BlockQuant.gemv`)
    while the k+1 rows of a verify forward dequantize block by block, so packed weights make a verify
    forward dearer in plain steps than float32 ones do (`policy.estimated_verify_cost`).
    """
    if not profile.gemv_max_cols:
        return 0.0
    packed = sum(nbytes(lin.packed) for _, lin in iter_linears(model.blocks) if lin.packed is not None)
    return packed / target_bytes(model)


def product_kernel(model, profile) -> str:
    """Which products a verify forward of the target runs (`policy.estimated_verify_cost` models each):
    "int8" (`activations=int8`: every packed product in the int8 kernel), "native" (packed matrices in the
    float32 native kernel up to `BackendProfile.native_max_rows` rows), or "xla"."""
    from specjax.models import native_kernels

    packed = [lin.packed for _, lin in iter_linears(model.blocks) if lin.packed is not None]
    if any(getattr(p, "tiled", False) for p in packed):
        return "int8"
    if packed and profile.native_max_rows and native_kernels.available():
        return "native"
    return "xla"


def step_fraction(model, bytes_read: int) -> float:
    """Cost of a draft forward that reads `bytes_read` bytes of weights, as a fraction of a target step."""
    return STEP_FIXED + (1.0 - STEP_FIXED) * bytes_read / target_bytes(model)


def max_accept(drafter, k: int) -> int:
    """The most draft tokens one round can accept: k for a chain, the depth for a token tree (a drafter
    declares it with a `max_accept(k)` method; undeclared: k)."""
    declared = getattr(drafter, "max_accept", None)
    return k if declared is None else min(k, int(declared(k)))


def draft_cost(drafter, model, draft_params, k: int) -> float:
    """A round's draft cost in plain target steps: 0 for a cheap drafter, else the drafter's estimate."""
    if is_cheap(drafter):
        return 0.0
    declared = getattr(drafter, "draft_cost", None)
    if declared is None:
        return UNDECLARED_STEP * k
    return float(declared(model, draft_params, k))
