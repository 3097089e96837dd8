"""The frozen base (no adapters), greedy on the 20 test start states of coop_push layouts, with the guarded menus
(seed 0's burn-in) as trained (`--arrived keep`) and without arrived options (`--arrived drop`).

    python results/coop_push-heavy_only-seeds/base_arrived_probe.py heavy_only small_boxes
    (from the project root)
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import envs  # noqa: E402
import guards as guard_lib  # noqa: E402
import options  # noqa: E402
import pamagrpo  # noqa: E402
import policy as policy_lib  # noqa: E402
import train  # noqa: E402

torch.set_num_threads(1)
model, tokenizer = policy_lib.load_backbone("smollm2-135m", "cpu", "bfloat16")
policy = policy_lib.MenuPolicy(model, tokenizer, pamagrpo.agent_names(2), lora_layers=4, seed=0)
for layout in sys.argv[1:]:
    def game_factory(layout=layout):
        return envs.make_game("coop_push", layout, 0)
    probe = game_factory()
    library = options.make_library(probe, "options", False)
    guards = guard_lib.cached_guards(probe, library, guard_lib.BurnInSettings(episodes=150, seed=0),
                                     os.path.join(policy_lib.cache_root(), "guards"))
    seeds = train.held_out_seeds(probe, "test", 20)
    scripted = train.scripted_score(game_factory, seeds)
    for arrived in ("keep", "drop"):
        t = time.time()
        menu_filter = options.run_menu_filter(library, guards.menu_filter, arrived)
        r = pamagrpo.evaluate(policy, game_factory, library, menu_filter, seeds, [None, None], 0.0, 0)
        print(f"{layout} arrived={arrived}: base greedy {r['score']:.3f} (scripted {scripted:.3f}, "
              f"{r['decisions']} decisions, {time.time() - t:.0f}s)", flush=True)
