"""The figures of issue #23's side-by-side from this folder's records: wall clock and peak memory of each run
(`/usr/bin/time -v` files), its training minutes (sum of metrics.jsonl's time/iteration_s), its audit seconds (the
log's audit line) and its test scores, and the ratio of the wall clocks.

    python results/speed-side-by-side/measure.py > results/speed-side-by-side/measured.txt
"""
import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


def wall_and_peak(side: str) -> tuple[float, float]:
    """(wall clock in minutes, peak resident memory in GiB) of one run's time -v file."""
    text = open(os.path.join(HERE, f"{side}.time")).read()
    clock = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text).group(1).split(":")
    seconds = sum(float(x) * 60 ** i for i, x in enumerate(reversed(clock)))
    return seconds / 60, int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) / 2 ** 20


walls = {}
for side in ("old", "new"):
    walls[side], peak = wall_and_peak(side)
    metrics = [json.loads(line) for line in open(os.path.join(HERE, side, "metrics.jsonl"))]
    train_min = sum(m["time/iteration_s"] for m in metrics) / 60
    result = json.load(open(os.path.join(HERE, side, "result.json")))
    audit_s = re.search(r"^audit \(\d+ test start states, (\d+)s\)", open(os.path.join(HERE, f"{side}.log")).read(),
                        re.M).group(1)
    print(f"{side}: wall {walls[side]:.1f} min, peak {peak:.1f} GiB, training {train_min:.1f} min "
          f"({train_min * 60 / len(metrics):.1f} s an iteration), audit {audit_s} s, selected test "
          f"{result['selected_test_score']:.3f} (iteration {result['selected_iteration']}), last test "
          f"{result['last_test_score']:.3f}")
print(f"end to end: {walls['old'] / walls['new']:.2f}x")
