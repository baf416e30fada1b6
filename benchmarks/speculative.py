"""Speculative decoding vs plain decoding on Gemma 3 270M, with HF transformers and llama.cpp in the same run.

For every prompt set, batch size, temperature and method: tokens/s (median over reps of the whole generate
call over the set), speedup over plain specjax decoding measured in the same loop, tau (tokens per target
forward, COUNTING the correction/bonus token), acceptance by draft position, the share of plain one-token
rounds and the mean draft length adaptive drafting chose, and (T=0) whether the tokens equal plain greedy's.

    python benchmarks/speculative.py [--sets grounded,dev] [--methods ngram,layerskip,...] [--k 4,8]
                                     [--batch 1,8] [--temps 0,1] [--new-tokens 128] [--reps 2] [--peers]
    methods: ngram | layerskip (--layers N, --draft-vocab N) | draft (--draft-model PATH) |
             medusa (--medusa-checkpoint RUN) | eagle (--eagle-checkpoint RUN, --eagle-depth, --eagle-top-k);
             for medusa/eagle, --k is the token tree's node count

Prompt sets (chat template applied; instructions for an instruction-tuned model):
  grounded  input-grounded tasks built from text every Python install has (the standard library's
            sources and docstrings): code-edit, summarise, rewrite, extract.
  dev       the first --n-dev prompts of ../shared/data/prompts/alpaca_80.jsonl (EAGLE's evaluation
            set; the training issue keeps it out of its training data).
Peers (--peers; batch 1, T=0, same token ids): HF transformers greedy and prompt-lookup decoding
(prompt_lookup_num_tokens=10), float32, torch threads = --hf-threads; llama.cpp greedy (Q4_K_M,
n_threads = --lcpp-threads). Setups run interleaved per repetition so machine noise hits them alike.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import statistics
import textwrap
import time
from pathlib import Path

from specjax.decode import GenerateConfig, Generator, SamplingConfig, SpecConfig, SpeculativeGenerator
from specjax.models.loading import default_model_path, load_model

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "prompts"


def grounded_prompts() -> dict[str, str]:
    """Tasks whose answers copy from their input: where prompt lookup should shine."""
    code = (Path(json.__file__).parent / "encoder.py").read_text()[2000:3200]
    doc = inspect.getdoc(textwrap) + "\n\n" + inspect.getdoc(textwrap.TextWrapper)[:900]
    para = inspect.getdoc(statistics)[:1200]
    csv_doc = inspect.getdoc(__import__("csv"))[:1000]
    return {
        "code-edit": f"Here is some Python code:\n\n{code}\n\nRewrite the same code with the comments removed.",
        "summarise": f"Summarise the following documentation in a few sentences.\n\n{doc}",
        "rewrite": f"Rewrite the following text as a bulleted list, keeping its wording.\n\n{para}",
        "extract": f"List every function and class name mentioned in this text, one per line.\n\n{csv_doc}",
    }


def dev_prompts(n: int) -> dict[str, str]:
    rows = [json.loads(line) for line in (SHARED / "alpaca_80.jsonl").read_text().splitlines()[:n]]
    return {r["id"]: r["prompt"] for r in rows}


def method_setup(name: str, model, tok, k: int, args) -> tuple[SpeculativeGenerator, SpecConfig]:
    """(generator, config) of a speculative method; the drafter's own options come from args."""
    extra = {
        "ngram": {},
        "layerskip": {"layers": args.layers, "draft_vocab": args.draft_vocab,
                      "draft_vocab_corpus": args.draft_vocab_corpus if args.draft_vocab else None},
        "draft": {"draft_model": args.draft_model},
        "medusa": {"draft_checkpoint": args.medusa_checkpoint},
        "eagle": {"draft_checkpoint": args.eagle_checkpoint, "eagle_depth": args.eagle_depth,
                  "eagle_top_k": args.eagle_top_k},
    }
    if name not in extra:
        raise SystemExit(f"unknown method {name!r} (available: {', '.join(extra)})")
    cfg = SpecConfig(k=k, method=name, adaptive=not args.no_adaptive, min_expected_accept=args.min_expected_accept,
                     probe_every=args.probe_every, min_best_gain=args.min_best_gain, **extra[name])
    return SpeculativeGenerator(model, tok), cfg


def median_run(fn, reps: int):
    runs = [fn() for _ in range(reps)]
    return runs[-1], statistics.median(r[1].tokens_per_s for r in runs)


def specjax_rows(model, tok, sets: dict[str, dict[str, str]], args) -> list[dict]:
    plain = Generator(model, tok)
    rows = []
    for set_name, prompts in sets.items():
        texts = list(prompts.values())
        for b in [int(x) for x in args.batch.split(",")]:
            for temp in [float(x) for x in args.temps.split(",")]:
                cfg = GenerateConfig(max_new_tokens=args.new_tokens, batch_size=b, ignore_eos=True, chat=True,
                                     sampling=SamplingConfig(temperature=temp, seed=0))
                setups = {"plain": (plain, None)}
                for m in args.methods.split(","):
                    for k in [int(x) for x in args.k.split(",")]:
                        setups[f"{m} k={k}"] = method_setup(m, model, tok, k, args)
                for gen, sc in setups.values():  # compile outside the timing
                    gen.generate(texts, cfg) if sc is None else gen.generate(texts, cfg, sc)
                results = {name: [] for name in setups}
                for _rep in range(args.reps):  # interleaved: noise hits every setup alike
                    for name, (gen, sc) in setups.items():
                        results[name].append(gen.generate(texts, cfg) if sc is None else gen.generate(texts, cfg, sc))
                base_out = results["plain"][-1][0]
                base = statistics.median(s.tokens_per_s for _, s in results["plain"])
                for name, runs in results.items():
                    out, st = runs[-1]
                    tps = statistics.median(s.tokens_per_s for _, s in runs)
                    rows.append({
                        "set": set_name, "batch": b, "T": temp, "setup": name, "tok_s": tps, "speedup": tps / base,
                        "tau": getattr(st, "tau", 1.0), "acc": getattr(st, "acceptance_by_position", ()),
                        "plain_rate": getattr(st, "plain_rate", 1.0), "mean_draft": getattr(st, "mean_draft_len", 0.0),
                        "same": None if temp > 0 else [o.tokens for o in out] == [o.tokens for o in base_out],
                        "ms_round": getattr(st, "ms_per_round", st.ms_per_token),
                    })
                for gen, _ in setups.values():  # a sweep compiles more programs than a process can map
                    gen.release_programs()
    return rows


def speed_cells(r: dict) -> str:
    """The table cells tok/s | speedup | tau | acceptance | plain rounds of one `specjax_rows` row."""
    return (f"{r['tok_s']:.1f} | {r['speedup']:.2f}x | {r['tau']:.2f} | {' '.join(f'{a:.2f}' for a in r['acc'])} | "
            f"{r['plain_rate']:.0%}")


def same_cell(r: dict) -> str:
    """Whether a greedy row's tokens equal plain greedy's ("—" when sampling)."""
    return "—" if r["same"] is None else ("yes" if r["same"] else "NO")


def peer_rows(tok, sets: dict[str, dict[str, str]], args, model, spec_best: str) -> list[dict]:
    """Batch 1, greedy: HF greedy / prompt lookup and llama.cpp greedy on the same token ids, interleaved
    with specjax plain and `spec_best` (a method setup name such as 'ngram k=8')."""
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=args.lcpp_threads, n_threads_batch=args.lcpp_threads,
                verbose=False)
    n = args.new_tokens
    m, k = spec_best.split(" k=")
    spec_gen, spec_cfg = method_setup(m, model, tok, int(k), args)
    plain = Generator(model, tok)
    cfg = GenerateConfig(max_new_tokens=n, batch_size=1, ignore_eos=True, chat=True)

    def hf_run(ids, **kw):
        torch.set_num_threads(args.hf_threads)
        with torch.inference_mode():
            x = torch.tensor([ids])
            t = time.perf_counter()
            out = hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, top_p=None, top_k=None,
                              pad_token_id=0, **kw)
            return out[0, len(ids):].tolist(), time.perf_counter() - t

    def lcpp_run(ids):
        llm.reset()
        t, new = time.perf_counter(), []
        for tkn in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            new.append(tkn)
            if len(new) >= n:
                break
        return new, time.perf_counter() - t

    def sj_run(gen, sc, text):
        t = time.perf_counter()
        out, _ = gen.generate([text], cfg) if sc is None else gen.generate([text], cfg, sc)
        return out[0].tokens, time.perf_counter() - t

    rows = []
    for set_name, prompts in sets.items():
        texts = list(prompts.values())
        ids = [plain.encode([t], chat=True)[0] for t in texts]
        setups = {
            "specjax plain": lambda i, texts=texts: sj_run(plain, None, texts[i]),
            f"specjax {spec_best}": lambda i, texts=texts: sj_run(spec_gen, spec_cfg, texts[i]),
            "HF greedy": lambda i, ids=ids: hf_run(ids[i]),
            "HF prompt lookup (10)": lambda i, ids=ids: hf_run(ids[i], prompt_lookup_num_tokens=10),
            "llama.cpp greedy": lambda i, ids=ids: lcpp_run(ids[i]),
        }
        for name, fn in setups.items():  # warm-up; specjax compiles once per prompt-length bucket: every prompt
            for i in range(len(texts) if name.startswith("specjax") else 1):
                fn(i)
        times = {s: [] for s in setups}
        tokens = {s: [] for s in setups}
        for rep in range(args.reps):
            for name, fn in (setups.items() if rep % 2 == 0 else reversed(setups.items())):
                total_t, outs = 0.0, []
                for i in range(len(texts)):
                    toks, dt = fn(i)
                    total_t += dt
                    outs.append(toks[:n])
                times[name].append(len(texts) * n / total_t)
                tokens[name] = outs
        ref = tokens["specjax plain"]
        for name in setups:
            same = sum(a == b for a, b in zip(tokens[name], ref, strict=True))
            rows.append({"set": set_name, "setup": name, "tok_s": statistics.median(times[name]),
                         "same": f"{same}/{len(ref)}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="grounded,dev")
    ap.add_argument("--n-dev", type=int, default=8)
    ap.add_argument("--methods", default="ngram")
    ap.add_argument("--k", default="4,8", help="comma list of draft lengths (tree methods: node counts)")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--min-expected-accept", type=float, default=SpecConfig.min_expected_accept)
    ap.add_argument("--no-adaptive", action="store_true", help="speculate every round")
    ap.add_argument("--min-best-gain", type=float, default=SpecConfig.min_best_gain,
                    help="speculation off when a fully accepted round would gain less (0: never off)")
    ap.add_argument("--probe-every", type=int, default=SpecConfig.probe_every,
                    help="costly drafters: a speculative probe round after this many plain rounds")
    ap.add_argument("--layers", type=int, default=15, help="layerskip: early exit after N layers")
    ap.add_argument("--draft-vocab", type=int, default=0, help="layerskip: reduced draft vocabulary size")
    ap.add_argument("--draft-vocab-corpus", default=str(SHARED / "alpaca_eval.jsonl"))
    ap.add_argument("--draft-model", default=None, help="draft: a .gguf, HF directory or specjax training run")
    ap.add_argument("--medusa-checkpoint", default=None, help="medusa: a specjax.train run directory")
    ap.add_argument("--eagle-checkpoint", default=None, help="eagle: a specjax.train run directory")
    ap.add_argument("--eagle-depth", type=int, default=4)
    ap.add_argument("--eagle-top-k", type=int, default=4)
    ap.add_argument("--peers", action="store_true", help="also HF transformers and llama.cpp (batch 1, T=0)")
    ap.add_argument("--peer-method", default="ngram k=8")
    ap.add_argument("--hf-threads", type=int, default=2)
    ap.add_argument("--lcpp-threads", type=int, default=1)
    args = ap.parse_args()
    model, tok = load_model()
    all_sets = {"grounded": grounded_prompts(), "dev": dev_prompts(args.n_dev)}
    sets = {s: all_sets[s] for s in args.sets.split(",")}
    rows = specjax_rows(model, tok, sets, args)
    print(f"### Speculative decoding, Gemma 3 270M, {args.new_tokens} new tokens — {datetime.date.today()}, "
          f"load avg {os.getloadavg()[0]:.1f}\n\n`python benchmarks/speculative.py --sets {args.sets} "
          f"--methods {args.methods} --k {args.k} --batch {args.batch} --temps {args.temps} --reps {args.reps}"
          f"{' --no-adaptive' if args.no_adaptive else ''}`\n\n"
          "| set | batch | T | setup | tok/s | speedup vs plain | tau | acceptance by position | plain rounds "
          "| mean draft | ms/round | = plain greedy |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['set']} | {r['batch']} | {r['T']:g} | {r['setup']} | {speed_cells(r)} | "
              f"{r['mean_draft']:.2f} | {r['ms_round']:.1f} | {same_cell(r)} |")
    if args.peers:
        prow = peer_rows(tok, sets, args, model, args.peer_method)
        print(f"\nPeers, batch 1, greedy, HF torch threads {args.hf_threads}, llama.cpp n_threads "
              f"{args.lcpp_threads}:\n\n| set | setup | tok/s | tokens = specjax plain |\n|---|---|---|---|")
        for r in prow:
            print(f"| {r['set']} | {r['setup']} | {r['tok_s']:.1f} | {r['same']} |")


if __name__ == "__main__":
    main()
