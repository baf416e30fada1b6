"""One packed matrix product on XLA:CPU, per path: what a decoder layer's matrices cost per step.

For each matrix shape of a model's layer and each format of --formats (bfloat16, int8 per 32, q4 per
32, float32 as the baseline), the median time of one product inside a jitted `fori_loop` (so
loop-invariant code motion is in play, as in the decode loop), at one row (batch-1 decode) and at
`--rows` (k+1 verification or a batch), for the paths `weight_formats.packed_product` can take:

  gemv     BlockQuant.gemv: fused matrix-vector dots over (row block, column chunk) pairs (one row)
  blocks   BlockQuant.matmul_chunked: a scan over blocks of output rows, each converted, then a dot
  float32  x @ Wᵀ on a float32 matrix (the weights=float32 format)

Random weights of the real shapes (speed does not depend on the values). The last lines sum a layer
(each shape times its count) per path. Times are per product, ms; medians of --reps calls.

    python benchmarks/packed_matmul.py [--model qwen2.5-coder-1.5b|gemma3-270m] [--rows 9] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import weight_formats as wf
from specjax.models.backend_profile import CPU
from specjax.models.quant import BlockQuant

# (name, out, in, matrices of this shape per layer)
SHAPES = {
    "qwen2.5-coder-1.5b": [("q/o", 1536, 1536, 2), ("k/v", 256, 1536, 2), ("gate/up", 8960, 1536, 2),
                           ("down", 1536, 8960, 1)],
    "gemma3-270m": [("q", 1024, 640, 1), ("o", 640, 1024, 1), ("k/v", 256, 640, 2), ("gate/up", 2048, 640, 2),
                    ("down", 640, 2048, 1)],
}
LOOP = 8  # products per jitted call
FORMATS = ("float32", "bfloat16", "int8", "q4")


def timed(fn, x, packed, reps: int) -> float:
    """ms per product: median over reps calls of a fori_loop of LOOP products feeding each other."""
    @jax.jit
    def run(x, packed):
        def body(_, x):
            return x + fn(packed, x).sum() * 1e-9
        return jax.lax.fori_loop(0, LOOP, body, x)

    run(x, packed).block_until_ready()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run(x, packed).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / LOOP * 1e3


def paths(packed: BlockQuant | None, rows: int):
    """{path: product fn} available for this matrix and number of rows."""
    if packed is None:
        return {"float32": lambda w_io, x: x @ w_io}  # stored [in, out], as layers.Linear holds it
    o, i = packed.shape
    out = {"blocks": lambda p, x: p.matmul_chunked(x, wf.block_rows(o, i, CPU.block_bytes, CPU.min_block_rows))}
    cols = packed.gemv_columns(CPU.gemv_max_cols)
    if rows == 1 and cols is not None:
        out["gemv"] = lambda p, x: p.gemv(x, wf.block_rows(o, cols, CPU.block_bytes), cols)
    return out


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, default=9, help="the many-row case (k+1 or a batch)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--formats", default="float32,bfloat16,int8,q4")
    args = ap.parse_args()
    formats = args.formats.split(",")
    if args.rows < 2 or args.reps < 1:
        fail("--rows must be ≥ 2 and --reps ≥ 1")
    if unknown := [f for f in formats if f not in FORMATS]:
        fail(f"--formats: unknown {', '.join(map(repr, unknown))} (known: {', '.join(FORMATS)})")
    rng = np.random.default_rng(0)
    layer: dict[tuple, float] = {}
    print(f"{args.model}, XLA:CPU, ms per product (median of {args.reps})\n")
    print("| matrix | out × in | format | rows | path | ms |\n| --- | --- | --- | --- | --- | --- |")
    for name, o, i, count in SHAPES[args.model]:
        w = rng.standard_normal((o, i)).astype(np.float32)
        for fmt in formats:
            packed = None if fmt == "float32" else BlockQuant.from_arrays(wf.pack_matrix(w, fmt))
            operand = jnp.asarray(w.T) if packed is None else packed
            for rows in (1, args.rows):
                x = jnp.asarray(rng.standard_normal((rows, i)), jnp.float32)
                for path, fn in paths(packed, rows).items():
                    ms = timed(fn, x, operand, args.reps)
                    layer[(fmt, rows, path)] = layer.get((fmt, rows, path), 0.0) + ms * count
                    print(f"| {name} | {o} × {i} | {fmt} | {rows} | {path} | {ms:.3f} |", flush=True)
    print("\nOne layer's matrices (ms per step):\n\n| format | rows | path | ms |\n| --- | --- | --- | --- |")
    for (fmt, rows, path), ms in layer.items():
        print(f"| {fmt} | {rows} | {path} | {ms:.2f} |")


if __name__ == "__main__":
    main()
