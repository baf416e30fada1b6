"""What a speculative round costs in plain steps, by batch size, k and sampling — and what sampling costs.

The adaptive policy (`specjax.decode.spec.rounds.Adaptive`) speculates only when the drafts' expected
accepted tokens pay for a round; `spec_rounds.estimated_verify_cost` holds this script's figures for
XLA:CPU (docs/performance.md, "Verify cost by batch size").

Per batch size and mode, interleaved medians of `--reps` calls of jitted programs over a cache
holding 200 tokens: the plain step (one position per row, int8 one-row head, argmax or one draw) and
the verification of k = 4 and 8 (block forward over k+1 positions per row, then the target's argmax,
or sampled verification of a k-token draft), each run INNER times inside a `lax.while_loop` as decoding
runs it. With --sampler, also a draw from [B, 262144] logits by `jax.random.categorical`
vs `sampling.categorical` (the two-level inverse CDF).

    python benchmarks/verify_cost.py [--model gemma3-270m|qwen2.5-coder-1.5b-instruct|PATH] [--weights float32]
                                     [--activations float32|int8]
                                     [--batch 1,8] [--k 4,8] [--reps 12] [--sampler]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.decode.sampling import categorical
from specjax.decode.spec.verify import sampling_verify
from specjax.models import load_model

CONTEXT = 200
INNER = 8  # rounds per timed call


def medians(fns: dict, reps: int, per: int = 1) -> dict[str, float]:
    """Median seconds per call / `per`, calls interleaved so machine noise hits every program alike."""
    for f in fns.values():
        jax.block_until_ready(f())
    ts = {name: [] for name in fns}
    for _ in range(reps):
        for name, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            ts[name].append((time.perf_counter() - t0) / per)
    return {name: statistics.median(v) for name, v in ts.items()}


def round_program(graphdef, b: int, k: int, greedy: bool):
    """k = 0: a plain step; else the verification of a k-token chain draft. The jitted f(params, cache, key)
    runs INNER such rounds in a `lax.while_loop`, as decoding does (timings divide by INNER): a step run
    once outside a loop is not decoding's program (no `live` counter, no loop fusion), and its packed
    one-row step measured 2-4x slower than a decode step. Each round writes its block into the carried
    cache and its tokens into the carried sum, so no round is loop-invariant or dead."""
    pos_b = jnp.full((b,), CONTEXT, jnp.int32)

    def verify(m, hidden_btd, key, live):
        if greedy:
            return m.greedy_tokens(hidden_btd, live=live)
        logits_btv = m.logits(hidden_btd, live=live)
        if k == 0:
            return categorical(key, logits_btv[:, 0])
        draft_bk, len_b = jnp.full((b, k), 5, jnp.int32), jnp.full((b,), k, jnp.int32)
        return sampling_verify(logits_btv, draft_bk, len_b, key, 1.0, 0, 1.0)[1]

    @jax.jit
    def f(params, cache, key):
        m = nnx.merge(graphdef, params)
        block_bt = jnp.full((b, k + 1), 107, jnp.int32)

        def body(c):
            i, cache, acc = c
            hidden_btd, cache = m(block_bt, pos_b[:, None] + jnp.arange(k + 1)[None], cache, pos_b)
            hidden_btd = jax.lax.optimization_barrier(hidden_btd)  # as the loops keep the norm out of the head
            out = verify(m, hidden_btd, jax.random.fold_in(key, i), i if k == 0 else None)
            return i + 1, cache, acc + jnp.sum(out)

        return jax.lax.while_loop(lambda c: c[0] < INNER, body, (jnp.int32(0), cache, jnp.int32(0)))[2]

    return f


def verify_costs(model, batches, ks, reps: int) -> None:
    graphdef, params = nnx.split(model)
    print("| batch | verification | plain step (ms) | " + " | ".join(f"k={k}" for k in ks) + " |")
    print("|---|---|---|" + "---|" * len(ks))
    for b in batches:
        ids_bt = jnp.full((b, CONTEXT), 107, jnp.int32)
        positions_bt = jnp.broadcast_to(jnp.arange(CONTEXT)[None], (b, CONTEXT))
        _, cache = model(ids_bt, positions_bt, model.init_cache(b, CONTEXT + 56), jnp.zeros((b,), jnp.int32))
        key = jax.random.key(0)
        for greedy in (True, False):
            progs = {k: round_program(graphdef, b, k, greedy) for k in (0, *ks)}
            t = medians({k: functools.partial(f, params, cache, key) for k, f in progs.items()}, reps, INNER)
            cells = " | ".join(f"{t[k] / t[0]:.2f}x" for k in ks)
            print(f"| {b} | {'greedy' if greedy else 'sampled (T=1)'} | {t[0] * 1e3:.1f} | {cells} |", flush=True)


def sampler_costs(vocab: int, batches, reps: int) -> None:
    print("\n| rows | jax.random.categorical (ms) | sampling.categorical (ms) |\n|---|---|---|")
    gumbel = jax.jit(lambda key, x: jax.random.categorical(key, x, axis=-1))
    inverse_cdf = jax.jit(categorical)
    for rows in batches:
        x = jax.random.normal(jax.random.key(rows), (rows, vocab))
        key = jax.random.key(1)
        t = medians({"g": functools.partial(gumbel, key, x), "i": functools.partial(inverse_cdf, key, x)}, reps)
        print(f"| {rows} | {t['g'] * 1e3:.2f} | {t['i'] * 1e3:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model name or path (default: the embedded Gemma 3 270M)")
    ap.add_argument("--weights", default="float32", help="float32 | bfloat16 | int8 | q4")
    ap.add_argument("--activations", default="float32", help="float32 | int8 (int8 / q4 weights only)")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--k", default="4,8")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--sampler", action="store_true", help="also time one draw over the vocabulary")
    a = ap.parse_args()
    model, _ = load_model(a.model, weights=a.weights, activations=a.activations)
    batches = [int(x) for x in a.batch.split(",")]
    verify_costs(model, batches, [int(x) for x in a.k.split(",")], a.reps)
    if a.sampler:
        sampler_costs(model.cfg.vocab_size, sorted({*batches, 72}), a.reps)


if __name__ == "__main__":
    main()
