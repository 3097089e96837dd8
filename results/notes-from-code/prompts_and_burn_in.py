"""Checks two notes moved out of the code docstrings (results/README.md, "Notes moved from the code"):
(b) prompt lengths of every kitchen layout with the current text views (envs.Kitchen.view), and
(e) how long one burn-in round of 150 random episodes takes (guards.BurnInSettings), per built-in layout.

    HF_HUB_OFFLINE=1 python results/notes-from-code/prompts_and_burn_in.py > results/notes-from-code/output.txt

Prompt tokens: SmolLM2's tokenizer over 128 real decisions per layout (random options over the guarded menus,
both agents, as bench.py --only prompts does for the default layouts). Burn-in: guards.burn_in on one core, the
first round (unguarded menus) and the whole synthesis (4 rounds), timed with no cache. Imports the project's
modules and changes none of them.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402

import envs  # noqa: E402
import guards as guard_lib  # noqa: E402
import options  # noqa: E402
import plumbing  # noqa: E402
import policy as policy_lib  # noqa: E402


def main() -> None:
    model, tokenizer = plumbing.load_backbone("tiny", "cpu", "float32")  # the tiny test model: SmolLM2's tokenizer
    policy = policy_lib.MenuPolicy(model, tokenizer, policy_lib.agent_names(2))
    settings = guard_lib.BurnInSettings()
    print(f"burn-in settings: {settings}")
    print("game/layout | 1 round of 150 episodes (s) | synthesis, all rounds (s) | prompt tokens mean / max "
          "(128 decisions)")
    for game_name in envs.GAMES:
        for layout in envs.GAMES[game_name].layouts:
            game = envs.make_game(game_name, layout, 0)
            library = options.make_library(game)
            t0 = time.perf_counter()
            guard_lib.burn_in(game, library, settings.episodes, settings.seed)
            one_round = time.perf_counter() - t0
            t0 = time.perf_counter()
            guard = guard_lib.build_guards(game, library, settings)
            all_rounds = time.perf_counter() - t0
            rng = np.random.default_rng(0)
            lengths, episode = [], 0
            while len(lengths) < 128:
                game.reset(episode // 4)
                runner = options.Runner(game, library, guard.menu_filter)
                while not runner.done and len(lengths) < 128:
                    for agent in runner.pending():
                        menu = runner.menu(agent)
                        view, texts = options.observation(runner, agent, menu)
                        decision = policy_lib.Decision("agent0", policy.build_prompt(game.rules, view, texts), texts)
                        lengths.append(len(policy.tokenize_decision(decision)[0]))
                        runner.assign(agent, menu[int(rng.integers(len(menu)))])
                    runner.advance()
                episode += 1
            tokens = f"{np.mean(lengths):.0f} / {max(lengths)}"
            print(f"{game_name}/{layout} | {one_round:.1f} | {all_rounds:.1f} | {tokens}", flush=True)


if __name__ == "__main__":
    main()
