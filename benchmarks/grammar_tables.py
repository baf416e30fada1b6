"""Grammar compiler numbers on the Gemma 3 vocabulary: compile time (cold / cached), table memory, and
per-token mask+advance time measured inside one jitted ``lax.fori_loop`` over a real token path.

    python benchmarks/grammar_tables.py [--reps 3]

The per-token time is (loop time) / (path length): the loop masks a [B, V] logits row and advances the
state at every step, as the decode loop will. Grammars: tests/grammar/grammar_samples.py, plus lark's
own python.lark (expected to be refused: it needs a postlexer for indentation).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "grammar"))
from grammar_samples import DOCS, GRAMMARS  # noqa: E402

from specjax.grammar import GrammarError, GrammarOptions, advance, compile_grammar, mask_logits  # noqa: E402

DEPTH = {"json": 3, "sql": 3, "arith": 4}  # the documents need these nesting depths


@jax.jit
def _run_path(tables, path_t, logits_bv):
    def body(i, carry):
        state_b, ok_b, total = carry
        token_b = jnp.broadcast_to(path_t[i], state_b.shape)
        masked_bv = mask_logits(tables, state_b, logits_bv)
        ok_b &= jnp.isfinite(masked_bv[jnp.arange(state_b.shape[0]), token_b])
        return advance(tables, state_b, token_b), ok_b, total + masked_bv.max()
    state_b = jnp.full(logits_bv.shape[:1], tables.initial_state, jnp.int32)
    return jax.lax.fori_loop(0, path_t.shape[0], body, (state_b, jnp.ones(state_b.shape, bool), 0.0))


def per_token_us(tables, path: list[int], batch: int, reps: int) -> float:
    path_t = jnp.asarray(path, jnp.int32)
    logits_bv = jnp.zeros((batch, tables.vocab_size), jnp.float32)
    state_b, ok_b, _ = jax.block_until_ready(_run_path(tables, path_t, logits_bv))
    assert bool(ok_b.all()), "the document's own tokens must be allowed"
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(_run_path(tables, path_t, logits_bv))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / len(path) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from specjax.models.loading import load_model

    _, tok = load_model(None)
    os.environ["SPECJAX_CACHE"] = tempfile.mkdtemp(prefix="grammar-bench-")  # cold: an empty cache
    import lark

    sources = dict(GRAMMARS, python=(Path(lark.__file__).parent / "grammars" / "python.lark").read_text())
    for name, text in sources.items():
        options = GrammarOptions(max_depth=DEPTH.get(name, 2), start="file_input" if name == "python" else "start")
        t0 = time.perf_counter()
        try:
            tables = compile_grammar(text, tok, options)
        except GrammarError as e:
            print(f"{name}: refused after {time.perf_counter() - t0:.1f} s: {e}")
            continue
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        compile_grammar(text, tok, options)
        cached = time.perf_counter() - t0
        path = tok.encode(DOCS[name], add_bos=False) + [tok.eos_ids[0]]
        us1 = per_token_us(tables, path, 1, args.reps)
        us8 = per_token_us(tables, path, 8, args.reps)
        print(f"{name}: max_depth {options.max_depth}, {tables.n_states} states (raw {tables.raw_states}), "
              f"{tables.mask_rw.shape[0]} mask rows, tables {tables.nbytes() / 2**20:.1f} MiB "
              f"(masks {tables.mask_rw.size * 4 / 2**20:.1f} MiB); compile cold {cold:.2f} s, cached {cached:.3f} s; "
              f"mask+advance per token {us1:.1f} µs (B=1), {us8:.1f} µs (B=8, per step) over {len(path)} tokens")


if __name__ == "__main__":
    main()
