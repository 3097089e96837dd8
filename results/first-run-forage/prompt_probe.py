"""What the LLM reads: the first decision of agent 1 on the first test start state of a run.

Prints the full prompt text, the guarded menu, and each option's probability under the frozen base
(adapters off) and under agent 1's trained adapter. Imports the project's modules and changes none of them.

    HF_HUB_OFFLINE=1 python results/first-run-forage/prompt_probe.py runs/first-forage
(the run folder must still hold adapters/, which the copy in results/ leaves out).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import audit  # noqa: E402
import envs  # noqa: E402
import options  # noqa: E402
import policy as policy_lib  # noqa: E402


def main(run_dir: str) -> None:
    config, task, policy = audit.load_run(run_dir)
    game = task.new_game()
    seed = envs.split_seeds(game, "test", 1)[0]  # the first test start state (split_seeds resets the game)
    game = task.new_game()
    game.reset(seed)
    runner = options.Runner(game, task.library, task.menu_filter)
    agent = 0  # "agent 1" in the text; adapter "agent0"
    assert agent in runner.pending()
    unguarded = task.library.ground(game, agent)
    menu = runner.menu(agent)
    view, texts = options.observation(runner, agent, menu)
    prompt = policy.build_prompt(game.rules, view, texts)
    tokens = len(policy.tokenize_decision(policy_lib.Decision("agent0", prompt, tuple(texts)))[0])
    print(f"{config['game']}/{config['layout']} ({config['model']}, {config['dtype']}), test start state {seed}, "
          f"agent 1's first decision; the prompt ({tokens} tokens):")
    print(prompt, end="" if prompt.endswith("\n") else "\n")
    removed = [task.library.describe(game, agent, o) for o in unguarded if o not in menu]
    base = policy.menu_log_probs([policy_lib.Decision(None, prompt, tuple(texts))])[0].exp()
    policy.load_adapters(os.path.join(run_dir, "adapters"))
    trained = policy.menu_log_probs([policy_lib.Decision("agent0", prompt, tuple(texts))])[0].exp()
    header = f"menu ({len(unguarded)} grounded, {len(menu)} after the guards)"
    print(f"{header:40s} {'frozen base':>12s} {'trained (final adapter)':>24s}")
    for text, p, q in zip(texts, base.tolist(), trained.tolist()):
        print(f"{text:40s} {p:12.3f} {q:24.3f}")
    if removed:
        print(f"removed by the guards: {'; '.join(removed)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/first-forage")
