"""Model-based chain drafters on Gemma 3 270M: layer skipping (early exit after N of 18 layers, full or
reduced draft vocabulary) and a separate draft model, vs plain greedy decoding in the same run.

Per configuration: tok/s and its ratio to plain specjax, tau (tokens per target forward, counting the
correction/bonus token), acceptance by draft position, ms per round, and whether the greedy tokens equal
plain greedy's (a divergence is reported with the plain top-2 logit margin at its first position).
The n-gram drafter at the same k is listed as the "free draft" baseline: its ms/round is the verify
forward alone, so a model drafter's extra ms/round is its k draft steps.

    python benchmarks/model_drafters.py [--new-tokens 96] [--k 4] [--layers 2,4,6] [--vocab 0,16384,32768]
                                        [--prompts 3] [--reps 1]
    python benchmarks/model_drafters.py --agreement   # how often early exit after N layers = the full argmax
    python benchmarks/model_drafters.py --profile     # plain step vs one draft step vs the verify forward

Prompts: the first `--prompts` of ../shared/data/prompts/alpaca_80.jsonl (chat template), and with
--code-edit the code-edit prompt of benchmarks/speculative.py (input-grounded). The reduced draft
vocabulary: the most frequent ids of gsm8k_train + alpaca_eval + alpaca_seed_tasks (prompts and
references; not alpaca_80).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from verify_cost import medians  # this folder's timing helper (run as a script)

from specjax.decode import GenerateConfig, Generator, LayerSkipDrafter, NgramDrafter, SpecConfig, SpeculativeGenerator
from specjax.decode.spec.drafters.chain import forward_layers, head_logits, reduced_head
from specjax.decode.spec.drafters.draft_model import DraftModelDrafter, slice_model
from specjax.decode.spec.drafters.registry import corpus_texts
from specjax.models import DraftVocab, load_model
from specjax.models.kv_cache import attention_masks, causal_block_mask

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "prompts"
CORPUS = ("gsm8k_train.jsonl", "alpaca_eval.jsonl", "alpaca_seed_tasks.jsonl")


def bench_prompts(n: int, tok, code_edit: bool) -> list[str]:
    rows = [json.loads(line)["prompt"] for line in (DATA / "alpaca_80.jsonl").read_text().splitlines()[:n]]
    chat = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in rows]
    if not code_edit:
        return chat
    code = (Path(json.__file__).parent / "encoder.py").read_text()[2000:3200]
    return [*chat, f"Here is some Python code:\n\n{code}\n\nHere is the same code with the comments removed:\n\n"]


def token_counts(tok, vocab: int) -> np.ndarray:
    counts = np.zeros((vocab,), np.int64)
    for name in CORPUS:
        for text in corpus_texts(DATA / name):
            counts += np.bincount(np.asarray(tok.encode(text, add_bos=False)), minlength=vocab)
    return counts


def top2_margin(model, ids: list[int]) -> float:
    """Plain greedy's top-2 logit margin for the token after `ids` (uncached forward)."""
    x = jnp.asarray([ids])
    logits = np.asarray(model.logits(model(x, jnp.arange(len(ids))[None])[0][:, -1:])[0, 0])
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def agreement(model, prompts, tok, new_tokens: int) -> None:
    """Fraction of plain greedy's tokens that early exit after N layers (+ final norm and head) predicts."""
    outs, _ = Generator(model, tok).generate(prompts, GenerateConfig(max_new_tokens=new_tokens, ignore_eos=True))

    @jax.jit
    def exits(ids_1t):
        t = ids_1t.shape[1]
        pos_1t = jnp.arange(t)[None]
        glob, loc = attention_masks(pos_1t, jnp.zeros((1,), jnp.int32), t, causal_block_mask(t)[None],
                                    model.cfg.sliding_window)
        x_1td, preds = model.embed_tokens(ids_1t), []
        for block in model.blocks:
            x_1td, _ = block(x_1td, pos_1t, loc if block.kind == "local" else glob, None, None)
            preds.append(jnp.argmax(model.logits(model.final_norm(x_1td)), -1)[0])
        return jnp.stack(preds)

    hits, n = np.zeros(model.cfg.n_layers), 0
    for p, o in zip(prompts, outs, strict=True):
        ids = tok.encode(p) + o.tokens
        start = len(ids) - len(o.tokens)
        pred_lt = np.asarray(exits(jnp.asarray([ids])))
        hits += (pred_lt[:, start - 1:-1] == np.asarray(o.tokens)[None]).sum(axis=1)
        n += len(o.tokens)
    print("| N | " + " | ".join(str(i + 1) for i in range(model.cfg.n_layers)) + " |")
    print("|---" * (model.cfg.n_layers + 1) + "|")
    print("| agreement | " + " | ".join(f"{h / n:.2f}" for h in hits) + " |")


def profile(model, tok, layers, vocab: int, k: int, reps: int = 15) -> None:
    """Median times of one plain step, one layer-skip draft step and the (k+1)-row verify forward, interleaved."""
    graphdef, params = nnx.split(model)
    ids = jnp.asarray([tok.encode("The theory of general relativity, published by Albert Einstein in 1915, explains "
                                  "gravity as a curvature of spacetime caused by mass and energy, and")])
    pos_b = jnp.asarray([ids.shape[1]], jnp.int32)
    _, cache = model(ids, jnp.arange(ids.shape[1])[None], model.init_cache(1, 256), jnp.zeros((1,), jnp.int32))
    tok_b = jnp.asarray([107], jnp.int32)

    @jax.jit
    def plain(params, cache):
        m = nnx.merge(graphdef, params)
        hidden, _ = m(tok_b[:, None], pos_b[:, None], cache, pos_b)
        return jnp.argmax(m.logits(jax.lax.optimization_barrier(hidden), live=pos_b[0])[:, 0], -1)

    @functools.partial(jax.jit, static_argnames="n")
    def draft(params, head, cache, n):
        m, kept = nnx.merge(graphdef, params), tuple(range(n))
        hidden, kv_k, _ = forward_layers(m, kept, tuple(cache.k[i] for i in kept), tuple(cache.v[i] for i in kept),
                                         tok_b[:, None], pos_b[:, None], pos_b)
        return jnp.argmax(head_logits(m, head, hidden[:, 0], pos_b[0]), -1), kv_k

    def block_forward(m, cache):
        return m(jnp.full((1, k + 1), 107, jnp.int32), pos_b[:, None] + jnp.arange(k + 1)[None], cache, pos_b)

    @jax.jit
    def verify(params, cache):  # what a greedy round runs: block forward + the target's argmax
        m = nnx.merge(graphdef, params)
        return m.greedy_tokens(block_forward(m, cache)[0])

    @jax.jit
    def verify_body(params, cache):
        return block_forward(nnx.merge(graphdef, params), cache)

    hidden_k = block_forward(model, cache)[0]

    @jax.jit
    def verify_head(params, hidden):
        return nnx.merge(graphdef, params).greedy_tokens(hidden)

    head = reduced_head(model, np.arange(vocab))  # the timing does not depend on which ids
    fns = {"plain step (18 layers + int8 head)": lambda: plain(params, cache),
           f"verify forward, {k + 1} rows, + argmax (int8 head blocks)": lambda: verify(params, cache),
           f"  of which: decoder over {k + 1} rows + cache write": lambda: verify_body(params, cache),
           f"  of which: head argmax over {k + 1} rows": lambda: verify_head(params, hidden_k)}
    for n in layers:
        fns[f"draft step N={n}, full int8 head"] = functools.partial(draft, params, None, cache, n=n)
        fns[f"draft step N={n}, {vocab} head"] = functools.partial(draft, params, head, cache, n=n)
    times = medians(fns, reps)
    base = times["plain step (18 layers + int8 head)"]
    print("| program | median ms | / plain step |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {t * 1e3:.1f} | {t / base:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--layers", default="2,4,6")
    ap.add_argument("--vocab", default="0,16384,32768", help="draft vocabulary sizes (0 = full)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--code-edit", action="store_true", help="add benchmarks/speculative.py's code-edit prompt")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--draft-slice", type=int, default=2, help="layers of the sliced 'separate' draft model (0: skip)")
    ap.add_argument("--agreement", action="store_true", help="only measure early-exit agreement per N")
    ap.add_argument("--profile", action="store_true", help="only time plain / draft / verify programs")
    args = ap.parse_args()
    model, tok = load_model()
    prompts = bench_prompts(args.prompts, tok, args.code_edit)
    if args.agreement:
        return agreement(model, prompts, tok, args.new_tokens)
    if args.profile:
        vocab = max(int(x) for x in args.vocab.split(","))
        return profile(model, tok, [int(x) for x in args.layers.split(",")], vocab or 16_384, args.k)
    cfg = GenerateConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    counts = token_counts(tok, model.cfg.vocab_size)

    configs = [("ngram", NgramDrafter(), ())]
    for n in (int(x) for x in args.layers.split(",")):
        for v in (int(x) for x in args.vocab.split(",")):
            params = () if v == 0 else reduced_head(model, DraftVocab.from_counts(counts, v, model.cfg.eos_ids))
            configs.append((f"layerskip N={n}" + (f" vocab {v}" if v else ""), LayerSkipDrafter.early_exit(n), params))
    if args.draft_slice:
        d, p = DraftModelDrafter.create(slice_model(model, range(args.draft_slice)), model)
        configs.append((f"draft model = layers 0-{args.draft_slice - 1} (own cache)", d, p))

    plain = Generator(model, tok)
    spec = SpecConfig(k=args.k, adaptive=False)
    results = {name: [] for name, _, _ in configs}
    gens = {name: SpeculativeGenerator(model, tok, drafter, params) for name, drafter, params in configs}
    for pi, prompt in enumerate(prompts):
        plain.generate([prompt], cfg)  # compile
        ref = plain.generate([prompt], cfg)[0][0].tokens
        for v in (int(x) for x in args.vocab.split(",")):
            if v:
                kept = DraftVocab.from_counts(counts, v, model.cfg.eos_ids)
                print(f"prompt {pi}: vocab {v} covers {np.isin(ref, kept.ids_n).mean():.1%} of plain greedy's tokens",
                      file=sys.stderr)
        for name, gen in gens.items():
            gen.generate([prompt], cfg, spec)  # compile
            # Plain and speculative runs alternate, so that both see the same (shared, noisy) machine.
            runs, base_tps = [], []
            for _ in range(args.reps):
                base_tps.append(plain.generate([prompt], cfg)[1].tokens_per_s)
                runs.append(gen.generate([prompt], cfg, spec))
            base = statistics.median(base_tps)
            out, st = runs[-1]
            tps = statistics.median(s.tokens_per_s for _, s in runs)
            got = out[0].tokens
            first = next((i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b), None)
            margin = None if first is None else top2_margin(model, tok.encode(prompt) + ref[:first])
            results[name].append((base, tps, st.tau, st.acceptance_by_position, st.ms_per_round, first, margin))
            print(f"prompt {pi} {name}: {tps / base:.2f}x tau {st.tau:.2f} {st.ms_per_round:.1f} ms/round "
                  f"(plain {1000 / base:.1f} ms/token) diverges at {first} margin {margin}", file=sys.stderr)

    print(f"| drafter (k={args.k}, {args.new_tokens} tokens, {len(prompts)} prompts) | speedup vs plain | tau "
          "| acceptance by position | ms/round | plain ms/token | = plain greedy |\n|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        speed = statistics.mean(r[1] / r[0] for r in rows)
        tau = statistics.mean(r[2] for r in rows)
        acc = np.mean([r[3] for r in rows], axis=0)
        same = sum(r[5] is None for r in rows)
        ties = [f"{r[6]:.3f}" for r in rows if r[5] is not None]
        print(f"| {name} | {speed:.2f}x | {tau:.2f} | {' '.join(f'{a:.2f}' for a in acc)} | "
              f"{statistics.mean(r[4] for r in rows):.1f} | {statistics.mean(1000 / r[0] for r in rows):.1f} | "
              f"{same}/{len(rows)}" + (f" (diverged at margins {', '.join(ties)})" if ties else "") + " |")


if __name__ == "__main__":
    main()
