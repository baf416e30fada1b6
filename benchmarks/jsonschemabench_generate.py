"""End to end on JSONSchemaBench: constrained greedy generation on a real model, every output validated.

Per file of ../shared/data/jsonschemabench: the first --limit schemas (the `_dev` halves by default),
each compiled (refusals counted apart: `jsonschemabench_coverage.py --compile` measures coverage), then one
chat-templated prompt per schema ("Write one JSON value that follows this JSON Schema ...") decoded greedily
with the schema's grammar, --new-tokens at most, batch --batch. Reported per file and overall:

* long prompt: skipped, the prompt (which holds the whole schema) is over --max-prompt-chars;
* finished: the model ended the value itself (finish_reason "eos" or "grammar");
* closed: the token budget chose the row's last tokens (`GenerateConfig.close_grammar`; "closed");
* cut: the limit cut the row ("length": only with --no-close, or a budget shorter than the shortest value);
* valid: outputs accepted by `jsonschema` (the schema's own draft, with its format checker), of the
  finished and closed rows. Anything else is a bug — unless --unenforced leaves keywords unenforced, where
  "flagged" counts the outputs the decoder itself flagged (`Completion.violation`); an invalid output it did
  not flag is still a bug. --only-unenforced keeps the schemas that compile only thanks to that option.

    python benchmarks/jsonschemabench_generate.py --limit 8 --new-tokens 512
    python benchmarks/jsonschemabench_generate.py --model /path/qwen.gguf --limit 8 --no-close
    python benchmarks/jsonschemabench_generate.py --model qwen2.5-coder-1.5b-instruct --limit 40 \
        --unenforced uniqueItems,oneOf,contains,pattern,maxLength,propertyNames --only-unenforced
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import jsonschema
from jsonschemabench_coverage import DATA, DEV_FILES, load, validator

from specjax.decode import GenerateConfig, Generator, GrammarSpec, GrammarSpecError, SamplingConfig


def prompt_for(schema) -> str:
    return f"Write one JSON value that follows this JSON Schema.\nSchema: {json.dumps(schema)}\nJSON:"


def is_valid(schema, text: str) -> bool:
    try:
        validator(schema).validate(json.loads(text))
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def run_file(gen: Generator, name: str, a) -> dict:
    """Compiles the file's first a.limit schemas, generates one value each, and tallies the outcomes."""
    kept, specs, rows, skipped = [], [], load(name), 0
    for row in rows[:a.limit]:
        if len(prompt_for(row["schema"])) > a.max_prompt_chars:  # the prompt holds the whole schema: prefill-bound
            skipped += 1
            continue
        spec = GrammarSpec("json_schema", json.dumps(row["schema"]), origin=row["id"], unenforced=a.unenforced,
                           max_digits=a.max_digits)
        try:
            if a.only_unenforced and not spec.unenforced_at():
                continue
            gen._grammar_tables(spec, lambda m: None)
        except GrammarSpecError:
            continue
        kept.append(row)
        specs.append(spec)
    tally = collections.Counter(schemas=min(a.limit, len(rows)), long=skipped, compiled=len(kept))
    if not kept:
        return tally
    cfg = GenerateConfig(max_new_tokens=a.new_tokens, batch_size=min(a.batch, len(kept)), chat=True,
                         grammar=tuple(specs), close_grammar=not a.no_close, sampling=SamplingConfig())
    t = time.perf_counter()
    out, _ = gen.generate([prompt_for(r["schema"]) for r in kept], cfg)
    tally["seconds"] = time.perf_counter() - t
    for row, c in zip(kept, out, strict=True):
        kind = {"eos": "finished", "grammar": "finished", "closed": "closed"}.get(c.finish_reason, "cut")
        tally[kind] += 1
        tally["tokens"] += len(c.tokens)
        if kind != "cut":
            ok = is_valid(row["schema"], c.text)
            tally["valid"] += ok
            tally["flagged"] += c.violation is not None
            if not ok:
                flag = f" (flagged: {c.violation})" if c.violation else " (NOT FLAGGED)"
                print(f"  INVALID {row['id']}{flag}: {c.text[:200]!r}")
    return tally


def line(name: str, t: dict) -> str:
    done = t["finished"] + t["closed"]
    return (f"| {name} | {t['schemas']} | {t['long']} | {t['compiled']} | {t['finished']} | {t['closed']} | "
            f"{t['cut']} | "
            f"{t['valid']}/{done} | {t['flagged']} | {t['tokens'] / max(t['compiled'], 1):.0f} | "
            f"{t.get('seconds', 0):.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", nargs="*", default=list(DEV_FILES))
    ap.add_argument("--limit", type=int, default=8, help="schemas per file (the first N)")
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", default=None, help="a GGUF / HF directory (default: the embedded Gemma 3 270M)")
    ap.add_argument("--weights", default="float32", help="weight format in the graph (float32, int8, q4, bfloat16)")
    ap.add_argument("--no-close", action="store_true", help="let the limit cut rows (grammar_close=false)")
    ap.add_argument("--unenforced", default="", help="keywords to leave unenforced where they cannot be compiled "
                                                     "(GrammarSpec.unenforced), comma-separated")
    ap.add_argument("--only-unenforced", action="store_true", help="only schemas that need --unenforced")
    ap.add_argument("--max-digits", default=str(GrammarSpec.max_digits),
                    help="GrammarSpec.max_digits: digit-only tokens in a row at a digit loop ('none': unbounded)")
    ap.add_argument("--max-prompt-chars", type=int, default=16_000,
                    help="skip schemas whose prompt (it holds the whole schema) is longer: counted as 'long prompt'; "
                         "a 50 kB schema is a prefill of tens of thousands of tokens per row on a CPU")
    a = ap.parse_args()
    a.unenforced = tuple(k for k in a.unenforced.split(",") if k)
    a.max_digits = None if a.max_digits.lower() == "none" else int(a.max_digits)
    from specjax.models.loading import load_model

    model, tok = load_model(a.model, weights=a.weights)
    gen = Generator(model, tok)
    print(f"data: {DATA}; model: {a.model or 'embedded Gemma 3 270M'}, weights={a.weights}; greedy, "
          f"{a.new_tokens} new tokens, batch {a.batch}, close={'off' if a.no_close else 'on'}, "
          f"unenforced={','.join(a.unenforced) or '-'}, max_digits={a.max_digits}"
          f"{' (only schemas that need it)' if a.only_unenforced else ''}")
    print("| file | schemas | long prompt | compiled | finished | closed | cut | valid | flagged | tokens/row | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    total = collections.Counter()
    for name in a.files:
        t = run_file(gen, name, a)
        total.update(t)
        print(line(name, t), flush=True)
    print(line("all", total))


if __name__ == "__main__":
    main()
