"""benchmarks/grammar.py — grammar engine cost on the Gemma 3 vocabulary (262,144 tokens), specjax vs peers.

Per grammar (generic JSON, the product JSON Schema, SQL subset and arithmetic of
../shared/bench/grammar_peers.py, lark's own python.lark, and a fixed sample of JSONSchemaBench schemas):

* compile time: cold (disk cache off) and from the disk cache, p50 / p95 over repetitions and schemas;
* per-token mask + advance: specjax runs a jitted loop over a real token path whose every step gathers the
  state's packed mask row (the same [ceil(V/32)] uint32 bitmask peers fill), checks the path's token against
  it, folds the row into a checksum (the row is read, not stored) and advances the state. The loop cycles
  through the path; the per-step cost is the slope between a ~256-step and a ~4096-step call (medians of a
  few interleaved calls each, whole passes over the path), so each call's fixed dispatch cost cancels and
  every step counted is a step run. That is one per-path mean µs/token; the specjax p50 / p99 are over
  these per-path means (several sampled paths per grammar, one per JSONSchemaBench schema; with few paths
  p99 is about the worst path). It is not a per-token tail: within a path, tokens differ only in their
  byte count (the advance loop's trip count) and the row they read. Warm caches: a decode step would read
  the row after the model's forward pass, so colder. Peers (xgrammar, llguidance) are timed per token on
  the host with their own matchers along the same paths (fill bitmask + accept token, as grammar_peers.py
  does); their p50 / p99 are over per-path means and over every token;
* applying the mask in-graph: masked argmax over [1, V] float32 logits vs the plain argmax (µs/token);
* table memory: grammar tables (transitions, acceptance, mask rows) and the vocabulary tables shared by all
  grammars of a tokenizer.

    python benchmarks/grammar.py                      # all grammars, 12 schemas, xgrammar + llguidance
    python benchmarks/grammar.py --schemas 4 --paths 3 --peers none --json /tmp/grammar.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = next((p / "shared" for p in ROOT.parents if (p / "shared" / "bench").is_dir()), ROOT.parent / "shared")
sys.path.insert(0, str(SHARED / "bench"))
os.environ.setdefault("PEERS_CACHE", "/tmp/grammar-peers")
sys.path.insert(0, str(ROOT / "tests" / "grammar"))
from grammar_samples import JSON_LARK  # noqa: E402  (the generic JSON grammar the tests use)


def pct(xs, q):
    return float(np.percentile(np.asarray(xs, np.float64), q)) if len(xs) else float("nan")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------- workloads
def workloads(n_schemas: int, n_paths: int, tokenizer):
    """[(name, lark text, max_depth, [token paths], peer source)]; peer source for xgrammar / llguidance."""
    import itertools

    import grammar_peers as gp
    from python_grammar import PATH as PYTHON_LARK
    from python_grammar import python_lark

    from specjax.grammar.json_schema import JsonSchemaOptions, json_schema_to_lark
    from specjax.grammar.sample import LarkSampler

    flexible = JsonSchemaOptions(whitespace="flexible")
    eos = tokenizer.eos_ids[0]

    def paths(text, docs, depth, ascii_only=False):
        """The fixed document, then n_paths - 1 strings sampled from the grammar (seeded); ascii_only drops
        non-ASCII samples (the sampler draws Python's Unicode \\w, which the engine reads as ASCII)."""
        sampler = LarkSampler(text, max_depth=depth)
        samples = (sampler.sample(random.Random(i)) for i in range(100 * n_paths))
        docs = list(docs) + list(itertools.islice((s for s in samples if s.isascii() or not ascii_only), n_paths - 1))
        return [tokenizer.encode(s, add_bos=False) + [eos] for s in docs]

    items = [
        # Generic JSON with %ignore'd whitespace (tests/grammar/grammar_samples.py), then the schema
        # front-end's flexible whitespace (bounded WS? between all tokens) for the schema `true`.
        ("json", JSON_LARK, 4, [gp.JSON_DOC], ("json", None)),
        ("json (schema front-end, flexible ws)", json_schema_to_lark(True, flexible), 3, [gp.JSON_DOC], ("json", None)),
        ("sql", gp.SQL_LARK, 4, [gp.SQL_DOC], ("sql", None)),
        ("arith", gp.ARITH_LARK, 6, [gp.ARITH_DOC], ("arith", None)),
    ]
    out = []
    for n, t, d, docs, peer in items:
        log(f"  paths for {n}")
        out.append((n, t, d, paths(t, docs, d), peer))
    # lark's python.lark for expressions: start rule eval_input (selected by a `start` rule, which is what
    # GrammarOptions(start="eval_input") does), its three lookaround terminals replaced by regular ones
    # (tests/grammar/python_grammar.py). Peers get the unchanged file (xgrammar and llguidance refuse it).
    python_text = python_lark() + "\nstart: eval_input\n"
    log("  paths for python.lark (eval_input)")
    out.append(("python.lark (eval_input, D=1)", python_text, 1,
                paths(python_text, ["[x ** 2 for x in range(10) if x % 3]"], 1, ascii_only=True),
                ("lark", PYTHON_LARK.read_text())))
    rows = []
    for f in sorted((SHARED / "data" / "jsonschemabench").glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    random.Random(1).shuffle(rows)
    for row in rows:
        if sum(n.startswith("jsb/") for n, *_ in out) >= n_schemas:
            break
        try:
            text = json_schema_to_lark(row["schema"])
            sample = LarkSampler(text, max_depth=3).sample(random.Random(2))
        except Exception:  # noqa: BLE001 - refused or unsamplable schemas are left out of the sample
            continue
        ids = tokenizer.encode(sample, add_bos=False) + [eos]
        out.append((f"jsb/{row['id']}", text, 3, [ids], ("json_schema", json.dumps(row["schema"]))))
    return out


# ------------------------------------------------------------------------------------------- specjax
@jax.jit
def _walk(tables, ids_n, n, initial, steps):
    """`steps` mask + advance steps cycling through the path ids_n[:n] (the state restarts at `initial` at
    each pass). Each step gathers the state's packed [ceil(V/32)] mask row, tests the token's bit and folds the
    whole row into a checksum (so the row is really read every step without writing it out: a decode step
    reads it into the logits select, it does not store it), then advances. Returns (all tokens allowed,
    checksum)."""
    from specjax.grammar.runtime import advance

    def step(i, carry):
        s_b, ok, sum_w = carry
        j = i % n
        s_b = jnp.where(j == 0, initial, s_b)
        tok = ids_n[j]
        row_w = tables.mask_rw[tables.row_s[s_b[0]]]
        ok = ok & (((row_w[tok // 32] >> (tok % 32).astype(jnp.uint32)) & 1) == 1)
        return advance(tables, s_b, tok[None]), ok, sum_w + jnp.sum(row_w)

    _, ok, sum_w = jax.lax.fori_loop(0, steps, step, (initial[None], jnp.bool_(True), jnp.uint32(0)))
    return ok, sum_w


def time_path(tables, ids, reps: int = 5, steps: tuple[int, int] = (256, 4096)) -> list[float]:
    """[µs per mask + advance step] along one path: the slope between two loop lengths.

    One jitted call runs whole passes over the path: about steps[0] and about steps[1] steps (rounded up to
    whole passes). The difference of the two lengths' median call times over the difference of their step
    counts is the per-step cost with the call's fixed dispatch cost cancelled (real decoding is one jitted
    call for the whole generation, so dispatch is not a per-token cost) and with every step counted live.
    Returned as a one-element list (one value per path).
    """
    n = len(ids)
    n_pad = 1 << max(4, (n - 1).bit_length())  # a few padded shapes, so a few compilations per grammar
    ids_n = jnp.asarray(np.pad(np.asarray(ids, np.int32), (0, n_pad - n)))
    passes = (-(-steps[0] // n), max(-(-steps[0] // n) + 1, -(-steps[1] // n)))
    args = (tables, ids_n, jnp.int32(n), jnp.int32(tables.initial_state))
    ok, _ = jax.block_until_ready(_walk(*args, jnp.int32(n)))
    if not bool(ok):
        raise RuntimeError("a path token was refused by the specjax mask")
    ts: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for times, p in zip(ts, passes, strict=True):  # interleaved: load changes hit both lengths alike
            t0 = time.perf_counter()
            jax.block_until_ready(_walk(*args, jnp.int32(p * n)))
            times.append(time.perf_counter() - t0)
    short, long = (statistics.median(t) for t in ts)
    return [(long - short) / ((passes[1] - passes[0]) * n) * 1e6]


def apply_cost(tables, reps: int = 50) -> tuple[float, float]:
    """µs of argmax over [1, V] logits, masked and unmasked (the in-graph application of the mask)."""
    from specjax.grammar.runtime import mask_logits

    logits = jax.random.normal(jax.random.key(0), (1, tables.vocab_size))
    state = jnp.full((1,), tables.initial_state, jnp.int32)
    masked = jax.jit(lambda t, s, x: jnp.argmax(mask_logits(t, s, x), axis=-1))
    plain = jax.jit(lambda x: jnp.argmax(x, axis=-1))
    out = []
    for fn, args in ((masked, (tables, state, logits)), (plain, (logits,))):
        jax.block_until_ready(fn(*args))
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t0)
        out.append(statistics.median(ts) * 1e6)
    return out[0], out[1]


def grammar_bytes(tables) -> int:
    return int(sum(a.size * a.dtype.itemsize for a in (tables.trans_sb, tables.accept_s, tables.mask_rw,
                                                        tables.row_s)))


def bench_specjax(name, text, depth, paths, tokenizer, reps):
    from specjax.grammar import GrammarError, GrammarOptions, compile_grammar

    cold, cached = [], []
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            tables = compile_grammar(text, tokenizer, GrammarOptions(max_depth=depth, cache=False, timeout=None))
            cold.append(time.perf_counter() - t0)
    except GrammarError as e:
        return {"refused": str(e).splitlines()[0]}
    compile_grammar(text, tokenizer, GrammarOptions(max_depth=depth, timeout=None))  # writes the disk cache
    for _ in range(reps):
        t0 = time.perf_counter()
        compile_grammar(text, tokenizer, GrammarOptions(max_depth=depth))
        cached.append(time.perf_counter() - t0)
    per_path = []
    for ids in paths:
        try:
            per_path += time_path(tables, ids, 20 if len(paths) == 1 else 5)
        except RuntimeError as e:
            log(f"  {name}: {e} (path of {len(ids)} tokens skipped)")
    return {"cold_s": cold, "cached_s": cached, "per_path_us": per_path, "states": tables.n_states,
            "rows": int(tables.mask_rw.shape[0]), "grammar_bytes": grammar_bytes(tables),
            "vocab_bytes": tables.nbytes() - grammar_bytes(tables), "tables": tables}


# --------------------------------------------------------------------------------------------- peers
def peer_engines(names, tokenizer):
    if not names:
        return {}
    import grammar_peers as gp

    tokens, types, eos, bos = gp.read_gguf_vocab()
    enc = lambda s: tokenizer.encode(s, add_bos=False)  # noqa: E731 - the same tokenization as specjax
    engines = {}
    if "xgrammar" in names:
        engines["xgrammar"] = gp.XGR(gp.xgr_tokenizer_info(tokens, types))
    if "llguidance" in names:
        engines["llguidance"] = gp.LLG(gp.llg_tokenizer(tokens, types, eos, bos, enc), len(tokens))
    return engines


def peer_compile(engine, kind, source):
    """(compiled, seconds) for a workload's peer source."""
    if kind in ("json", "schema", "sql", "arith"):
        cg, ns = engine.compile(kind)
        return cg, ns / 1e9
    if engine.name == "xgrammar":
        import xgrammar as xgr

        c = xgr.GrammarCompiler(engine.ti, max_threads=1, cache_enabled=False)
        t0 = time.perf_counter()
        cg = c.compile_json_schema(source) if kind == "json_schema" else c.compile_grammar(
            xgr.Grammar.from_lark(source, tokenizer_info=engine.ti))
        return cg, time.perf_counter() - t0
    import llguidance

    grammar = (llguidance.LLMatcher.grammar_from_json_schema(source) if kind == "json_schema"
               else llguidance.LLMatcher.grammar_from_lark(source))
    t0 = time.perf_counter()
    m = llguidance.LLMatcher(engine.tok, grammar, log_level=1)
    dt = time.perf_counter() - t0
    if m.is_error():
        raise RuntimeError(m.get_error())
    return m, dt


def bench_peer(engine, kind, source, paths):
    import grammar_peers as gp

    try:
        cg, dt = peer_compile(engine, kind, source)
    except Exception as e:  # noqa: BLE001 - a peer refusing a grammar is a result, not a crash
        return {"refused": str(e).splitlines()[0][:120]}
    per_path, per_token = [], []
    for ids in paths:
        try:
            fill, acc, _, _ = gp.run_path(engine, engine.new_matcher(cg) if engine.name == "xgrammar"
                                          else peer_compile(engine, kind, source)[0], ids)
        except RuntimeError as e:
            log(f"  {engine.name}: {str(e)[:100]}")
            continue
        steps = [(f + a) / 1e3 for f, a in zip(fill, acc, strict=True)]
        per_token += steps
        per_path.append(statistics.fmean(steps))
    return {"cold_s": [dt], "per_path_us": per_path, "per_token_us": per_token}


# -------------------------------------------------------------------------------------------- report
def summary(rows):
    lines = ["| grammar | engine | compile cold p50 / p95 (ms) | from disk cache p50 (ms) | mask+advance µs/token "
             "p50 / p99 (over paths) | per-token p50 / p99 (peers: every token) | tables (MB) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for group, engines in rows.items():
        for eng, r in engines.items():
            if not r:
                continue
            if "refused" in r:
                lines.append(f"| {group} | {eng} | refused: {r['refused'][:90]} | | | | |")
                continue
            cold = [x * 1e3 for x in r["cold_s"]]
            cache = f"{pct([x * 1e3 for x in r['cached_s']], 50):.0f}" if r.get("cached_s") else "—"
            pp = r["per_path_us"]
            tok = r.get("per_token_us")
            tok_s = f"{pct(tok, 50):.1f} / {pct(tok, 99):.1f}" if tok else "—"
            mem = (f"{r['grammar_bytes'] / 1e6:.1f} (+{r['vocab_bytes'] / 1e6:.1f} vocab)"
                   if "grammar_bytes" in r else "—")
            lines.append(f"| {group} | {eng} | {pct(cold, 50):.0f} / {pct(cold, 95):.0f} | {cache} | "
                         f"{pct(pp, 50):.1f} / {pct(pp, 99):.1f} ({len(pp)} paths) | {tok_s} | {mem} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schemas", type=int, default=12, help="JSONSchemaBench schemas in the sample")
    ap.add_argument("--paths", type=int, default=6, help="token paths per fixed grammar (1 doc + samples)")
    ap.add_argument("--reps", type=int, default=2, help="compile repetitions per fixed grammar")
    ap.add_argument("--peers", default="xgrammar,llguidance", help="comma list, or 'none'")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from specjax.models.loading import load_model

    _, tokenizer = load_model(None)
    log("setting up peers")
    engines = peer_engines([] if a.peers == "none" else a.peers.split(","), tokenizer)
    log("sampling token paths")
    work = workloads(a.schemas, a.paths, tokenizer)
    rows: dict[str, dict] = {}
    apply_us = None
    for name, text, depth, paths, (kind, source) in work:
        group = "jsonschemabench" if name.startswith("jsb/") else name
        log(f"{name}: {len(paths)} path(s)")
        res = {"specjax": bench_specjax(name, text, depth, paths, tokenizer, 1 if group != name else a.reps)}
        if apply_us is None and "tables" in res["specjax"]:
            apply_us = apply_cost(res["specjax"]["tables"])
        res["specjax"].pop("tables", None)
        for ename, eng in engines.items():
            res[ename] = bench_peer(eng, kind, source or text, paths)
        if group == name:
            rows[name] = res
        else:  # schemas: pool their compile times and per-path means
            pool = rows.setdefault(group, {})
            for ename, r in res.items():
                if "refused" in r:
                    pool.setdefault(ename + " refused", {"refused": ""})["refused"] += f"{name} "
                    continue
                acc = pool.setdefault(ename, {"cold_s": [], "cached_s": [], "per_path_us": [], "per_token_us": [],
                                              "grammar_bytes": 0, "vocab_bytes": 0})
                for key in ("cold_s", "cached_s", "per_path_us", "per_token_us"):
                    acc[key] += r.get(key, [])
                if "grammar_bytes" in r:
                    acc["grammar_bytes"] = max(acc["grammar_bytes"], r["grammar_bytes"])
                    acc["vocab_bytes"] = r["vocab_bytes"]
        log(f"  {json.dumps({e: {k: v for k, v in r.items() if k != 'per_token_us'} for e, r in res.items()})[:400]}")
    for pool in rows.get("jsonschemabench", {}).values():
        if not pool.get("per_token_us"):
            pool.pop("per_token_us", None)
        if "grammar_bytes" in pool and not pool["grammar_bytes"]:
            pool.pop("grammar_bytes")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f} "
          f"(2 cores, shared: noisy); JSONSchemaBench: max size of one schema's tables shown")
    print(summary(rows))
    if apply_us:
        print(f"\nmask applied in-graph: masked argmax over [1, {262144}] logits {apply_us[0]:.0f} µs vs "
              f"plain argmax {apply_us[1]:.0f} µs")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "apply_us": apply_us}, indent=1, default=str))


if __name__ == "__main__":
    main()
