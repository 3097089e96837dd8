#!/usr/bin/env bash
# The GPU check of the README's GPU section, in two parts (one borrowed-device call each; ~5 and ~8 min on one H200).
# On the GPU machine, after the staging calls of ../shared/device (prepare.sh here; stage1.sh, then
# `source .device2/stage2.sh` there), from the project root:
#   bash .ci/gpu_check.sh bench      # bench.py scoring + train sections on cuda (2x4 vs 8x8 groups), default run alone
#   bash .ci/gpu_check.sh sweep      # the default command over seeds 0-4, five at once on the one GPU
# Figures are printed and written under $OUT (or ./gpu_check): bench.json, *.log, the runs' records (no adapters).
set -euo pipefail
case "${1:-}" in bench|sweep) ;; *) echo "usage: bash .ci/gpu_check.sh bench|sweep" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
records() {  # what a run folder holds, minus adapters, snapshots and checkpoints
  tar -czf "$out/$1.tar.gz" --exclude=adapters --exclude=snapshots --exclude='checkpoint*' \
    --exclude='adapters_selected' -C "$(dirname "$2")" "$(basename "$2")"
}
case "${1:-}" in
  bench)
    python bench.py --device cuda --only scoring --models smollm2-135m --dtypes bfloat16 --json | tee "$out/bench_scoring.json"
    python bench.py --device cuda --only train --models smollm2-135m --dtypes bfloat16 --groups 2x4,8x8 --json \
      | tee "$out/bench_train.json"
    /usr/bin/time -v python train.py --game coop_push --device cuda --out runs/gpu-default 2>&1 | tee "$out/default.log"
    records default runs/gpu-default
    ;;
  sweep)
    /usr/bin/time -v python train.py --game coop_push --device cuda --seeds 0-4 --jobs 5 --out runs/gpu-sweep 2>&1 \
      | tee "$out/sweep.log"
    records sweep runs/gpu-sweep
    ;;
esac
