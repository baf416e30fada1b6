#!/bin/bash
# One call on a lent GPU (the `device` tool), run from the repository root there:  bash benchmarks/accelerator_device.sh
# Before it, here: python benchmarks/accelerator.py --prepare .gpu, and the wheels the device image lacks into .gpu/whl
# (pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .gpu/whl
#  lark==1.3.1 interegular==0.3.3; flax==0.12.8 into .gpu/flaxwhl as a fallback); carry .gpu.
# A smoke test first (the image's flax, else the carried one), then the parts in order of priority, each writing its
# rows to $OUT as it goes, so a call cut by its time limit still returns what finished.
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
B="python3 benchmarks/accelerator.py --assets .gpu"
smoke() { timeout 150 $B --targets gemma3-270m --layers 2 --setups ngram:4 --batch 1 --tokens 16 --reps 1 \
          --out $OUT/smoke.jsonl > $OUT/smoke.log 2>&1; }
if ! smoke; then
  tail -25 $OUT/smoke.log
  echo "=== the image's flax failed; the carried flax 0.12.8"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/flaxwhl/*.whl || exit 1
  smoke || { tail -25 $OUT/smoke.log; exit 1; }
fi
Q=qwen2.5-coder-1.5b-instruct
$B --targets $Q --temps 0 --out $OUT/qwen_t0.jsonl 2>&1 | tee -a $OUT/log.txt
$B --targets gemma3-270m --temps 0 --out $OUT/gemma_t0.jsonl 2>&1 | tee -a $OUT/log.txt
$B --targets $Q --temps 1 --batch 1,8 --setups ngram:8,recycle:8 --out $OUT/qwen_t1.jsonl 2>&1 | tee -a $OUT/log.txt
