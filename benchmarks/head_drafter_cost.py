"""Where a head drafter's round goes on Gemma 3 270M: draft (propose) vs the tree's verification forward.

Times, for one row after a prompt of --context tokens (weights random: only cost is measured here,
not acceptance), each piece jitted on its own with weights passed as arguments:

  plain step        one-token target forward + head (what plain decoding pays per token)
  verify k          one target forward over [last, k tree nodes] + head over k+1 rows
  medusa propose    heads + top-k over each head's logits (static tree of k nodes)
  eagle propose     EAGLE-2 growth (depth-1 one-layer forwards over top_k nodes, top_k-row heads)
  eagle observe     one-layer forward over the k+1 observed rows

with the full 262,144-token head and with a reduced draft vocabulary of --vocab tokens (FR-Spec /
EAGLE-3 style). Medians of --reps calls. Numbers on a shared CPU are noisy: compare rows of one run.

    python benchmarks/head_drafter_cost.py [--context 128] [--vocab 32768] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.decode import EagleDrafter, MedusaDrafter, Observation, Prefill
from specjax.decode.spec import trees as tree_lib
from specjax.decode.spec.trees import MEDUSA_63, StaticTree
from specjax.models import DraftVocab, EagleConfig, EagleHead, load_model
from specjax.models.medusa import MedusaConfig, MedusaHeads, randomize


def _median_ms(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _plain_step(model, tok_b1, pos_b, cache):
    hidden, _ = model(tok_b1, pos_b[:, None], cache, pos_b)
    return model.logits(hidden)


def _verify(model, tree, tokens_bk, pos_b, cache):
    parent_bk = tree.parent_bk(tokens_bk.shape[0])
    anc = tree_lib.ancestor_mask(parent_bk)
    block = jnp.concatenate([tokens_bk[:, :1], tokens_bk], axis=1)
    positions = tree_lib.block_positions(pos_b, tree_lib.depths(anc))
    hidden, _ = model(block, positions, cache, pos_b, tree_lib.block_mask(anc))
    return model.logits(hidden)


def _hook(model, drafter, name, params, *args):
    return getattr(drafter, name)(model, params, *args)


def _propose(model, drafter, k, params, ds, pos_b):
    return drafter.propose(model, params, SimpleNamespace(draft_state=ds, pos_b=pos_b), k)[0]


class Jitted:
    """fn(model, *static, *args) jitted with the target's weights as an argument (nnx.jit re-walks the
    whole module graph on every call, which costs seconds for this model on a loaded machine)."""

    def __init__(self, model, fn, n_static: int):
        self.graphdef, self.state = nnx.split(model)
        self.fn, self.n_static = fn, n_static

        def call(state, static, *args):
            return fn(nnx.merge(self.graphdef, state), *static, *args)
        self.jit = jax.jit(call, static_argnums=1)

    def __call__(self, *args):
        return self.jit(self.state, tuple(args[:self.n_static]), *args[self.n_static:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--medusa-nodes", type=int, default=15)
    ap.add_argument("--eagle", default="4,4,10", help="depth,top_k,k")
    args = ap.parse_args()
    model, _ = load_model()
    cfg = model.cfg
    depth, top_k, k_eagle = (int(x) for x in args.eagle.split(","))
    ctx, slots = args.context, args.context + 80
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(3, 20000, size=(1, ctx)), jnp.int32)
    len_b = jnp.array([ctx])
    cache = model.init_cache(1, slots)
    hidden, cache = Jitted(model, lambda m, p, c: m(p, jnp.arange(ctx)[None], c, jnp.zeros((1,), jnp.int32)), 0)(
        prompt, cache)
    plain, verify, hook, propose = (Jitted(model, f, n) for f, n in ((_plain_step, 0), (_verify, 1), (_hook, 2),
                                                                      (_propose, 2)))
    pre = Prefill(tokens_bt=prompt, len_b=len_b, hidden_btd=hidden, first_b=prompt[:, -1], num_slots=slots)
    pos_b = len_b
    rows = []
    rows.append(("plain step (1 row)", _median_ms(plain, prompt[:, :1], pos_b, cache, reps=args.reps)))
    medusa_tree = StaticTree.from_paths(MEDUSA_63[:args.medusa_nodes])
    eagle_tree = StaticTree.from_paths(
        [(0,) * (i + 1) for i in range(depth)] + [(j,) for j in range(1, k_eagle - depth + 1)])
    for name, tree in ((f"verify medusa tree k={medusa_tree.size}", medusa_tree),
                       (f"verify eagle-sized tree k={eagle_tree.size}", eagle_tree)):
        tokens = jnp.asarray(rng.integers(3, 20000, size=(1, tree.size)), jnp.int32)
        rows.append((name, _median_ms(verify, tree, tokens, pos_b, cache, reps=args.reps)))
    vocab = DraftVocab.from_counts(np.ones(cfg.vocab_size), args.vocab, always=cfg.eos_ids)
    medusa = randomize(MedusaHeads(MedusaConfig.from_target(cfg, n_heads=medusa_tree.max_depth)), jax.random.key(0))
    eagle = EagleHead(EagleConfig.from_target(cfg), rngs=nnx.Rngs(0))
    for label, v in (("full vocab", None), (f"draft vocab {args.vocab}", vocab)):
        drafter, params = MedusaDrafter.build(medusa, model, medusa_tree, v)
        ds = hook(drafter, "init", params, pre)
        rows.append((f"medusa propose ({label})",
                     _median_ms(propose, drafter, medusa_tree.size, params, ds, pos_b, reps=args.reps)))
        drafter, params = EagleDrafter.build(eagle, model, v, depth=depth, top_k=top_k)
        ds = hook(drafter, "init", params, pre)
        rows.append((f"eagle propose d={depth} top_k={top_k} k={k_eagle} ({label})",
                     _median_ms(propose, drafter, k_eagle, params, ds, pos_b, reps=args.reps)))
    obs = Observation(tokens_bt=prompt[:, :k_eagle + 1], hidden_btd=hidden[:, :k_eagle + 1],
                      n_b=jnp.array([3]), pos_b=pos_b)
    rows.append((f"eagle observe ({k_eagle + 1} rows)", _median_ms(hook, drafter, "observe", params, ds, obs,
                                                                   reps=args.reps)))
    base = rows[0][1]
    print(f"Gemma 3 270M, batch 1, context {ctx}, median of {args.reps}; ratio = / plain step")
    for name, ms in rows:
        print(f"  {name:<52s} {ms:8.1f} ms  {ms / base:5.2f}x")


if __name__ == "__main__":
    main()
