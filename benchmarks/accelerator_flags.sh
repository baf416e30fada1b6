#!/bin/bash
# One call on a lent GPU: which XLA:GPU settings make the one-row (batch-1) step reach its weight-read floor.
#   bash benchmarks/accelerator_flags.sh            (run from the repository root there; carry .gpu, see
#                                                    accelerator_device.sh for what .gpu holds)
# 1. each decoder product alone at 1 and 8 rows (accelerator_matvec.py), under each setting;
# 2. Qwen 1.5B and Gemma 270M at batch 1: plain step and an ngram:8 round (accelerator.py), under each setting;
# 3. the optimized HLO of a 2-layer Qwen's plain and speculative programs at batch 1 and 8 (default setting).
# A setting this XLA does not know is reported and skipped (an unknown XLA_FLAGS entry aborts the process).
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
SETTINGS=(
  ""
  "--xla_gpu_enable_dot_strength_reduction=false"
  "--xla_gpu_enable_triton_gemm=false"
  "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
)
KNOWN=()
for s in "${SETTINGS[@]}"; do
  if XLA_FLAGS="$s" timeout 60 python3 -c "import jax, jax.numpy as j; j.ones(2).block_until_ready()" >/dev/null 2>&1
  then KNOWN+=("$s"); else echo "=== not known to this XLA, skipped: $s"; fi
done
for s in "${KNOWN[@]}"; do
  XLA_FLAGS="$s" timeout 100 python3 benchmarks/accelerator_matvec.py --assets .gpu --rows 1,8 --reps 5 \
    --label "${s:-default}" --out $OUT/matvec.jsonl 2>&1 | tee -a $OUT/log.txt
done
for s in "${KNOWN[@]}"; do
  echo "=== XLA_FLAGS=${s:-<default>}" | tee -a $OUT/log.txt
  XLA_FLAGS="$s" timeout 150 python3 benchmarks/accelerator.py --assets .gpu --batch 1 --setups ngram:8 --tokens 64 \
    --reps 3 --out "$OUT/b1_${#s}.jsonl" 2>&1 | grep -v "compiled in" | tee -a $OUT/log.txt
done
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text" timeout 120 python3 benchmarks/accelerator.py --assets .gpu \
  --targets qwen2.5-coder-1.5b-instruct --layers 2 --setups ngram:8 --batch 1,8 --tokens 16 --reps 1 \
  --out $OUT/dump_rows.jsonl > $OUT/dump.log 2>&1
mkdir -p $OUT/hlo && cp /tmp/dump/*after_optimizations.txt $OUT/hlo/ 2>/dev/null
ls /tmp/dump | head -50 > $OUT/hlo/listing.txt
