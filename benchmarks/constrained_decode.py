"""benchmarks/constrained_decode.py — JSON-Schema-constrained vs free generation on Gemma 3 270M.

Same prompts, same max_new_tokens, batch 1 (the int8 one-row head path) and optionally larger batches.
Free generation ignores EOS (every row runs to the limit); constrained generation stops where the schema's
value is complete, so the comparison is decode tokens/s (tokens after the first / time after the first
token), paired per prompt and repetition with the order alternating. Every constrained output is validated
with `jsonschema`; rows cut by the length limit are counted apart (not complete instances).

    python benchmarks/constrained_decode.py                  # 3 reps, 96 new tokens, batch 1
    python benchmarks/constrained_decode.py --reps 1 --new-tokens 32 --batch 1,4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jsonschema

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "category": {"enum": ["apparel", "footwear", "electronics", "home", "toys"]},
        "price_cents": {"type": "integer", "minimum": 0},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "category", "price_cents", "in_stock"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe a pair of trail running shoes as a JSON object with name, category, price_cents, in_stock and tags.",
    "Write a JSON record for a kitchen blender (fields: name, category, price_cents, in_stock, tags).",
    "Give me a product entry in JSON for a wooden toy train.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--batch", default="1")
    a = ap.parse_args()
    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.decode.grammar_spec import GrammarSpec
    from specjax.models.loading import load_model

    model, tok = load_model(None)
    gen = Generator(model, tok)
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    t0 = time.perf_counter()
    gen._grammar_tables(spec, lambda m: print(m, file=sys.stderr))
    print(f"schema compiled in {time.perf_counter() - t0:.1f} s (disk cache: later runs load it)", file=sys.stderr)
    for batch in [int(b) for b in a.batch.split(",")]:
        free = GenerateConfig(max_new_tokens=a.new_tokens, batch_size=batch, chat=True, ignore_eos=True)
        constrained = GenerateConfig(max_new_tokens=a.new_tokens, batch_size=batch, chat=True, grammar=spec)
        prompts_for = lambda p, n=batch: [p] * n  # noqa: E731 - every row the same prompt: equal work per row
        for cfg in (free, constrained):  # compile both programs outside the timings
            gen.generate(prompts_for(PROMPTS[0]), cfg)
        ratios, rates = [], {"free": [], "constrained": []}
        valid = cut = invalid = 0
        for rep in range(a.reps):
            for p in PROMPTS:
                order = [("free", free), ("constrained", constrained)]
                runs = {}
                for name, cfg in order if rep % 2 == 0 else order[::-1]:
                    out, stats = gen.generate(prompts_for(p), cfg)
                    runs[name] = stats.decode_tokens_per_s
                    rates[name].append(stats.decode_tokens_per_s)
                    if name == "constrained":
                        for c in out:
                            if c.finish_reason == "length":
                                cut += 1
                                continue
                            try:
                                jsonschema.validate(json.loads(c.text), SCHEMA)
                                valid += 1
                            except (json.JSONDecodeError, jsonschema.ValidationError):
                                invalid += 1
                                print(f"INVALID: {c.text!r}", file=sys.stderr)
                ratios.append(runs["constrained"] / runs["free"])
            print(f"batch {batch} rep {rep}: ratios so far {[round(r, 3) for r in ratios]}", file=sys.stderr)
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f} (2 cores, shared)"
              f" | batch {batch}, {a.new_tokens} new tokens, {a.reps} reps x {len(PROMPTS)} prompts | "
              f"decode tok/s free {statistics.median(rates['free']):.1f}, constrained "
              f"{statistics.median(rates['constrained']):.1f}; paired ratio median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}) | outputs: {valid} valid, {invalid} invalid, "
              f"{cut} cut by the length limit")


if __name__ == "__main__":
    main()
