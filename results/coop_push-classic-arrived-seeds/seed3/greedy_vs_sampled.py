"""Issue #24, is seed 3's fall a greedy-vs-sampled gap or a held-out gap? Its last adapters, played greedily on
the 20 test start states and on 20 of the start states it trained on, and sampled at T = 1 on the test states.

    python results/coop_push-classic-arrived-seeds/seed3/greedy_vs_sampled.py runs/coop_push-classic-arrived-seeds/seed3
    (from the project root; the run folder needs its adapters/, which results/ does not keep)
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import audit  # noqa: E402
import pamagrpo  # noqa: E402
import train  # noqa: E402

torch.set_num_threads(1)
run = sys.argv[1]
config, game_factory, library, menu_filter, policy = audit.load_run(run)
policy.load_adapters(os.path.join(run, "adapters"))
probe = game_factory()
names = pamagrpo.agent_names(probe.n_agents)
test = train.held_out_seeds(probe, "test", 20)
trained = sorted({s for it in range(config["iterations"])
                  for s in train.training_seeds(probe, config["seed"], it, config["start_states"])})[:20]
for tag, seeds, temperature in (("test greedy", test, 0.0), ("training states greedy", trained, 0.0),
                                ("test T=1", test, 1.0)):
    t = time.time()
    r = pamagrpo.evaluate(policy, game_factory, library, menu_filter, seeds, names, temperature, 0)
    print(f"{tag}: score {r['score']:.3f} on {len(seeds)} states, {r['decisions']} decisions, {time.time() - t:.0f}s",
          flush=True)
