"""Speed benchmarks: environments, option runner, menu scoring.

    python bench.py                 # every section, a table
    python bench.py --only env      # one section: env | scoring
    python bench.py --json          # one JSON object

Speed is measured here and reported in the README, never asserted by timed tests.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import envs
import options


def bench_env(game_name: str, steps: int, seed: int = 0) -> float:
    """Primitive environment steps per second under uniformly random joint actions (one thread)."""
    game = envs.make_game(game_name, None, seed)
    rng = np.random.default_rng(seed)
    joint = rng.integers(0, len(envs.ACTIONS), size=(steps, game.n_agents)).tolist()
    episode = 0
    start = time.perf_counter()
    for actions in joint:
        if game.done:
            episode += 1
            game.reset(seed + episode)
        game.step(actions)
    return steps / (time.perf_counter() - start)


def bench_runner(game_name: str, episodes: int, seed: int = 0) -> tuple[float, float]:
    """Primitive steps and option decisions per second with the asynchronous runner, random options."""
    game = envs.make_game(game_name, None, seed)
    library = options.make_library(game)
    choose = options.random_choice(np.random.default_rng(seed))
    steps = decisions = 0
    start = time.perf_counter()
    for e in range(episodes):
        episode = options.run_episode(game, library, choose, seed + e)
        steps += episode.steps
        decisions += len(episode.executions)
    elapsed = time.perf_counter() - start
    return steps / elapsed, decisions / elapsed


def section_env(quick: bool) -> dict:
    out = {}
    for name in envs.GAMES:
        steps_per_s = bench_env(name, 50_000 if quick else 200_000)
        runner_steps, runner_decisions = bench_runner(name, 50 if quick else 200)
        out[name] = {"env_steps_per_s": round(steps_per_s), "runner_steps_per_s": round(runner_steps),
                     "runner_decisions_per_s": round(runner_decisions)}
    return out


def print_env(result: dict) -> None:
    print(f"{'game':<10} {'env steps/s':>12} {'runner steps/s':>15} {'decisions/s':>12}")
    for name, row in result.items():
        print(f"{name:<10} {row['env_steps_per_s']:>12,} {row['runner_steps_per_s']:>15,} "
              f"{row['runner_decisions_per_s']:>12,}")


SECTIONS = {"env": (section_env, print_env)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SECTIONS), help="run one section")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args()
    results = {}
    for name, (run, show) in SECTIONS.items():
        if args.only and name != args.only:
            continue
        results[name] = run(args.quick)
        if not args.json:
            print(f"== {name}")
            show(results[name])
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
