"""The vocabulary argmax: `jnp.argmax` against the two-level `specjax.models.reductions.argmax`.

Two parts, each a median of --reps calls of a jitted `fori_loop` (the argument depends on the loop
counter, so nothing is hoisted), old and new interleaved in one process:

  argmax   the reduction alone on logits of the real vocabularies' shapes (random values)
  greedy   `Transformer.greedy_tokens` of the real model (the head product plus its argmax) at
           1, 9, 8 and 72 rows, with the model's argmax swapped between the two implementations
           (the block-wise head's per-block reduce included)

    python benchmarks/argmax.py [--model gemma3-270m] [--weights float32] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax.models.quant as quant_module
import specjax.models.transformer as transformer_module
from specjax.models import reductions
from specjax.models.loading import load_model

LOOP = 10

PLAIN = {"argmax": lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32),
         "max_argmax": lambda y: (jnp.max(y, axis=-1), jnp.argmax(y, axis=-1).astype(jnp.int32))}
TWO_LEVEL = {"argmax": reductions.argmax, "max_argmax": reductions.max_argmax}


def looped(fn, x0: jax.Array):
    """A jitted call running fn LOOP times on x0 nudged by the loop's carry."""
    def body(i, c):
        return c + fn(x0 + c.astype(x0.dtype) * 1e-9).reshape(-1)[0]
    call = jax.jit(lambda: jax.lax.fori_loop(0, LOOP, body, jnp.int32(0)))
    call().block_until_ready()
    return call


def median_ms(calls: dict, reps: int) -> dict:
    """Median ms per fn application of each call, the calls interleaved rep by rep."""
    times = {k: [] for k in calls}
    for _ in range(reps):
        for k, call in calls.items():
            start = time.perf_counter()
            call().block_until_ready()
            times[k].append((time.perf_counter() - start) / LOOP * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def use(impl: dict) -> None:
    """Points the model code at one argmax implementation (read when a program is traced)."""
    transformer_module.argmax = impl["argmax"]
    quant_module.max_argmax = impl["max_argmax"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--weights", default="float32")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    print("argmax alone (ms): shape, jnp.argmax, two-level, ratio")
    for shape in [(1, 262_144), (9, 262_144), (72, 262_144), (1, 151_936), (8, 151_936), (9, 2048)]:
        x0 = jnp.asarray(rng.normal(size=shape).astype(np.float32))
        t = median_ms({"plain": looped(PLAIN["argmax"], x0), "two": looped(reductions.argmax, x0)}, args.reps)
        print(f"  {shape!s:14} {t['plain']:8.3f} {t['two']:8.3f} {t['plain'] / t['two']:6.1f}x", flush=True)

    model, _ = load_model(args.model, weights=args.weights)
    d = model.cfg.d_model
    print(f"greedy_tokens, {args.model} weights={args.weights} (ms): rows, jnp.argmax, two-level, ratio")
    for b, t_ in [(1, 1), (1, 9), (8, 1), (8, 9)]:
        h0 = jnp.asarray(rng.normal(size=(b, t_, d)).astype(np.float32))
        calls = {}
        for name, impl in (("plain", PLAIN), ("two", TWO_LEVEL)):
            use(impl)
            calls[name] = looped(lambda h: model.greedy_tokens(h), h0)
        use(TWO_LEVEL)
        t = median_ms(calls, args.reps)
        print(f"  {b * t_:3d} ({b}x{t_})  {t['plain']:8.2f} {t['two']:8.2f} {t['plain'] / t['two']:6.2f}x", flush=True)


if __name__ == "__main__":
    main()
