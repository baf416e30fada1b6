#!/bin/bash
# One call on a lent GPU: an accelerator-profile setting A/B, and the cost of the speculative program's plain rounds.
#   bash benchmarks/accelerator_profile_ab.sh     (repository root there; carry .gpu as accelerator_device.sh says)
# 1. min_product_rows 0 (as is) vs 8 (one-row products padded to 8 rows): Qwen 1.5B and Gemma 270M at batch 1,
#    plain step and an ngram:8 round;
# 2. with the setting as is, plain rounds that propose a shadow draft every round and never verify
#    (verify_cost=1000, cheap_max_gap=1): what a cheap drafter's plain round costs over a plain step.
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="python3 benchmarks/accelerator.py --assets .gpu --batch 1 --tokens 128 --reps 3"
SHADOW=":adaptive=1:verify_cost=1000:cheap_max_gap=1"
for rows in 8 0; do
  echo "=== min_product_rows=$rows" | tee -a $OUT/log.txt
  setups=ngram:8
  [ $rows = 0 ] && setups="ngram:8,ngram:8$SHADOW,recycle:8$SHADOW"
  timeout 200 $B --profile min_product_rows=$rows --setups "$setups" --out $OUT/rows$rows.jsonl 2>&1 \
    | grep -v "compiled in" | tee -a $OUT/log.txt
done
