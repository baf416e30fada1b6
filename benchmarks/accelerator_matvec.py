"""A target's decoder products alone, at 1, 8 and 9 rows: what one matrix product costs per layer on a backend.

On the H200 (docs/benchmarks.md, 2026-12-04) a batch-1 plain step of Qwen 1.5B took 2.29 ms against a
0.97 ms weight-read floor, and more than a batch-8 step (1.62 ms). This script separates the products
from the rest of the step: per matrix shape of a target (q, k/v, o, gate/up, down, head), a jitted
`lax.fori_loop` over a stack of `layers` distinct random matrices (so no layer is served from L2) runs
`rows` @ W^T in bfloat16 with float32 accumulation, and reports µs per product, the bandwidth it
reached, and what XLA compiled the product into (custom-call targets and fusion kinds of the optimized
HLO). Run it under each XLA_FLAGS setting to compare (benchmarks/accelerator_flags.sh does).

Indicative only: on the H200 an iteration of the loop costs ~15 µs, so products that read less than
~20 MB (Qwen's q, k/v and o) time the loop, not the product, and `w[i]` may be copied out of the stack
before the product. The decode step itself is measured by accelerator.py.

    python benchmarks/accelerator_matvec.py --assets ASSETS --target qwen2.5-coder-1.5b-instruct \
        [--rows 1,8,9] [--reps 5] [--label default] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def shapes(cfg) -> dict[str, tuple[int, int]]:
    """(out, in) of each decoder product of a config, and the head's."""
    d, h = cfg.d_model, cfg.n_heads * cfg.head_dim
    kv = cfg.n_kv_heads * cfg.head_dim
    return {"q": (h, d), "kv": (kv, d), "o": (d, h), "gate_up": (cfg.ffn_dim, d), "down": (d, cfg.ffn_dim),
            "head": (cfg.vocab_size, d)}


def compiled_kinds(text: str) -> str:
    """What the optimized HLO holds: custom-call targets and fusion kinds, with counts."""
    found: dict[str, int] = {}
    for m in re.finditer(r'custom_call_target="([^"]+)"|kind=(k\w+)|"kind":"(__\w+)"', text):
        key = next(g for g in m.groups() if g)
        found[key] = found.get(key, 0) + 1
    for op in ("dot", "reduce", "convolution"):  # a one-row dot strength-reduced to a reduce shows here
        if n := len(re.findall(rf"= \S+ {op}\(", text)):
            found[op] = n
    return ", ".join(f"{k}×{v}" for k, v in sorted(found.items()))


def time_product(out_dim: int, in_dim: int, rows: int, layers: int, reps: int) -> tuple[float, str]:
    """(µs per product, compiled kinds) for `rows` @ W^T over `layers` stacked random matrices."""
    import jax
    import jax.numpy as jnp

    w = jax.random.normal(jax.random.key(0), (layers, out_dim, in_dim), jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (rows, in_dim), jnp.bfloat16)

    def run(w, x):
        def body(i, acc):
            y = jax.lax.dot_general(x + acc[:, :1].astype(x.dtype), w[i], (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)
            return acc + y[:, :1]  # a dependence between iterations, so XLA cannot drop or batch them
        return jax.lax.fori_loop(0, layers, body, jnp.zeros((rows, 1), jnp.float32))

    f = jax.jit(run)
    kinds = compiled_kinds(f.lower(w, x).compile().as_text())
    jax.block_until_ready(f(w, x))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(w, x))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) / layers * 1e6, kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assets", type=Path, required=True)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rows", default="1,8,9")
    ap.add_argument("--layers", type=int, default=0, help="stacked matrices (default: the target's layers)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--label", default=os.environ.get("XLA_FLAGS", "") or "default")
    ap.add_argument("--out", type=Path, default=Path("accelerator_matvec.jsonl"))
    args = ap.parse_args()
    cfg_path = args.assets / args.target / "config.json"
    if not cfg_path.is_file():
        fail(f"--assets: no {args.target}/config.json under {args.assets} (write it with accelerator.py --prepare)")
    rows = [int(r) for r in args.rows.split(",") if r.isdigit() and int(r) > 0]
    if not rows or len(rows) != len(args.rows.split(",")) or args.reps < 1:
        fail("--rows must be positive integers and --reps ≥ 1")
    from specjax.models.loading import config_from_json

    cfg = config_from_json(cfg_path.read_text())
    with args.out.open("a") as out:
        for name, (o, i) in shapes(cfg).items():
            layers = 1 if name == "head" else (args.layers or cfg.n_layers)
            layers = max(layers, 8) if name == "head" else layers  # the head: 8 copies, so timing is not L2
            for r in rows:
                us, kinds = time_product(o, i, r, layers, args.reps)
                gbps = o * i * 2 / (us * 1e-6) / 1e9
                row = {"label": args.label, "target": args.target, "product": name, "out": o, "in": i, "rows": r,
                       "us": us, "GBps": gbps, "compiled": kinds}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{args.label:>40} {name:>8} {o:>6}x{i:<5} rows {r}: {us:8.1f} µs  {gbps:6.0f} GB/s  [{kinds}]",
                      flush=True)


if __name__ == "__main__":
    main()
