"""Training throughput per hardware class, from the records already in results/ (no training is run).

    python results/hardware-classes/tokens_per_s.py > results/hardware-classes/tokens_per_s.txt

For each seed of the sweeps below: the dtype its config.json records (float32 = a CPU without native bfloat16,
where `--dtype auto` falls back; bfloat16 = a CPU with avx512_bf16), the minutes of training (sum of
time/iteration_s in metrics.jsonl), scored tokens per second of training (sum of time/tokens over that sum) and
the minutes end to end (sweep.json's wall_s). Scored tokens per second compare machines across runs whose
episodes differ in length; minutes end to end do not.
"""

import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SWEEPS = ["coop_push-classic-greedy1-seeds", "coop_push-classic-tdecay-seeds", "kitchen-forced_coordination-seeds",
          "kitchen-forced_coordination-shaping-seeds", "coop_push-classic-gemma3-seeds"]


def main() -> None:
    print("sweep/seed | model | dtype | iterations | training min | scored tokens/s | s an iteration | wall min")
    for sweep in SWEEPS:
        folder = os.path.join(HERE, "..", sweep)
        wall = json.load(open(os.path.join(folder, "sweep.json"))).get("wall_s", {})
        for seed_dir in sorted(glob.glob(os.path.join(folder, "seed*"))):
            config = json.load(open(os.path.join(seed_dir, "config.json")))
            rows = [json.loads(line) for line in open(os.path.join(seed_dir, "metrics.jsonl"))]
            seconds = sum(r["time/iteration_s"] for r in rows)
            tokens = sum(r["time/tokens"] for r in rows)
            seed = os.path.basename(seed_dir)[4:]
            minutes = f"{wall[seed] / 60:.1f}" if seed in wall else "-"
            print(f"{sweep}/seed{seed} | {config['model']} | {config['dtype']} | {len(rows)} | {seconds / 60:.1f} | "
                  f"{tokens / seconds:.0f} | {seconds / len(rows):.1f} | {minutes}")


if __name__ == "__main__":
    main()
