"""Does a rerun of a sweep reproduce a committed one? Records compared seed by seed, clocks aside.

    python results/crossplay/compare_records.py results/forage-8x8_coop-greedy1-seeds runs/forage-8x8_coop-seeds

metrics.jsonl (every field but time/* and *seconds), eval.jsonl's validation, final and selected records (baseline
rows depend on --base-episodes and on a cache), result.json (but train_s), audit_final.json (but seconds) and
replay.txt must be equal.
"""

import json
import os
import sys


def strip(record: dict) -> dict:
    return {k: v for k, v in record.items()
            if not k.startswith("time/") and not k.endswith("seconds") and k != "train_s"}


def records(path: str) -> list[dict]:
    with open(path) as f:
        return [strip(json.loads(line)) for line in f if line.strip()]


def compare(a: str, b: str) -> list[str]:
    differ = []
    if records(os.path.join(a, "metrics.jsonl")) != records(os.path.join(b, "metrics.jsonl")):
        differ.append("metrics.jsonl")
    evals = [[r for r in records(os.path.join(d, "eval.jsonl")) if r["tag"] != "baseline"] for d in (a, b)]
    if evals[0] != evals[1]:
        differ.append("eval.jsonl")
    for name in ("result.json", "audit_final.json"):
        with open(os.path.join(a, name)) as fa, open(os.path.join(b, name)) as fb:
            if strip(json.load(fa)) != strip(json.load(fb)):
                differ.append(name)
    with open(os.path.join(a, "replay.txt")) as fa, open(os.path.join(b, "replay.txt")) as fb:
        if fa.read() != fb.read():
            differ.append("replay.txt")
    return differ


if __name__ == "__main__":
    committed, rerun = sys.argv[1], sys.argv[2]
    seeds = sorted(d for d in os.listdir(committed)
                   if d.startswith("seed") and os.path.isfile(os.path.join(rerun, d, "result.json")))  # finished
    same = 0
    for seed in seeds:
        differ = compare(os.path.join(committed, seed), os.path.join(rerun, seed))
        same += not differ
        print(f"{seed}: {'identical records' if not differ else 'DIFFERENT: ' + ', '.join(differ)}")
    print(f"{same} of {len(seeds)} seeds reproduce {committed} exactly")
