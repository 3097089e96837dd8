#!/usr/bin/env bash
# Issue #23's side-by-side measurement: the default command, `python train.py --game coop_push` (seed 0), at the
# commit before the speed work and at a later commit, one after the other on the same machine with nothing else
# running. Each run gets a fresh, empty --cache folder, so neither reads guards or frozen-base baselines that an
# earlier run computed (a user's first run); wall clock and peak memory come from /usr/bin/time -v.
#
#   bash results/speed-side-by-side/run.sh [OLD_REV] [NEW_REV] [WORK_DIR]
#
# OLD_REV defaults to f468d27 (the profile only; its train.py is the one issue #23 timed), NEW_REV to HEAD.
# Writes WORK_DIR/{old,new}.log (train.py's output), {old,new}.time (time -v) and a one-line summary per run.
set -euo pipefail
old=${1:-f468d27}
new=${2:-HEAD}
work=${3:-/tmp/side-by-side}
repo=$(git rev-parse --show-toplevel)
mkdir -p "$work"
for side in old new; do
    rev=$([ "$side" = old ] && echo "$old" || echo "$new")
    tree="$work/tree-$side"
    [ -d "$tree" ] || git -C "$repo" worktree add -f --detach "$tree" "$rev" >/dev/null
    git -C "$tree" checkout -q --detach "$rev"
    rm -rf "$work/cache-$side" "$tree/runs/side-by-side"
    mkdir -p "$work/cache-$side"
    # the model loads from the installed package either way; only the run's own caches start empty
    (cd "$tree" && HF_HUB_OFFLINE=1 /usr/bin/time -v -o "$work/$side.time" \
        python train.py --game coop_push --cache "$work/cache-$side" --out runs/side-by-side > "$work/$side.log" 2>&1)
    wall=$(grep "Elapsed (wall clock)" "$work/$side.time" | awk '{print $NF}')
    peak=$(grep "Maximum resident set size" "$work/$side.time" | awk '{printf "%.1f", $NF / 1048576}')
    echo "$side $(git -C "$tree" rev-parse --short HEAD): wall $wall, peak ${peak} GiB, $(tail -1 "$work/$side.log")" \
        | tee -a "$work/summary.txt"
done
