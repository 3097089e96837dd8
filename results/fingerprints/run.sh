#!/usr/bin/env bash
# usage: run.sh SRC_DIR OUT_DIR   -- fingerprint runs
set -e
SRC=$1; OUT=$2; mkdir -p $OUT
cd $SRC
export HF_HUB_OFFLINE=1
for g in coop_push forage kitchen; do
  python train.py --game $g --model tiny --iterations 3 --out $OUT/tiny-$g --cache $OUT/cache > $OUT/tiny-$g.log 2>&1
done
python train.py --game coop_push --iterations 2 --eval-interval 1 --eval-episodes 4 --base-episodes 2 --audit-episodes 2 --out $OUT/smol --cache $OUT/cache > $OUT/smol.log 2>&1
