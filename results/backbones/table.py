"""The backbone x game table of issue #54: one row per sweep folder of `train.py --seeds` (its summary.json, and
seed0/config.json for the model and dtype).

    python results/backbones/table.py results/forage-8x8_coop-greedy1-seeds results/forage-8x8_coop-gemma3-seeds

Competent: selected test score >= 0.8 x the scripted team's (summary.json's); "last competent" counts the seeds
whose last adapters are (the learning-rate rule of lr-rule.md reads it). Minutes a seed: each seed's wall clock
(the whole train.py process: burn-in, baselines, training, tests, audit), mean over finished seeds.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from plumbing import mean_ci as ci  # noqa: E402  (the repository root's)


def row(folder: str) -> str:
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    runs = [r for r in summary["runs"] if r.get("status") == "done"]
    with open(os.path.join(folder, f"seed{runs[0]['seed']}", "config.json")) as f:
        config = json.load(f)
    last_competent = sum(r["last_test_score"] >= 0.8 * r["scripted_test_score"] for r in runs)
    minutes = sum(r["wall_s"] for r in runs) / len(runs) / 60
    audits = ", ".join(f"{label} {k}" for label, k in summary["audits"].items())
    n = summary["seeds"]
    seeds = f"{n} (one seed)" if n == 1 else str(n)
    return (f"| {config['model']} | {config['game']}/{config['layout']} | {config['lr']:g} | {seeds} | "
            f"{summary['competent']}/{summary['finished']} | {last_competent}/{len(runs)} | "
            f"{ci(summary['selected_test_score'])} | {ci(summary['last_test_score'])} | {audits} | "
            f"{minutes:.0f} | {config['dtype']} | `{os.path.basename(folder.rstrip('/'))}` |")


if __name__ == "__main__":
    print("| backbone | game/layout | lr | seeds | competent (selected) | competent (last) | selected test score | "
          "last test score | audits | minutes a seed | dtype | records |")
    print("|" + " --- |" * 12)
    for folder in sys.argv[1:]:
        print(row(folder))
