#!/bin/bash
cd /work/main
export HF_HUB_OFFLINE=1
S=runs/forage-8x8_2p_2f-seeds
while [ ! -f $S/seed2/result.json ]; do sleep 10; done
sleep 5
pkill -TERM -f "train.py --game forage --layout 8x8_2p_2f --seeds 0-4" ; sleep 10
D=runs/forage-8x8_2p_2f-seeds0-2
mkdir -p $D
python - <<'PY'
import json
plan = json.load(open("runs/forage-8x8_2p_2f-seeds/sweep.json"))
plan.update(seeds=[0, 1, 2], seeds_text="0-2")
json.dump(plan, open("runs/forage-8x8_2p_2f-seeds0-2/sweep.json", "w"), indent=1)
PY
for k in 0 1 2; do ln -sfn ../forage-8x8_2p_2f-seeds/seed$k $D/seed$k; done
date > logs/xp-crossplay.log
/usr/bin/time -v nice -n 5 python audit.py --cross-play $D >> logs/xp-crossplay.log 2>&1
date >> logs/xp-crossplay.log
nice -n 5 python audit.py --partners $D > logs/xp-partners.log 2>&1
date >> logs/xp-partners.log
