"""Batch-8 greedy decoding on one device vs ('data', 'model') meshes of forced CPU devices.

On CPU the forced devices share the machine's cores, so a mesh cannot be faster here: this
measures the overhead of the partitioned program (collectives, per-device dispatch) and checks
that every mesh produces the one-device tokens. Setups are interleaved per repetition (order
reversed on odd ones) so that load from other processes hits all alike; medians are reported.

    PYTHONPATH=. python benchmarks/mesh.py                     # real Gemma 3 270M, mesh 2x4
    PYTHONPATH=. python benchmarks/mesh.py --model gemma-shape --layers 6 --vocab 16384 --meshes 8x1,4x2,2x4

`--model gemma-shape` is a random model with Gemma 3 270M's layer shapes (d_model 640, 4 heads,
1 kv head of 256, MLP 2048) but fewer layers and a smaller vocabulary: every 'data' replica
holds a full copy of the weights, and the real model's 1.1 GB (float32) times 8 does not fit
next to other work on a small machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
           "Repeat exactly: red, green, blue, red, green, blue, red, green,", "1, 2, 3, 4, 5,",
           "Photosynthesis is the process by which", "def fibonacci(n):",
           "Q: What is the boiling point of water?\nA:", "Once upon a time"]


class ModTokenizer:
    """The real tokenizer with ids folded into a smaller vocabulary (for `--model gemma-shape`)."""

    def __init__(self, tokenizer, vocab: int):
        self.tokenizer, self.vocab = tokenizer, vocab

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return [i % self.vocab for i in self.tokenizer.encode(text, add_bos)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def token_bytes(self) -> list[bytes]:
        return self.tokenizer.token_bytes()[:self.vocab]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("real", "gemma-shape"), default="real")
    p.add_argument("--layers", type=int, default=6, help="gemma-shape: decoder layers")
    p.add_argument("--vocab", type=int, default=16384, help="gemma-shape: vocabulary size")
    p.add_argument("--meshes", default="2x4", help="comma-separated DATAxMODEL shapes, e.g. 8x1,4x2")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    shapes = [tuple(int(x) for x in m.split("x")) for m in args.meshes.split(",")]
    devices = max(d * m for d, m in shapes)
    # XLA reads the device count once, when jax initialises: set it before the first import.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    from flax import nnx

    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.models import sharding as sh
    from specjax.models.loading import load_model
    from specjax.models.transformer import Transformer

    model, tok = load_model(None)
    if args.model == "gemma-shape":
        cfg = model.cfg.replace(n_layers=args.layers, layer_kinds=model.cfg.layer_kinds[:args.layers],
                                vocab_size=args.vocab)
        model, tok = Transformer(cfg, rngs=nnx.Rngs(0)), ModTokenizer(tok, args.vocab)
    rules = sh.with_rules(kv_heads=None)  # one kv head
    gens = {"1dev": Generator(model, tok)}
    for d, m in shapes:
        gens[f"{d}x{m}"] = Generator(model, tok, mesh=sh.make_mesh(d, m), rules=rules)
    cfg = GenerateConfig(max_new_tokens=args.new_tokens, batch_size=8, ignore_eos=True)
    tokens = {}
    for name, gen in gens.items():  # compile (and keep the tokens of the first call)
        out, _ = gen.generate(PROMPTS, cfg)
        tokens[name] = [c.tokens for c in out]
        print(f"compiled {name}", file=sys.stderr, flush=True)
    rates: dict[str, list[float]] = {name: [] for name in gens}
    for rep in range(args.reps):
        order = list(gens) if rep % 2 == 0 else list(gens)[::-1]
        for name in order:
            _, stats = gens[name].generate(PROMPTS, cfg)
            assert stats.compiled == 0, f"{name} recompiled"
            rates[name].append(stats.tokens_per_s)
    load = os.getloadavg()[0]
    base = statistics.median(rates["1dev"])
    print(f"{args.model} ({model.cfg.n_layers} layers, vocab {model.cfg.vocab_size}), batch 8, "
          f"{args.new_tokens} new tokens, {args.reps} reps, load average {load:.1f}, {time.strftime('%Y-%m-%d %H:%M')}")
    print("| setup | tok/s (median) | vs 1 device | same tokens as 1 device |")
    print("| --- | --- | --- | --- |")
    for name, r in rates.items():
        med = statistics.median(r)
        print(f"| {name} | {med:.1f} | {med / base:.2f}x | {tokens[name] == tokens['1dev']} |")


if __name__ == "__main__":
    main()
