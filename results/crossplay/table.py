"""The transfer table of issue #51: one row per layout from the files `audit.py --cross-play SWEEP` and
`audit.py --partners SWEEP` wrote (crossplay.json, partners.json).

    python results/crossplay/table.py results/crossplay/forage-8x8_coop results/crossplay/forage-8x8_2p_2f

Each argument is a folder holding crossplay.json and partners.json. Scores are greedy test scores on the runs'
test start states; held-out partner scores are normalized by the standard scripted team's on the same states,
pairings whose partner does not solve the layout with the standard partner left out (partners.md says which).
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from plumbing import mean_ci as ci  # noqa: E402  (the repository root's)


def counts(labels: list[str]) -> str:
    return ", ".join(f"{label} {labels.count(label)}" for label in sorted(set(labels)))


def row(folder: str) -> str:
    with open(os.path.join(folder, "crossplay.json")) as f:
        cross = json.load(f)
    with open(os.path.join(folder, "partners.json")) as f:
        partners = json.load(f)
    assert cross["seeds"] == partners["seeds"] and cross["layout"] == partners["layout"], folder
    n, pairs = len(cross["seeds"]), cross["pairs"]
    self_labels = [pairs[i * n + i]["label"] for i in range(n)]
    cross_labels = [pairs[i * n + j]["label"] for i in range(n) for j in range(n) if i != j]
    summary = partners["summary"]
    variants = [name for name in summary if name != "standard"]
    held = "; ".join(f"{name} {ci(summary[name]['both'])}" for name in variants)
    competent = sum(summary[name]["competent"] for name in summary)
    pairings = sum(summary[name]["pairings"] for name in summary)
    return (f"| {cross['game']}/{cross['layout']} | {n} | {cross['scripted_score']:.3f} | {ci(cross['self_play'])} | "
            f"{ci(cross['cross_play'])} | {cross['gap']:.3f} | {cross['competent_self']}/{n} | "
            f"{cross['competent_cross']}/{n * (n - 1)} | {ci(summary['standard']['both'])} | {held} | "
            f"{competent}/{pairings} | {counts(self_labels)} | {counts(cross_labels)} |")


if __name__ == "__main__":
    print("| layout | seeds | scripted team | self-play | cross-play | gap | competent self | competent cross | "
          "standard partner (normalized) | held-out partners (normalized) | competent pairings | labels, self | "
          "labels, cross |")
    print("|" + " --- |" * 13)
    for folder in sys.argv[1:]:
        print(row(folder))
