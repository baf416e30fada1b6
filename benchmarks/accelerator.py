"""Speculation on an accelerator: what a round costs in plain steps, per drafter, on the real targets' shapes.

Big GGUFs do not travel to a lent GPU, and speed does not depend on the weights' values: the targets are
built with random weights of their real shapes (config and tokenizer written here by `--prepare`), in
bfloat16. τ does depend on the weights, so it is taken from CPU runs on the real models; this script
measures the other factor of a speedup, the cost c of one speculative round in plain steps:
speedup ≈ τ / c (draft, verification and bookkeeping all inside c). On XLA:CPU c is 2.7–3.9 at k = 4–12
(docs/benchmarks.md), which is why speculation barely pays there.

Per target, batch size and setup: plain decoding (`Generator`, ms per loop step) and the speculative
program with every round speculative (`adaptive=False`: the measured round is a real draft + verify
round whatever the random model accepts), ms per loop iteration; interleaved repetitions, medians,
compile time apart. Greedy rows also report whether the speculative tokens equal plain greedy's on this
backend (bf16 on a GPU: the verify block's products run at other shapes than the one-row step, so a
near-tie can flip; random weights make near-ties common). Also: the measured read bandwidth and each
target's weight-read floor per step.

    python benchmarks/accelerator.py --prepare ASSETS          # here, with the real models installed
    python benchmarks/accelerator.py --assets ASSETS [--targets gemma3-270m,qwen2.5-coder-1.5b-instruct]
        [--setups ngram:8,lookup:12,recycle:8,eagle3:10] [--batch 1,8] [--tokens 128] [--reps 3]
        (a setup's own keys override adaptive=0, e.g. ngram:8:adaptive=1:verify_cost=1000:cheap_max_gap=1
         measures plain rounds that propose a shadow draft every round)
        [--temps 0] [--layers N (smoke test: the first N layers)] [--out rows.jsonl]
        [--profile FIELD=VALUE (the accelerator profile with a field changed, e.g. min_product_rows=8)]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import step_bytes  # noqa: E402
from spec_harness import SHARED, generate_config, load_prompts, parse_setup  # noqa: E402

TARGETS = ("gemma3-270m", "qwen2.5-coder-1.5b-instruct")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare(assets: Path, n_prompts: int) -> None:
    """Writes each target's config.json and tokenizer, and `n_prompts` Spec-Bench dev prompts."""
    from specjax.models import load_model

    for name in TARGETS:
        log(f"loading {name}")
        model, tok = load_model(name)
        write_target(assets / name, model.cfg, tok)
        del model
    rows = load_prompts(per_category=1, humaneval=3, shared=SHARED)
    (assets / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:n_prompts]))


def write_target(folder: Path, cfg, tok) -> None:
    """What a random copy of a target needs: its config and its tokenizer."""
    from specjax.models.loading import config_to_json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config_to_json(cfg))
    tok.save(folder / "tokenizer")


def random_target(folder: Path, layers: int | None, dtype: str = "bfloat16", seed: int = 0):
    """(model, tokenizer): random weights (`dtype`) of the config in `folder`, its real tokenizer."""
    import jax.numpy as jnp
    from flax import nnx

    from specjax.models import Tokenizer, Transformer
    from specjax.models.loading import config_from_json

    cfg = config_from_json((folder / "config.json").read_text())
    if layers:
        cfg = cfg.replace(n_layers=layers, layer_kinds=cfg.layer_kinds[:layers])
    return Transformer(cfg, dtype=jnp.dtype(dtype), rngs=nnx.Rngs(seed)), Tokenizer.load(folder / "tokenizer")


def eagle3_drafter(model):
    """A random EAGLE-3 head as the recipes build it: fused layers 2, L/2, L-3, a 32k draft vocabulary,
    an EAGLE-2 dynamic tree of depth 4, top-4 (k nodes verified)."""
    import numpy as np
    from flax import nnx

    from specjax.decode import EagleDrafter
    from specjax.models import DraftVocab, EagleConfig, EagleHead

    n = model.cfg.n_layers
    fuse = tuple(sorted({min(2, n - 1), n // 2, max(n - 3, 0)}))
    head = EagleHead(EagleConfig.from_target(model.cfg, fuse), dtype=model.dtype, rngs=nnx.Rngs(11))
    vocab = DraftVocab(np.arange(min(32768, model.cfg.vocab_size)), model.cfg.vocab_size)
    return EagleDrafter.build(head, model, vocab, depth=4, top_k=4)


def read_bandwidth_gbps() -> float:
    """Device read GB/s: a jitted sum over a 2 GiB bfloat16 array, median of 10 after a warm-up."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((1 << 30,), jnp.bfloat16)
    f = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    jax.block_until_ready(f(x))
    ts = []
    for _ in range(10):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        ts.append(time.perf_counter() - t)
    return x.nbytes / statistics.median(ts) / 1e9


def measure(name: str, model, tok, prompts: list[dict], args, out) -> list[dict]:
    """Rows for one target: per temperature and batch size, plain and every setup, interleaved reps."""
    from specjax.decode import Generator, SpeculativeGenerator

    plain = Generator(model, tok)
    setups, gens = {}, {}
    for text in args.setups.split(","):
        method, k, *keys = text.split(":")
        # Every round speculative unless the setup says otherwise (its keys come last and win).
        spec = ":".join([method, k, "adaptive=0", "min_best_gain=0", *keys])
        if method == "eagle3":
            drafter, params = eagle3_drafter(model)
            # the drafter passed in replaces the config's method (a checkpoint-less head)
            setups[text] = parse_setup("ngram" + spec.removeprefix("eagle3"))[1]
            gens[text] = SpeculativeGenerator(model, tok, drafter=drafter, draft_params=params)
        else:
            setups[text] = parse_setup(spec)[1]
            gens[text] = SpeculativeGenerator(model, tok)
    rows = []

    def emit(row: dict) -> None:  # rows go out as they finish: a device call cut by its limit keeps them
        rows.append(row)
        out.write(json.dumps(row) + "\n")
        out.flush()

    for temp in [float(t) for t in args.temps.split(",")]:
        for b in [int(x) for x in args.batch.split(",")]:
            texts = [p["prompt"] for p in prompts[:b]]
            cfg = generate_config(args.tokens, b, temp)
            runs = {n: [] for n in ["plain", *setups]}
            compile_s = {}
            for r in range(args.reps + 1):  # rep 0 compiles and warms up; it is not counted
                for n in runs:
                    t = time.perf_counter()
                    outs, st = (plain.generate(texts, cfg) if n == "plain" else gens[n].generate(texts, cfg, setups[n]))
                    if r == 0:
                        compile_s[n] = st.compile_s
                        log(f"{name} T={temp:g} b={b} {n}: compiled in {st.compile_s:.1f} s "
                            f"(call {time.perf_counter() - t:.1f} s)")
                    else:
                        runs[n].append((outs, st))
            base = runs["plain"]
            step_ms = statistics.median(st.ms_per_token for _, st in base)
            emit({"target": name, "T": temp, "batch": b, "setup": "plain", "ms": step_ms, "cost": 1.0, "tau": 1.0,
                  "tok_s": statistics.median(st.tokens_per_s for _, st in base), "compile_s": compile_s["plain"],
                  "same": None})
            plain_tokens = [o.tokens for o in base[0][0]]
            for n in setups:
                sts = [st for _, st in runs[n]]
                ms = statistics.median(st.ms_per_round for st in sts)
                # Greedy: per rep, where each row first differs from plain's tokens (None: equal).
                diffs = ([first_divergence([o.tokens for o in outs], plain_tokens) for outs, _ in runs[n]]
                         if temp == 0 else None)
                same = None if diffs is None else all(d is None for rep in diffs for d in rep)
                first_diff = None if diffs is None else diffs[0]
                row = {"target": name, "T": temp, "batch": b, "setup": n, "ms": ms, "cost": ms / step_ms,
                       "tau": statistics.median(st.tau for st in sts),
                       "plain_rate": statistics.median(st.plain_rate for st in sts),
                       "tok_s": statistics.median(st.tokens_per_s for st in sts),
                       "compile_s": compile_s[n], "same": same, "first_diff": first_diff}
                emit(row)
                log(f"{name} T={temp:g} b={b} {n}: round {ms:.2f} ms = {ms / step_ms:.2f} plain steps "
                    f"({step_ms:.2f} ms); random-weight τ {row['tau']:.2f}; same as plain: {same} "
                    f"(first difference at {first_diff})")
    return rows


def first_divergence(rows_a: list[list[int]], rows_b: list[list[int]]) -> list[int | None]:
    """Per row, the first token index where two greedy runs differ (None: identical)."""
    return [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
            for a, b in zip(rows_a, rows_b, strict=True)]


def table(rows: list[dict], floors: dict) -> str:
    lines = ["| target | T | batch | setup | ms per step / round | cost in plain steps (= break-even τ) | "
             "tok/s (random weights) | compile s | greedy = plain |", "|" + " --- |" * 9]
    for r in rows:
        same = "—" if r["same"] is None else ("yes" if r["same"] else "**no**")
        lines.append(f"| {r['target']} | {r['T']:g} | {r['batch']} | {r['setup']} | {r['ms']:.2f} | {r['cost']:.2f} | "
                     f"{r['tok_s']:.0f} | {r['compile_s']:.1f} | {same} |")
    lines.append("")
    for name, (nbytes, floor_ms) in floors.items():
        lines.append(f"- {name}: weights read per step {nbytes / 1e9:.2f} GB, floor {floor_ms:.3f} ms/step")
    return "\n".join(lines)


def override_profile(items: list[str]) -> None:
    """Replaces fields of the accelerator profile for this process (`profile_for` reads it at trace time)."""
    from specjax.models import backend_profile

    fields = {f.name for f in dataclasses.fields(backend_profile.BackendProfile)} - {"name"}
    for item in items:
        key, _, value = item.partition("=")
        if key not in fields:
            fail(f"--profile: no field {key!r} in BackendProfile (fields: {', '.join(sorted(fields))})")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            fail(f"--profile {item!r}: the value must be JSON (e.g. {key}=8)")
        backend_profile.ACCELERATOR = dataclasses.replace(backend_profile.ACCELERATOR, **{key: parsed})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepare", type=Path)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--assets", type=Path)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--setups", default="ngram:8,lookup:12,recycle:8,eagle3:10")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--temps", default="0")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--out", type=Path, default=Path("accelerator.jsonl"))
    ap.add_argument("--profile", action="append", default=[], metavar="FIELD=VALUE",
                    help="run with this field of the accelerator BackendProfile changed (JSON value; A/B of a setting)")
    args = ap.parse_args()
    override_profile(args.profile)
    if args.prepare:
        prepare(args.prepare, args.prompts)
        return
    if args.assets is None or not (args.assets / "prompts.jsonl").is_file():
        fail("--assets must name a folder written by --prepare")
    prompts = [json.loads(line) for line in (args.assets / "prompts.jsonl").read_text().splitlines()]
    if missing := [t for t in args.targets.split(",") if not (args.assets / t / "config.json").is_file()]:
        fail(f"--targets: no config.json under {args.assets} for {', '.join(missing)}")
    sizes = [b for b in args.batch.split(",") if b.isdigit() and 0 < int(b) <= len(prompts)]
    if args.reps < 1 or args.tokens < 2 or len(sizes) != len(args.batch.split(",")):
        fail(f"--reps must be ≥ 1, --tokens ≥ 2 and each --batch size in [1, {len(prompts)}] (prompts in --assets)")
    import jax

    log(f"jax {jax.__version__}, devices {jax.devices()}, load {os.getloadavg()[0]:.2f}")
    bw = read_bandwidth_gbps()
    log(f"read bandwidth {bw:.0f} GB/s")
    rows, floors = [], {}
    with args.out.open("w") as out:
        for name in args.targets.split(","):
            model, tok = random_target(args.assets / name, args.layers or None, args.dtype)
            nbytes = step_bytes(model)
            floors[name] = (nbytes, nbytes / (bw * 1e9) * 1e3)
            out.write(json.dumps({"target": name, "weight_bytes": nbytes, "read_GBps": bw,
                                  "config": dataclasses.asdict(model.cfg)}) + "\n")
            rows += measure(name, model, tok, prompts, args, out)
            del model
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {args.dtype} random weights, {args.tokens} tokens, "
          f"chat, EOS ignored, medians of {args.reps} warm reps; read bandwidth {bw:.0f} GB/s\n")
    print(table(rows, floors))


if __name__ == "__main__":
    main()
