"""A/B of the mask-table builder (``tables.mask_rows``): an older ``tables.py`` against the working tree's.

Both builders run on the same automata (first ``--limit`` rows of each JSONSchemaBench ``_dev`` file, decode
defaults (``GrammarSpec``'s: strict objects, ``max_repeat``); Gemma 3 vocabulary), interleaved
per schema in one process, and every state's mask must be identical (row numbering may differ). Prints CPU
seconds per schema, p50, totals and the median per-schema ratio.

    git show <commit>:specjax/grammar/tables.py > /tmp/tables_old.py
    python benchmarks/grammar_masks_ab.py /tmp/tables_old.py --limit 20

The old file imports its helpers (``_dfa``, ``_vocab_trie``, ``automaton``) from the working tree, so compare
versions whose helpers are compatible.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jsonschemabench_coverage import DEV_FILES, load  # noqa: E402

from specjax.decode import GrammarSpec  # noqa: E402
from specjax.grammar import _deadline  # noqa: E402
from specjax.grammar import tables as new  # noqa: E402
from specjax.grammar.automaton import build_automaton  # noqa: E402
from specjax.grammar.compiler import vocabulary_of  # noqa: E402
from specjax.grammar.errors import GrammarError  # noqa: E402
from specjax.grammar.frontend import load_lark  # noqa: E402
from specjax.grammar.json_schema import SchemaError, json_schema_to_lark  # noqa: E402


def _timed(fn, *args):
    t0 = time.thread_time()
    out = fn(*args)
    return out, time.thread_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="an older specjax/grammar/tables.py")
    ap.add_argument("--limit", type=int, default=20, help="first N schemas of each _dev file")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("tables_old", args.old)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    from specjax.models.loading import load_model

    vocab, _ = vocabulary_of(load_model(None)[1])
    _ = vocab.trie  # built once per vocabulary: not part of either builder's time
    t_old, t_new = [], []
    for name in DEV_FILES:
        for row in load(name)[: args.limit]:
            try:
                text = json_schema_to_lark(row["schema"], GrammarSpec("json_schema", "{}").json_schema_options())
                with _deadline.deadline(10.0):
                    auto = build_automaton(load_lark(text, "start"), 3, 200_000)
            except (SchemaError, GrammarError):
                continue
            (r1, s1), a = _timed(old.mask_rows, auto, vocab)
            (r2, s2), b = _timed(new.mask_rows, auto, vocab)
            if r1.shape != r2.shape or not (r1[s1] == r2[s2]).all():
                sys.exit(f"error: the masks differ on {row['id']}")
            t_old.append(a)
            t_new.append(b)
            print(f"{row['id']}: {auto.trans_sb.shape[0]} states, {len(r1)} rows, {a:.3f} -> {b:.3f} s", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}: "
          f"{len(t_old)} schemas, identical masks; p50 {statistics.median(t_old):.3f} -> "
          f"{statistics.median(t_new):.3f} s, total {sum(t_old):.1f} -> {sum(t_new):.1f} s, "
          f"median ratio {statistics.median(b / a for a, b in zip(t_old, t_new, strict=True)):.2f}")


if __name__ == "__main__":
    main()
