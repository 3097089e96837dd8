#!/usr/bin/env bash
# Issue #51, forage: the commands as they ran (2-core AMD EPYC with native bfloat16; 2026-12-07). The sweeps are the
# README's default commands; their records equal the committed *-greedy1-seeds sweeps (compare_records.py).
set -e
export HF_HUB_OFFLINE=1
for layout in 8x8_coop 8x8_2p_2f; do
  python train.py --game forage --layout $layout --seeds 0-4 --out runs/forage-$layout-seeds
  python audit.py --cross-play runs/forage-$layout-seeds
  python audit.py --partners runs/forage-$layout-seeds
done
python audit.py --variants   # each held-out partner with the standard one, on every built-in layout
