"""Issue #24, why greedy play falls: re-score each seed's last adapters greedily on its 20 test start states
with the menus it trained on, minus the options that have already arrived (options.drop_arrived: a goto next
to its target, which stands still and reports success). No retraining: the adapters never saw these menus, so
this measures how much of a last checkpoint's greedy failure is that no-op, not what training with
`--arrived drop` would reach.

    python results/coop_push-classic-seeds/arrived_probe.py runs/coop_push-classic-seeds/seed4 ...
    (from the project root; each run folder needs its adapters/, which results/ does not keep)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import audit  # noqa: E402
import envs  # noqa: E402
import options  # noqa: E402
import pamagrpo  # noqa: E402

for run_dir in sys.argv[1:]:
    config, game_factory, library, menu_filter, policy = audit.load_run(run_dir)
    policy.load_adapters(os.path.join(run_dir, "adapters"))
    game = game_factory()
    seeds = envs.split_seeds(game, "test", config["eval_episodes"])
    names = [f"agent{i}" for i in range(game.n_agents)]
    last = json.load(open(os.path.join(run_dir, "result.json")))["last_test_score"]
    dropped = pamagrpo.evaluate(policy, game_factory, library, options.drop_arrived(library, menu_filter), seeds,
                                names, 0.0, config["seed"])
    print(f"{run_dir}: last adapters, greedy test score over {len(seeds)} test start states: as trained {last:.3f}"
          f" (result.json); without arrived options {dropped['score']:.3f} ({dropped['decisions']} decisions)",
          flush=True)
