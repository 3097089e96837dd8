"""Differential check: envs.Forage against the lbforaging 2.0.0 package itself, on random joint actions.

Not part of the suite (lbforaging is not a dependency). To re-run:
    pip install --target /tmp/lbfenv --no-deps lbforaging==2.0.0 gymnasium cloudpickle farama-notifications
    PYTHONPATH=/tmp/lbfenv python results/forage-lbf-differential/lbf_diff.py
Each start state is one of ours (reset), copied into lbforaging's field and players; both step the same random
joint actions; positions and remaining food are compared after every step.
"""
import logging
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
logging.disable(logging.CRITICAL)
from lbforaging.foraging.environment import ForagingEnv  # noqa: E402

import envs  # noqa: E402

steps = mismatches = 0
rng = np.random.default_rng(1)
for layout in ("8x8_2p_2f", "8x8_solo", "8x8_coop"):
    game = envs.make_game("forage", layout)
    n = game.n_agents
    env = ForagingEnv(players=n, min_player_level=1, max_player_level=2, min_food_level=1, max_food_level=None,
                      field_size=(8, 8), max_num_food=len(game.food_starts), sight=8, max_episode_steps=1000,
                      force_coop=False)
    env.reset(seed=0)
    for seed in range(300):
        game.reset(seed)
        env.field = np.zeros((8, 8), np.int32)
        for k, c in enumerate(game.food):
            env.field[game.rc(c)] = game.food_levels[k]
        env._food_spawned = env.field.sum()
        for p, c, lv in zip(env.players, game.pos, game.agent_levels):
            p.position, p.level = game.rc(c), lv
        env.current_step = 0
        env._gen_valid_moves()
        while not game.done:
            actions = [int(a) for a in rng.integers(6, size=n)]
            env.step(actions)
            game.step(actions)
            steps += 1
            ours_food = {game.rc(c) for k, c in enumerate(game.food) if not game.collected[k]}
            theirs_food = {tuple(int(x) for x in rc) for rc in zip(*np.nonzero(env.field))}
            ok = [tuple(int(x) for x in p.position) for p in env.players] == [game.rc(c) for c in game.pos] \
                and ours_food == theirs_food
            if not ok:
                mismatches += 1
                for p, c in zip(env.players, game.pos):
                    p.position = game.rc(c)
print(f"{steps} random joint steps from {3 * 300} start states: {mismatches} disagreements")
