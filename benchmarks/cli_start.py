"""How long `python -m specjax.decode` takes to start, phase by phase, warm caches (issue 15).

Each repetition runs the CLI in a fresh process (the way a user runs it) and timestamps its progress lines as
they arrive: to the first line (Python, JAX and Hydra imported), to "model ready" (weights loaded and laid out),
to the answer (programs traced and loaded from the compile cache, prompt decoded) and to the process's exit.
Several source trees (`--trees`, e.g. a worktree of the previous commit) and llama.cpp (`--lcpp`, the same GGUF
through llama-cpp-python: import, load, the same number of tokens) run interleaved, one repetition of each in
turn, so load on a shared machine hits them alike. Caches must be warm: run once first (conversion, layout and
compiles are one-off costs the README reports apart).

    python benchmarks/cli_start.py --models gemma3-270m,qwen2.5-coder-1.5b-instruct --trees .,/tmp/old --reps 3
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a haiku about the sea."
PHASES = ("first line", "model ready", "answer", "exit")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_cli(tree: Path, model: str, new_tokens: int) -> dict[str, float]:
    """Seconds from the process start to each phase of one CLI run in source tree `tree`."""
    cmd = [sys.executable, "-u", "-m", "specjax.decode", f"model={model}", f"prompt={PROMPT}",
           f"max_new_tokens={new_tokens}"]
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}
    line = ""
    for line in proc.stdout:
        now = time.perf_counter() - t0
        seen.setdefault("first line", now)
        if "model ready" in line:
            seen["model ready"] = now
        if line.startswith("stats:"):
            seen["answer"] = now
    if proc.wait() != 0:
        fail(f"{model} in {tree}: the CLI exited with {proc.returncode} ({line.strip()})")
    seen["exit"] = time.perf_counter() - t0
    return seen


LCPP = """
import sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
from specjax.models import registry
path = str(registry.resolve(sys.argv[1], lambda s: None)) if sys.argv[1] in registry.MODELS else None
if path is None:
    from specjax.models.loading import default_model_path
    path = str(default_model_path())
llm = Llama(model_path=path, n_threads=int(sys.argv[3]), n_ctx=512, verbose=False)
ready = time.perf_counter() - t0
llm(sys.argv[4], max_tokens=int(sys.argv[2]), temperature=0.0)
print(ready, time.perf_counter() - t0)
"""


def run_lcpp(model: str, new_tokens: int, threads: int) -> dict[str, float]:
    """The same phases for llama-cpp-python (import and load as "model ready"; no separate first line)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", LCPP, model, str(new_tokens), str(threads), PROMPT],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"llama-cpp-python failed on {model}: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    ready, answer = map(float, out.stdout.split()[-2:])
    return {"model ready": ready, "answer": answer, "exit": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gemma3-270m")
    ap.add_argument("--trees", default=".", help="comma-separated source trees (the first is the one reported "
                                                   "as 'new' in ratios)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--lcpp", type=int, default=0, help="also llama-cpp-python with this many threads (0: no)")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.new_tokens < 1 or args.lcpp < 0:
        fail("--reps and --new-tokens must be ≥ 1, --lcpp ≥ 0")
    if args.lcpp and importlib.util.find_spec("llama_cpp") is None:
        fail("--lcpp: llama-cpp-python is not importable here (benchmarks/README.md says how to build it)")
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    for t in trees:
        if not (t / "specjax" / "decode").is_dir():
            fail(f"--trees: {t} is not a specjax source tree")
    setups = [(m, str(t)) for m in args.models.split(",") for t in trees]
    setups += [(m, f"llama.cpp {args.lcpp} threads") for m in args.models.split(",")] if args.lcpp else []
    times: dict[tuple[str, str], list[dict[str, float]]] = {s: [] for s in setups}
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    for rep in range(args.reps):
        for model, who in setups:
            r = (run_lcpp(model, args.new_tokens, args.lcpp) if who.startswith("llama.cpp")
                 else run_cli(Path(who), model, args.new_tokens))
            times[(model, who)].append(r)
            print(f"rep {rep} {model} {who}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}\n")
    print("| model | source | " + " | ".join(f"to {p} (s)" for p in PHASES) + " |")
    print("| --- | --- |" + " --- |" * len(PHASES))
    for (model, who), runs in times.items():
        cells = [f"{statistics.median(r[p] for r in runs):.2f}" if all(p in r for r in runs) else "—"
                 for p in PHASES]
        print(f"| {model} | {who} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
