"""Behavioral audits: reward is not cooperation (the paper's second finding).

A rising reward curve may only mean that one agent learned to run the whole task while its partner idles.
This file measures who did the work, from the events each game attributes to the agents that caused them
(envs.py), over evaluation episodes on fixed seeds, and what each agent is worth counterfactually.

Metrics (`episode_metrics`, pooled over all episodes; a ratio whose denominator is 0 is 0):
- `agentI.progress_share`: agent I's share of task-progress events (`progress_events`): PROGRESS_KINDS (a box
  moved toward the goal or delivered, a food loaded, an onion put in a pot, a soup plated or served), and counter
  moves only when they pass an item on (a take that is a hand-off, a place whose item the partner takes next).
  An event of two agents counts once for each and shares are normalized by the sum of those counts (a team whose
  every event is joint gets 0.5 / 0.5). JOINT_KINDS markers, which repeat a progress event, are not counted.
  `agentI.reward_share`: the same over REWARD_KINDS only.
- `agentI.idle_fraction`: the fraction of steps agent I spent in `wait` or in failed options (timeouts included;
  an option still running at the end is busy); `agentI.usage.KIND`: the fraction of its option executions of
  each type; `agentI.failure_rate`: failed / finished executions, `wait` excluded.
- `joint_events_per_episode` (JOINT_KINDS); `overlap_fraction`: the fraction of steps in which two agents run
  options with the same first argument, whatever the option type (`goto box 2` and `push box 2 north`).
- Counterfactual value (`audit_team`, `audit_llm_team`): the same seeds re-run with agent I replaced by an idle
  agent (always `wait`, which still steps aside when next to its partner) and, separately, by a uniformly random
  one over its (guarded) menu. `agentI.ablation_idle_drop` is the drop of the mean score, `..._drop_rel` that
  drop over the intact team's (0 when that is 0); a negative drop means the team does better without that agent.

Summary (`summarize`), checked in this order; agents are numbered from 1 in text, as on the map:
- "no reward": the intact team scores 0, so there is nothing to lose by removing an agent.
- "interdependent": removing any one agent costs >= NECESSARY_DROP (50%) of the score.
- "solo": one agent does >= SOLO_SHARE (90%) of the progress, or it alone is necessary (removing it costs
  >= 50%) while removing any other costs < DISPENSABLE_DROP (10%).
- "redundant": all agents work but removing any one costs < 10%: each could do the task alone.
- "mixed": anything else.
Audits are deterministic when the `choose` functions are: each random stand-in draws from a generator
seeded by (rng_seed, agent, episode seed).

Does cooperation transfer beyond the partner an agent trained with (issue #51)?
- Cross-play (`cross_play`; Other-Play, Hu et al. 2020): agent 1 of seed i with agent 2 of seed j of one sweep,
  for all i, j, greedy, on the test start states of every run's final test, each agent with its own run's menus.
  The diagonal (self-play) reproduces each run's result.json; means with 95% bootstrap CIs over pairs.
- Held-out partners (`held_out_partners`; Overcooked-AI's, JaxAHT's protocols): each trained agent in its own
  seat with a scripted partner in the other: the standard one (options.scripted_choice) and the game's variants
  (options.Library.variants), written before any trained agent played with them. Scores are divided by the
  standard scripted team's; a variant below COMPETENT x that team with the standard partner in the same seat is
  no evidence against a trained agent.

Run `python audit.py --reference` (the scripted teams on every built-in layout), `RUN_DIR` (a run's frozen base
and snapshots over training; `--temperature T` samples the teams), `--final RUN_DIR...` (train.py's final audits),
`--decoupling LABEL=SWEEP...` (the figure), `--margins RUN_DIR` (greedy argmax margins, failed streaks), `--replay
RUN_DIR [--episode K]`, `--cross-play SWEEP [--last]`, `--partners RUN_OR_SWEEP` or `--variants`.
Test: `pytest test_all.py -k "audit or replay or margins or decoupling or cross_p or partner"`.
Needs envs, options, policy, guards and plumbing; never pamagrpo or train: an audit needs no training algorithm.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np

import envs
from envs import Game
import guards as guard_lib
from options import (Library, Task, make_library, random_choice, run_episode, run_menu_filter, scripted_choice,
                     variant_choice)
import plumbing
import policy as policy_lib

PROGRESS_KINDS = ("box_toward_goal", "box_delivered", "food_loaded", "onion_in_pot", "soup_plated",
                  "soup_served", "counter_place", "counter_take")  # counter moves: see progress_events
REWARD_KINDS = ("box_delivered", "food_loaded", "soup_served")
JOINT_KINDS = ("joint_push", "joint_load", "handoff")
SOLO_SHARE = 0.9  # one agent doing at least this share of the progress runs the task alone
DISPENSABLE_DROP = 0.1  # removing an agent that costs less than this (relative) loses nothing that matters
NECESSARY_DROP = 0.5  # removing an agent that costs at least this (relative) makes it necessary
LABELS = ("interdependent", "solo", "mixed", "redundant", "no reward")  # the first words of summarize()
COMPETENT = 0.8  # train.COMPETENT (audit.py never imports train): >= 0.8 x the scripted team's score is competent
SWEEP_FREE = ("seed", "out", "resume", "threads")  # config keys in which the runs of one sweep may differ

Choose = Callable  # (runner, agent, menu) -> Option, as options.run_episode expects


def team_choose(chooses: Sequence[Choose]) -> Choose:
    """One `choose` for run_episode from one function per agent."""
    return lambda runner, agent, menu: chooses[agent](runner, agent, menu)


# ----------------------------------------------------------------------------- metrics from episodes


def shares(events: list, n_agents: int, kinds: Sequence[str]) -> list[float]:
    """Each agent's share of the events of `kinds` it took part in (module docstring); all 0 without such events."""
    counts = [sum(i in agents for _, kind, agents, _ in events if kind in kinds) for i in range(n_agents)]
    total = sum(counts)
    return [c / total if total else 0.0 for c in counts]


def progress_events(events: list) -> list:
    """One episode's events (t, kind, agents, obj) that moved the task forward (module docstring): a counter take
    is a hand-off when a 'handoff' event at that step and cell names the taker."""
    handoffs = {(t, agents[1], cell) for t, kind, agents, cell in events if kind == "handoff"}
    kept = []
    for n, (t, kind, agents, obj) in enumerate(events):
        if kind == "counter_take":
            keep = (t, agents[0], obj) in handoffs
        elif kind == "counter_place":  # passed on: the item's next taker is the partner
            taker = next((e[2][0] for e in events[n + 1:] if e[1] == "counter_take" and e[3] == obj), None)
            keep = taker not in (None, agents[0])
        else:
            keep = kind in PROGRESS_KINDS
        if keep:
            kept.append((t, kind, agents, obj))
    return kept


def overlap_steps(executions: list, n_agents: int, steps: int) -> int:
    """Steps in which two agents run options with the same first argument (the same box, food or pot)."""
    target: list[list] = [[None] * steps for _ in range(n_agents)]  # (agent, step) -> object or None
    for x in executions:
        if x.option.kind != "wait" and x.option.args:
            for t in range(x.start, min(x.start + x.duration, steps)):
                target[x.agent][t] = x.option.args[0]
    objects = [[target[i][t] for i in range(n_agents) if target[i][t] is not None] for t in range(steps)]
    return sum(len(o) != len(set(o)) for o in objects)


def episode_metrics(episodes: list, n_agents: int, kinds: Sequence[str]) -> dict:
    """The flat metrics dict (module docstring) of options.Episode's; `kinds`: the option types to count usage of."""
    events = [e for ep in episodes for e in ep.events]
    progress_list = [e for ep in episodes for e in progress_events(ep.events)]
    runs = [x for ep in episodes for x in ep.executions]
    steps = sum(ep.steps for ep in episodes)
    n = len(episodes)
    m: dict = {"episodes": n, "n_agents": n_agents,
               "score": float(np.mean([ep.score for ep in episodes])),
               "reward": float(np.mean([ep.total_reward for ep in episodes])),
               "steps": float(np.mean([ep.steps for ep in episodes])),
               "progress_events_per_episode": len(progress_list) / n,
               "joint_events_per_episode": sum(e[1] in JOINT_KINDS for e in events) / n,
               "overlap_fraction": sum(overlap_steps(ep.executions, n_agents, ep.steps) for ep in episodes)
               / max(steps, 1)}
    progress = shares(progress_list, n_agents, PROGRESS_KINDS)
    reward = shares(events, n_agents, REWARD_KINDS)
    for i in range(n_agents):
        mine = [x for x in runs if x.agent == i]
        finished = [x for x in mine if x.option.kind != "wait" and x.success is not None]
        m[f"agent{i}.progress_share"] = progress[i]
        m[f"agent{i}.reward_share"] = reward[i]
        idle = [x for x in mine if x.option.kind == "wait" or x.success is False]
        m[f"agent{i}.idle_fraction"] = sum(x.duration for x in idle) / max(steps, 1)
        m[f"agent{i}.failure_rate"] = sum(x.success is False for x in finished) / max(len(finished), 1)
        for kind in kinds:
            m[f"agent{i}.usage.{kind}"] = sum(x.option.kind == kind for x in mine) / max(len(mine), 1)
    m["min_progress_share"] = min(progress)
    return m


def percent(x: float) -> str:
    return f"{100 * x:.0f}%"


def summarize(metrics: dict, n_agents: int) -> str:
    """The cooperation label and its evidence, by the thresholds in the module docstring."""
    share = [metrics[f"agent{i}.progress_share"] for i in range(n_agents)]
    # rounded, so that a drop of 1.0 - 0.9 in floating point (0.0999...) is not read as "< 10%"
    cost = [round(metrics[f"agent{i}.ablation_idle_drop_rel"], 9) for i in range(n_agents)]
    share_text = "/".join(percent(s) for s in share)
    cost_text = ", ".join(f"agent {i + 1} {percent(c)}" for i, c in enumerate(cost))
    if metrics["score"] <= 0:
        return f"no reward (progress shares {share_text})" if any(share) else "no reward (no progress events)"
    if min(cost) >= NECESSARY_DROP:
        return f"interdependent (removing any agent costs >= {percent(NECESSARY_DROP)}: {cost_text})"
    top = int(np.argmax(share))
    necessary = [i for i in range(n_agents) if cost[i] >= NECESSARY_DROP]
    carries = len(necessary) == 1 and all(cost[j] < DISPENSABLE_DROP for j in range(n_agents) if j != necessary[0])
    if share[top] >= SOLO_SHARE or carries:
        worker = top if share[top] >= SOLO_SHARE else necessary[0]
        others = [j for j in range(n_agents) if j != worker]
        if not others:
            return "solo (a one-agent team)"
        spare = min(others, key=lambda j: (cost[j], j))
        effect = f"costs {percent(cost[spare])}" if cost[spare] >= 0 else \
            f"raises the score by {percent(-cost[spare])}: it gets in the way"
        return f"solo (agent {worker + 1} does {percent(share[worker])} of progress; removing agent {spare + 1} " \
               f"{effect})"
    if max(cost) < DISPENSABLE_DROP:
        return (f"redundant (progress shares {share_text}; removing any one agent costs "
                f"< {percent(DISPENSABLE_DROP)}: {cost_text})")
    return f"mixed (progress shares {share_text}; removing an agent costs: {cost_text})"


# ----------------------------------------------------------------------------- counterfactual audits


def stand_in(name: str, agent: int, seed: int, rng_seed: int) -> Choose:
    """The agent in an ablated agent's place: 'idle' (the library's idle option) or 'random' (uniform over its menu)."""
    if name == "idle":
        return lambda runner, agent, menu: runner.library.idle()
    return random_choice(np.random.default_rng([rng_seed, agent, seed]))


def audit_with(play_team: Callable[[dict], list], n_agents: int, kinds: Sequence[str]) -> dict:
    """Metrics, the two ablations of every agent, and the summary (flat dict). play_team(stand_ins) plays the
    evaluation seeds with agent i replaced by stand_ins[i] ('idle' or 'random'; {}: the intact team)."""
    m = episode_metrics(play_team({}), n_agents, kinds)
    for i in range(n_agents):
        for name in ("idle", "random"):
            score = float(np.mean([ep.score for ep in play_team({i: name})]))
            drop = m["score"] - score
            m[f"agent{i}.ablation_{name}_score"] = score
            m[f"agent{i}.ablation_{name}_drop"] = drop
            m[f"agent{i}.ablation_{name}_drop_rel"] = drop / m["score"] if m["score"] > 0 else 0.0
    m["min_ablation_idle_drop_rel"] = min(m[f"agent{i}.ablation_idle_drop_rel"] for i in range(n_agents))
    m["summary"] = summarize(m, n_agents)
    return m


def audit_team(game: Game, library: Library, chooses: Sequence[Choose], seeds: Sequence[int],
               menu_filter=None, rng_seed: int = 0) -> dict:
    """audit_with for a team of `choose` functions (scripted, random, or policy_lib.llm_choose)."""
    if len(chooses) != game.n_agents:
        raise ValueError(f"expected one choose function per agent ({game.n_agents}), got {len(chooses)}")
    seeds = list(seeds)

    def play_team(stand_ins: dict) -> list:
        out = []
        for seed in seeds:
            team = [stand_in(stand_ins[i], i, seed, rng_seed) if i in stand_ins else c for i, c in enumerate(chooses)]
            out.append(run_episode(game, library, team_choose(team), seed, menu_filter))
        return out

    return audit_with(play_team, game.n_agents, library.kinds)


def audit_llm_team(policy: policy_lib.MenuPolicy, task: Task, agents: list[str | None], seeds: Sequence[int],
                   rng_seed: int = 0, temperature: float = 0.0, intact: list | None = None) -> dict:
    """audit_with for LLM agents (adapter names, None: the frozen base) through policy_lib.play, greedy or sampled
    at `temperature`; intact: the intact team's episodes on `seeds` when already played (train.py's), reused."""
    seeds = list(seeds)
    if intact is not None and len(intact) != len(seeds):
        raise ValueError(f"intact: expected the episodes of the {len(seeds)} audited seeds, in order")

    def play_team(stand_ins: dict) -> list:
        if not stand_ins and intact is not None:
            return intact
        team: list = list(agents)
        for i, name in stand_ins.items():  # one stand-in (and generator) per episode seed, as in audit_team
            per_seed = {s: stand_in(name, i, s, rng_seed) for s in seeds}
            team[i] = lambda runner, agent, menu, per_seed=per_seed: per_seed[runner.game.seed](runner, agent, menu)
        return policy_lib.episodes(policy_lib.eval_play(policy, task, seeds, team, rng_seed, temperature)[0])

    return audit_with(play_team, len(agents), task.library.kinds)


# ----------------------------------------------------------------------------- replays


def replay(game: Game, library: Library, chooses: Sequence[Choose], seed: int, menu_filter=None,
           gif: str | None = None) -> str:
    """One episode as ASCII frames, one at each decision point, with what each agent ran up to it; with `gif`, the
    same episode is also written there as an animation, one frame a primitive step (plumbing.replay_gif)."""
    steps: list[tuple[str, list[str], dict]] = []  # (render(), each agent's option, labels()) after every step

    def record(runner) -> None:
        ended = {None: "", True: " -> ok", False: " -> failed"}
        doing = ["-" if run is None else run.option.text + ended[run.success] for run in runner.running]
        steps.append((runner.game.render(), doing, runner.game.labels()))

    episode = run_episode(game, library, team_choose(chooses), seed, menu_filter, show=True,
                          on_step=record if gif else None)
    if gif:
        plumbing.replay_gif(steps, gif, f"{game.name}/{game.layout_name}, held-out start state {seed}")
    # run_episode draws a frame after each stretch of steps that ends when some agent must decide (or at
    # the end), i.e. at every later option start and at the last step
    times = [0] + sorted({x.start for x in episode.executions if x.start > 0} | {episode.steps})
    lines = [f"{game.name}/{game.layout_name} seed {seed}: score {episode.score:.2f}, {episode.steps} steps"]
    for t, frame in zip(times, episode.frames):
        last = frame.rsplit("\n", 1)
        lines += ["", last[0] if len(last) == 2 and last[1].startswith("1:") else frame]  # drop runner's line
        for x in sorted(episode.executions, key=lambda x: (x.agent, x.start)):
            if t == 0 and x.start == 0:
                lines.append(f"  agent {x.agent + 1}: {x.option.text}")
            elif x.start < t <= x.start + x.duration:
                ended = x.start + x.duration == t and x.success is not None
                outcome = f"-> {'ok' if x.success else 'failed'} ({x.reason})" if ended else "(running)"
                lines.append(f"  agent {x.agent + 1}: {x.option.text} {outcome}")
    return "\n".join(lines)


def write_replay(run_dir: str, policy: policy_lib.MenuPolicy, task: Task, seed: int, stem: str = "replay") -> str:
    """The loaded adapters' greedy episode from start state `seed` as RUN/{stem}.txt and RUN/{stem}.gif."""
    text = replay(task.new_game(), task.library, [policy_lib.llm_choose(policy, n) for n in policy.agents], seed,
                  task.menu_filter, gif=os.path.join(run_dir, f"{stem}.gif"))
    plumbing.write_file(os.path.join(run_dir, f"{stem}.txt"), text + "\n")
    return text


# ----------------------------------------------------------------------------- reports


def builtin_layouts(episodes: int):
    """(game name, layout, game, library, its first `episodes` distinct test start states) of every built-in layout."""
    for game_name, cls in envs.GAMES.items():
        for layout in cls.layouts:
            game = envs.make_game(game_name, layout)
            yield game_name, layout, game, make_library(game), envs.split_seeds(game, "test", episodes)


def reference_audits(episodes: int) -> list[dict]:
    """The scripted cooperative and solo teams (options.scripted_choice) on every built-in layout."""
    rows = []
    for game_name, layout, game, library, seeds in builtin_layouts(episodes):
        for team, solo in (("coop", False), ("solo", True)):
            result = audit_team(game, library, [scripted_choice(solo)] * game.n_agents, seeds)
            rows.append({"game": game_name, "layout": layout, "team": f"scripted {team}",
                         "solo_layout": layout in envs.GAMES[game_name].solo_layouts, **result})
    return rows


def default_columns(n_agents: int) -> list[str]:
    per_agent = ("progress_share", "idle_fraction", "ablation_idle_drop_rel")
    return ["score"] + [f"agent{i}.{key}" for key in per_agent for i in range(n_agents)] + \
        ["joint_events_per_episode", "summary"]


def table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """A markdown table of audit rows; by default game, layout and team (when present) and default_columns."""
    if columns is None:
        names = [c for c in ("game", "layout", "team") if any(c in row for row in rows)]
        columns = names + default_columns(max((row.get("n_agents", 2) for row in rows), default=2))

    def cell(value) -> str:
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def greedy_margins(policy: policy_lib.MenuPolicy, task: Task, seeds: Sequence[int]) -> list[dict]:
    """Why greedy play can fail where sampled play succeeds: each decision of greedy episodes on `seeds`, with its
    menu's entropy, argmax margin, outcome and failed streak (this choice failing in a row: a loop greedy play
    cannot leave)."""
    seeds = list(seeds)
    runners, steps = policy_lib.eval_play(policy, task, seeds, policy.agents, 0)
    outcome = {(r, x.agent, x.start): x for r, run in enumerate(runners) for x in run.executions}
    streak: dict[tuple[int, int], tuple[str, int]] = {}
    rows = []
    for st in sorted(steps, key=lambda st: (st.rollout, st.t, st.agent)):
        logp = st.old_logp.detach().float().cpu()  # (K,)
        top = logp.topk(min(2, len(logp))).values.tolist()  # argmax margin: top[0] - top[1], inf for one option
        text = st.decision.menu[st.choice]
        x = outcome.get((st.rollout, st.agent, st.t))
        failed = x is not None and x.success is False
        last, count = streak.get((st.rollout, st.agent), ("", 0))
        count = (count + 1 if last == text else 1) if failed else 0
        streak[st.rollout, st.agent] = (text, count)
        rows.append({"episode": st.rollout, "seed": seeds[st.rollout], "t": st.t, "agent": st.agent + 1,
                     "option": text, "menu": len(st.decision.menu), "entropy": float(-(logp.exp() * logp).sum()),
                     "margin": top[0] - top[1] if len(top) == 2 else float("inf"), "failed": failed,
                     "failed_streak": count, "score": runners[st.rollout].game.score})
    return rows


def margins_summary(rows: list[dict]) -> list[dict]:
    """Per episode: decisions, mean entropy and margin, failure rate, and the longest failed streak with its option."""
    out = []
    for episode in sorted({r["episode"] for r in rows}):
        ep = [r for r in rows if r["episode"] == episode]
        worst = max(ep, key=lambda r: r["failed_streak"])
        finite = [r["margin"] for r in ep if r["margin"] != float("inf")]
        out.append({"seed": ep[0]["seed"], "score": ep[0]["score"], "decisions": len(ep),
                    "entropy": float(np.mean([r["entropy"] for r in ep])),
                    "margin": float(np.mean(finite)) if finite else float("nan"),
                    "failed": float(np.mean([r["failed"] for r in ep])),
                    "longest_failed_streak": worst["failed_streak"],
                    "streak_option": f"agent {worst['agent']}: {worst['option']}" if worst["failed_streak"] else "-"})
    return out


def run_config(run_dir: str) -> dict:
    """A train.py run folder's config.json, checked for what an audit needs."""
    path = os.path.join(run_dir, "config.json")
    config = plumbing.read_json(path, "a run folder of train.py", f"{run_dir}: no readable config.json")
    needed = ("game", "layout", "action_mode", "device", "dtype", "model", "lora_rank", "lora_alpha", "lora_targets",
              "scoring", "seed")
    if not isinstance(config, dict) or any(k not in config for k in needed):
        raise plumbing.InputError(f"{path} is not a config of train.py (it needs {', '.join(needed)})")
    return config


def load_run(run_dir: str, device: str | None = None) -> tuple[dict, Task, policy_lib.MenuPolicy]:
    """(config, task, policy) of a train.py run folder: its menus (guards, --arrived), adapters still to load."""
    config = run_config(run_dir)
    return config, run_task(run_dir, config), run_policy(config, device)


def run_task(run_dir: str, config: dict) -> Task:
    """The Task a run trained on: its game, option library and menu filter (its guards.json, --arrived)."""
    probe = envs.make_game(config["game"], config["layout"], 0)
    library = make_library(probe, config["action_mode"], config.get("feedback", "none") == "failures")
    guards = guard_lib.load_guards(os.path.join(run_dir, "guards.json"), probe, library) \
        if config["action_mode"] == "options" else None
    menu_filter = run_menu_filter(library, guards.menu_filter if guards else None, config.get("arrived", "keep"))
    return Task(functools.partial(envs.make_game, config["game"], config["layout"], 0), library, menu_filter)


def run_policy(config: dict, device: str | None = None) -> policy_lib.MenuPolicy:
    """A run's backbone with one fresh LoRA adapter per agent (load_adapters or load_agents fills them)."""
    n_agents = envs.make_game(config["game"], config["layout"], 0).n_agents
    device = device or config["device"]  # a run trained on a GPU can be audited on the CPU (--device cpu)
    dtype = config["dtype"] if device.startswith("cuda") == config["device"].startswith("cuda") else "auto"
    backbone, tokenizer = plumbing.load_backbone(config["model"], device, dtype)
    lora = policy_lib.LoRA(rank=config["lora_rank"], alpha=config["lora_alpha"],
                           targets=policy_lib.parse_lora_targets(config["lora_targets"]),
                           layers=config.get("lora_layers", 0))
    return policy_lib.MenuPolicy(backbone, tokenizer, policy_lib.agent_names(n_agents), lora,
                                 scoring=config["scoring"], seed=config["seed"])


def audit_run(run_dir: str, episodes: int, temperature: float = 0.0, device: str | None = None) -> list[dict]:
    """Audit a run's frozen base and every snapshot on its first `episodes` test start states: RUN/audit.jsonl, .md
    (table and a greedy replay) and .png, or audit_T{temperature}.* for sampled teams."""
    config, task, policy = load_run(run_dir, device)
    seeds = envs.split_seeds(task.new_game(), "test", episodes)
    if len(seeds) < episodes:
        print(f"note: {config['game']}/{config['layout']} has only {len(seeds)} distinct test start states "
              f"(asked for {episodes}); using all {len(seeds)}")
    snap_dir = os.path.join(run_dir, "snapshots")
    found = os.listdir(snap_dir) if os.path.isdir(snap_dir) else []
    snapshots = sorted(n for n in found if re.fullmatch(r"iter_\d+", n))  # stray files are not snapshots
    rows = [{"iteration": 0, "team": "frozen base", "temperature": temperature,
             **audit_llm_team(policy, task, [None] * len(policy.agents), seeds, temperature=temperature)}]
    print(table(rows[-1:]), flush=True)
    for snap in snapshots:
        policy.load_adapters(os.path.join(snap_dir, snap))
        rows.append({"iteration": int(snap.split("_")[-1]), "team": f"adapters {snap}", "temperature": temperature,
                     **audit_llm_team(policy, task, policy.agents, seeds, temperature=temperature)})
        print(table(rows[-1:]), flush=True)
    stem = os.path.join(run_dir, "audit" if temperature <= 0 else f"audit_T{temperature:g}")
    plumbing.write_jsonl(stem + ".jsonl", rows)
    played = "greedy" if temperature <= 0 else f"sampled at temperature {temperature:g}"
    text = [f"# Audit of {run_dir} ({config['game']}/{config['layout']}, {len(seeds)} distinct test start states, "
            f"{played})", "", table(rows, ["iteration", "team"] + default_columns(len(policy.agents))), ""]
    if snapshots:
        chooses = [policy_lib.llm_choose(policy, n) for n in policy.agents]  # the last snapshot is loaded
        text += ["## Replay (last snapshot, greedy)", "", "```",
                 replay(task.new_game(), task.library, chooses, seeds[0], task.menu_filter, gif=stem + "_replay.gif"),
                 "```", f"Animated: `{os.path.basename(stem)}_replay.gif`.", ""]
    plumbing.write_file(stem + ".md", "\n".join(text))
    plumbing.plot_over_training(rows, stem + ".png", SOLO_SHARE, NECESSARY_DROP)
    return rows


def margins_report(run_dir: str, episodes: int, device: str | None = None) -> list[dict]:
    """greedy_margins of a run's final adapters: RUN/margins.jsonl (per decision) and margins.md (per episode)."""
    config, task, policy = load_run(run_dir, device)
    policy.load_adapters(os.path.join(run_dir, "adapters"))
    seeds = envs.split_seeds(task.new_game(), "test", episodes)
    rows = greedy_margins(policy, task, seeds)
    summary = margins_summary(rows)
    plumbing.write_jsonl(os.path.join(run_dir, "margins.jsonl"), rows)
    text = (f"# Greedy decisions of {run_dir} ({config['game']}/{config['layout']}, final adapters, "
            f"{len(seeds)} test start states)\n\n{table(summary, list(summary[0]))}\n")
    plumbing.write_file(os.path.join(run_dir, "margins.md"), text)
    print(text)
    return rows


def replay_run(run_dir: str, device: str | None = None, episode: int = 1) -> str:
    """Redraw a run's replay with its final adapters on its `episode`-th test start state (of those it was tested
    on): episode 1 is the one train.py's final audit plays (replay.txt/gif), another K goes to replay_testK.*."""
    tested = run_config(run_dir).get("eval_episodes")  # checked before any start state is scanned
    tested = tested if type(tested) is int and tested > 0 else 1
    if episode > tested:
        raise plumbing.InputError(f"--episode {episode}: {run_dir} was tested on {tested} start states; expected "
                                  f"1..{tested}")
    config, task, policy = load_run(run_dir, device)
    seeds = envs.split_seeds(task.new_game(), "test", episode)
    if len(seeds) < episode:
        raise plumbing.InputError(f"--episode {episode}: {config['game']}/{config['layout']} has only {len(seeds)} "
                                  f"distinct test start states; expected 1..{len(seeds)}")
    policy.load_adapters(os.path.join(run_dir, "adapters"))
    stem = "replay" if episode == 1 else f"replay_test{episode}"
    text = write_replay(run_dir, policy, task, seeds[episode - 1], stem)
    print(text)
    return text


def final_audit_rows(run_dirs: Sequence[str]) -> list[dict]:
    """One row per train.py run folder: its final audit (audit_final.json) with its game, layout and model."""
    rows, what = [], "a run folder of train.py with --audit-episodes > 0"
    for run_dir in run_dirs:
        context = f"{run_dir}: no readable config.json and audit_final.json"
        config, row = (plumbing.read_json(os.path.join(run_dir, name), what, context)
                       for name in ("config.json", "audit_final.json"))
        if not isinstance(config, dict) or config.get("game") not in envs.GAMES or not isinstance(row, dict):
            raise plumbing.InputError(f"{run_dir}: config.json or audit_final.json is not what train.py writes")
        cls = envs.GAMES[config["game"]]
        rows.append({"game": config["game"], "layout": config["layout"], "model": config["model"],
                     "advantage": config["advantage"], "solo_layout": config["layout"] in cls.solo_layouts, **row})
    return rows


# ----------------------------------------------------------------------------- cross-play and held-out partners


def finished_run(run_dir: str, last: bool = False, sweep: str | None = None) -> dict:
    """A finished train.py run, checked before any model loads: {"dir", "seed", "config", "result", "adapters"},
    adapters the folder of its selected checkpoint (snapshots/iter_N) or, with `last`, of its last adapters."""
    config = run_config(run_dir)
    path = os.path.join(run_dir, "result.json")
    if not os.path.isfile(path):
        raise plumbing.InputError(f"{run_dir}: no result.json (unfinished); expected a finished run of train.py "
                                  f"(train.py --resume {sweep or run_dir})")
    result = plumbing.read_json(path, "the result.json of train.py", run_dir)
    keys = ("selected_iteration", "selected_test_score", "last_test_score")
    if not isinstance(result, dict) or type(result.get(keys[0])) is not int or \
            not all(type(result.get(k)) in (int, float) for k in keys[1:]):
        raise plumbing.InputError(f"{run_dir}/result.json is not what train.py writes; expected {', '.join(keys)}")
    folder = os.path.join(run_dir, "adapters") if last else \
        os.path.join(run_dir, "snapshots", f"iter_{result['selected_iteration']:04d}")
    agents = policy_lib.agent_names(envs.make_game(config["game"], config["layout"], 0).n_agents)
    missing = [a for a in agents if not os.path.isfile(os.path.join(folder, a, "adapter_model.safetensors"))]
    if missing:
        which = "its last adapters" if last else f"the selected checkpoint (iteration {result['selected_iteration']})"
        raise plumbing.InputError(f"{folder}: no adapter of {', '.join(missing)}; expected {which} of a finished run "
                                  "of train.py")
    return {"dir": run_dir, "seed": config["seed"], "config": config, "result": result, "adapters": folder}


def sweep_runs(sweep: str, last: bool = False) -> list[dict]:
    """Every seed of a `train.py --seeds` sweep folder (sweep.json, seedK/) as a finished_run, all checked before
    any model loads: a missing seed, result.json or checkpoint, or runs that differ in more than SWEEP_FREE."""
    where = "a sweep folder of train.py --seeds"
    if not os.path.isdir(sweep):
        raise plumbing.InputError(f"{sweep}: not a folder; expected {where}")
    plan = plumbing.read_json(os.path.join(sweep, "sweep.json"), where, sweep)
    seeds = plan.get("seeds") if isinstance(plan, dict) else None
    if not isinstance(seeds, list) or len(seeds) < 2 or any(type(s) is not int for s in seeds):
        raise plumbing.InputError(f"{sweep}/sweep.json lists seeds {seeds!r}; expected a sweep of 2 or more seeds")
    for file, exists, what in (("", os.path.isdir, "no folder"),
                               ("result.json", os.path.isfile, "no result.json (unfinished)")):
        missing = [s for s in seeds if not exists(os.path.join(sweep, f"seed{s}", file))]
        if missing:
            seeds_have = f"seed {missing[0]} of sweep.json has" if len(missing) == 1 else \
                f"seeds {', '.join(map(str, missing))} of sweep.json have"
            raise plumbing.InputError(f"{sweep}: {seeds_have} {what}; expected every seed finished (train.py "
                                      f"--resume {sweep})")
    runs = [{**finished_run(os.path.join(sweep, f"seed{s}"), last, sweep), "seed": s} for s in seeds]
    first = runs[0]["config"]
    for run in runs[1:]:
        differ = sorted(k for k in set(first) | set(run["config"])
                        if k not in SWEEP_FREE and first.get(k) != run["config"].get(k))
        if differ:
            raise plumbing.InputError(f"{sweep}: seeds {runs[0]['seed']} and {run['seed']} differ in "
                                      f"{', '.join(differ)}; expected the runs of one sweep, which differ only in "
                                      f"{', '.join(SWEEP_FREE)}")
    return runs


def seat_filter(filters: Sequence) -> Callable | None:
    """A menu filter giving agent i the menus of filters[i] (None: whole menus): each agent its own run's guards."""
    if all(f is None for f in filters):
        return None
    return lambda game, agent, menu: menu if filters[agent] is None else filters[agent](game, agent, menu)


def load_agents(policy: policy_lib.MenuPolicy, folders: Sequence[str]) -> None:
    """policy.agents[i]'s adapter from folders[i] (staged in one folder: load_adapters reads all from one)."""
    with tempfile.TemporaryDirectory() as staging:
        for agent, folder in zip(policy.agents, folders, strict=True):
            shutil.copytree(os.path.join(folder, agent), os.path.join(staging, agent))
        policy.load_adapters(staging)


def mean_score(episodes: list) -> float:
    return float(np.mean([ep.score for ep in episodes]))


def who_works(summary: str) -> str:
    """An audit summary in a few words, naming the worker of a solo team: 'solo (agent 2 works)'."""
    label = next(label for label in LABELS if summary.startswith(label))
    worker = re.match(r"solo \(agent (\d+) does", summary)
    return f"solo (agent {worker.group(1)} works)" if worker else label


def cross_play(sweep: str, last: bool = False, device: str | None = None) -> dict:
    """Cross-play of a sweep's selected checkpoints, or last adapters (module docstring), with each pair's audit
    label on the first audit_episodes start states (its intact episodes reused). Writes SWEEP/crossplay.json, .md,
    .png (crossplay_last.* with `last`) and crossplay_replay.txt/.gif: the worst episode of the worst cross pair
    below COMPETENT, if one is."""
    t0 = time.perf_counter()
    runs = sweep_runs(sweep, last)
    config = runs[0]["config"]
    tasks = [run_task(run["dir"], run["config"]) for run in runs]
    probe = tasks[0].new_game()
    if probe.n_agents != 2:
        raise plumbing.InputError(f"{sweep}: {probe.n_agents}-agent runs; expected two agents to pair")
    seeds = envs.split_seeds(probe, "test", config["eval_episodes"])  # the start states of each run's final test
    audited = seeds[:config["audit_episodes"]]
    scripted = mean_score([run_episode(probe, make_library(probe), scripted_choice(), s) for s in seeds])
    which = "last_test_score" if last else "selected_test_score"
    policy = run_policy(config, device)

    def seat(i: int, j: int) -> Task:  # agent 1 from seed i, agent 2 from seed j, each with its own run's menus
        load_agents(policy, [runs[i]["adapters"], runs[j]["adapters"]])
        return Task(tasks[i].new_game, tasks[i].library, seat_filter([tasks[i].menu_filter, tasks[j].menu_filter]))

    pairs = []
    for i, one in enumerate(runs):
        for j, two in enumerate(runs):
            t1 = time.perf_counter()
            task = seat(i, j)
            runners, _ = policy_lib.eval_play(policy, task, seeds, policy.agents, one["config"]["seed"])
            episodes = policy_lib.episodes(runners)
            pair = {"agent1_seed": one["seed"], "agent2_seed": two["seed"], "score": mean_score(episodes),
                    "scores": [ep.score for ep in episodes]}
            if i == j:  # self-play: the run's own final test, episode for episode
                pair["result_json"] = one["result"][which]
                pair["reproduces_result"] = abs(pair["score"] - pair["result_json"]) <= 1e-9
                if not pair["reproduces_result"]:
                    print(f"warning: seed {one['seed']} with itself scores {pair['score']:.4f} here and "
                          f"{pair['result_json']:.4f} in its result.json ({which}); expected the same episodes "
                          "(another device, dtype, thread count or library version?)")
            if audited:
                row = audit_llm_team(policy, task, policy.agents, audited, one["config"]["seed"],
                                     intact=episodes[:len(audited)])
                pair.update({"label": who_works(row["summary"]), "audit": row["summary"],
                             **{f"agent{k}.{key}": row[f"agent{k}.{key}"] for k in range(2)
                                for key in ("progress_share", "idle_fraction", "ablation_idle_drop_rel")}})
            pair["seconds"] = round(time.perf_counter() - t1, 1)
            pairs.append(pair)
            print(f"agent 1 of seed {one['seed']} + agent 2 of seed {two['seed']}: score {pair['score']:.3f}"
                  + (f", {pair['label']}" if audited else "") + f" ({pair['seconds']:.0f}s)", flush=True)
    n = len(runs)
    matrix = [[pairs[i * n + j]["score"] for j in range(n)] for i in range(n)]
    self_scores = [matrix[i][i] for i in range(n)]
    cross_scores = [matrix[i][j] for i in range(n) for j in range(n) if i != j]
    out = {"sweep": sweep, "game": config["game"], "layout": config["layout"],
           "checkpoint": "last" if last else "selected", "test_states": len(seeds), "audit_states": len(audited),
           "seeds": [run["seed"] for run in runs], "matrix": matrix, "scripted_score": scripted,
           "self_play": plumbing.mean_and_ci(self_scores), "cross_play": plumbing.mean_and_ci(cross_scores),
           "gap": float(np.mean(self_scores) - np.mean(cross_scores)),
           "competent_self": sum(s >= COMPETENT * scripted for s in self_scores),
           "competent_cross": sum(s >= COMPETENT * scripted for s in cross_scores),
           "reproduces_results": all(p.get("reproduces_result", True) for p in pairs), "pairs": pairs}
    stem = os.path.join(sweep, "crossplay_last" if last else "crossplay")
    worst = worst_cross_episode(pairs, n, COMPETENT * scripted)
    if worst:  # what a failed cross-play pair does: its worst episode, replayed (txt and gif)
        i, j, episode = worst
        write_replay(sweep, policy, seat(i, j), seeds[episode], os.path.basename(stem) + "_replay")
        out["replay"] = {"agent1_seed": runs[i]["seed"], "agent2_seed": runs[j]["seed"], "start_state": seeds[episode],
                         "score": pairs[i * n + j]["scores"][episode], "file": os.path.basename(stem) + "_replay.txt"}
    else:  # no failed pair: an earlier run's replay would contradict this crossplay.json
        for old in (stem + "_replay.txt", stem + "_replay.gif"):
            if os.path.exists(old):
                os.remove(old)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    plumbing.write_json(stem + ".json", out)
    plumbing.write_file(stem + ".md", cross_play_markdown(out, os.path.basename(stem)))
    plot_cross_play(out, stem + ".png")
    print(f"self-play {plumbing.mean_ci(out['self_play'])}, cross-play {plumbing.mean_ci(out['cross_play'])}, gap "
          f"{out['gap']:.3f}; {stem}.md ({out['seconds']:.0f}s)")
    return out


def worst_cross_episode(pairs: list[dict], n: int, bar: float) -> tuple[int, int, int] | None:
    """(i, j, episode) of the lowest-scoring cross pair (i != j; pairs[i * n + j]) below `bar` and of its
    lowest-scoring episode, the first of equals; None when every cross pair reaches `bar`."""
    failed = [k for k, p in enumerate(pairs) if k // n != k % n and p["score"] < bar]
    if not failed:
        return None
    k = min(failed, key=lambda k: pairs[k]["score"])
    return k // n, k % n, int(np.argmin(pairs[k]["scores"]))


def cross_play_markdown(out: dict, stem: str) -> str:
    seeds, n, last = out["seeds"], len(out["seeds"]), out["checkpoint"] == "last"

    def grid(cell: Callable[[int, int], str]) -> list[str]:  # a seed x seed table
        return ["| agent 1 of \\ agent 2 of | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                "| --- |" + " --- |" * n,
                *(f"| seed {s} | " + " | ".join(cell(i, j) for j in range(n)) + " |" for i, s in enumerate(seeds))]

    lines = [f"# Cross-play of {out['sweep']} ({out['game']}/{out['layout']}, "
             f"{'last adapters' if last else 'selected checkpoints'}, greedy)", "",
             f"`python audit.py --cross-play {out['sweep']}{' --last' if last else ''}` ({out['seconds'] / 60:.1f} "
             "min). Agent 1 of the row's seed with agent 2 of the column's, each with the menus (guards) of its own "
             f"run, on the {out['test_states']} test start states of every run's final test.", "",
             f"**Self-play** (the diagonal, {n} pairs): {plumbing.mean_ci(out['self_play'])}; **cross-play** (off "
             f"the diagonal, {n * (n - 1)} pairs): {plumbing.mean_ci(out['cross_play'])}; **gap** "
             f"{out['gap']:.3f}. Competent pairs (>= {COMPETENT} x the scripted team's {out['scripted_score']:.3f}): "
             f"self-play {out['competent_self']}/{n}, cross-play {out['competent_cross']}/{n * (n - 1)}. 95% "
             "bootstrap CIs over pairs; pairs that share a seed are not independent, so they understate the "
             "spread over seeds.", "",
             f"The diagonal reproduces each seed's result.json ({'last' if last else 'selected'}_test_score): "
             f"{'yes' if out['reproduces_results'] else '**no** (see the warnings in crossplay.json)'}.", "",
             *grid(lambda i, j: f"**{out['matrix'][i][j]:.3f}**" if i == j else f"{out['matrix'][i][j]:.3f}"),
             "", f"Heatmap: `{stem}.png`.", ""]
    if "replay" in out:
        r = out["replay"]
        lines += [f"The worst cross-play pair below {COMPETENT} x the scripted team (agent 1 of seed "
                  f"{r['agent1_seed']} with agent 2 of seed {r['agent2_seed']}), replayed on its worst test start "
                  f"state ({r['start_state']}, scored {r['score']:.3f} in the matrix): `{r['file']}` and `.gif`.", ""]
    if out["audit_states"]:
        labels = [p["label"] for p in out["pairs"]]
        count = {"self-play": labels[::n + 1], "cross-play": [v for k, v in enumerate(labels) if k // n != k % n]}
        lines += [f"## Who works (audit.py labels on the first {out['audit_states']} test start states)", "",
                  "; ".join(f"{k}: " + ", ".join(f"{label} {v.count(label)}" for label in sorted(set(v)))
                            for k, v in count.items()) + ".", "", *grid(lambda i, j: labels[i * n + j]), ""]
    return "\n".join(lines)


def plot_cross_play(out: dict, path: str) -> None:
    """The cross-play matrix as a heatmap, the self-play diagonal outlined."""
    from matplotlib.patches import Rectangle

    matrix, seeds = np.asarray(out["matrix"], float), out["seeds"]  # (S, S)
    n, top = len(seeds), max(1.0, float(matrix.max()))
    fig = plumbing.new_figure(figsize=(2.4 + 0.9 * n, 1.0 + 0.8 * n))
    ax = fig.subplots()
    image = ax.imshow(matrix, vmin=0.0, vmax=top, cmap="viridis")
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if matrix[i, j] > 0.6 * top else "white")
        ax.add_patch(Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_xticks(range(n), [str(s) for s in seeds])
    ax.set_yticks(range(n), [str(s) for s in seeds])
    ax.set(xlabel="seed of agent 2", ylabel="seed of agent 1")
    ax.set_title(f"{out['game']}/{os.path.basename(out['layout'])}: self {out['self_play']['mean']:.2f}, "
                 f"cross {out['cross_play']['mean']:.2f}", fontsize=9)
    fig.colorbar(image, ax=ax, label="greedy test score")
    plumbing.save_figure(fig, path, dpi=120, bbox_inches="tight")


def partner_reference(game: Game, library: Library, seeds: Sequence[int]) -> dict:
    """The scripted teams on `seeds` (whole menus): the standard team's mean score, and each held-out partner's
    (and 'standard') with the standard partner: name -> [score with the partner in seat 1, in seat 2]."""

    def score(choose: Choose) -> float:
        return mean_score([run_episode(game, library, choose, s) for s in seeds])

    def with_standard(name: str, seat: int) -> Choose:  # partner `name` in `seat`, the standard one in the other
        return team_choose([variant_choice(name) if k == seat else scripted_choice() for k in range(2)])

    return {"standard_team": score(scripted_choice()),
            "partners": {name: [score(with_standard(name, seat)) for seat in range(2)]
                         for name in ("standard", *library.variants)}}


def partner_solves(reference: dict, name: str, seat: int) -> bool:
    """Whether partner `name` in `seat` reaches COMPETENT x the standard team's score with the standard partner:
    only then does a failed pairing with a trained agent count against the trained agent."""
    return reference["partners"][name][seat] >= COMPETENT * reference["standard_team"]


def variant_rows(episodes: int) -> list[dict]:
    """Each held-out partner with the standard one, in either seat, on every built-in layout (--variants)."""
    rows = []
    for game_name, layout, game, library, seeds in builtin_layouts(episodes):
        reference = partner_reference(game, library, seeds)
        for name, does in library.variants.items():
            rows.append({"game": game_name, "layout": layout, "partner": name, "what it does": does,
                         "in seat 1": reference["partners"][name][0], "in seat 2": reference["partners"][name][1],
                         "standard team": reference["standard_team"],
                         "solves": all(partner_solves(reference, name, seat) for seat in range(2))})
    return rows



def held_out_partners(target: str, device: str | None = None) -> dict:
    """Each trained agent (selected checkpoint) of a run, or of every seed of a sweep, with each scripted partner
    (module docstring), greedy, on the run's test start states. Writes TARGET/partners.json and partners.md."""
    t0 = time.perf_counter()
    if not os.path.isdir(target):
        raise plumbing.InputError(f"{target}: not a folder; expected a run or sweep folder of train.py")
    runs = sweep_runs(target) if os.path.exists(os.path.join(target, "sweep.json")) else [finished_run(target)]
    config = runs[0]["config"]
    probe = envs.make_game(config["game"], config["layout"], 0)
    if probe.n_agents != 2 or config["action_mode"] != "options":
        raise plumbing.InputError(f"{target}: {probe.n_agents} agents over {config['action_mode']}; expected a "
                                  "two-agent run over options (the scripted partners choose options)")
    library = make_library(probe)
    seeds = envs.split_seeds(probe, "test", config["eval_episodes"])
    reference = partner_reference(probe, library, seeds)
    standard = reference["standard_team"]
    for name, (seat1, seat2) in reference["partners"].items():
        print(f"partner {name} with the standard partner: {seat1:.3f} in seat 1, {seat2:.3f} in seat 2 (standard "
              f"team {standard:.3f})")
    policy = run_policy(config, device)
    rows = []
    for run in runs:
        task = run_task(run["dir"], run["config"])
        policy.load_adapters(run["adapters"])
        for seat in range(2):  # the trained agent's own seat (its guards); the partner plays the other (whole menus)
            played = Task(task.new_game, task.library, seat_filter([task.menu_filter if k == seat else None
                                                                    for k in range(2)]))
            for name in reference["partners"]:
                agents = [policy.agents[k] if k == seat else variant_choice(name) for k in range(2)]
                runners, _ = policy_lib.eval_play(policy, played, seeds, agents, run["config"]["seed"])
                score = mean_score(policy_lib.episodes(runners))
                rows.append({"seed": run["seed"], "trained_agent": seat + 1, "partner": name, "score": score,
                             "normalized": score / standard if standard else 0.0,
                             "evidence": partner_solves(reference, name, 1 - seat)})
                print(f"seed {run['seed']}: trained agent {seat + 1} with {name}: score {score:.3f}", flush=True)
    summary = {}
    for name in reference["partners"]:
        mine = [r for r in rows if r["partner"] == name and r["evidence"]]
        summary[name] = {"both": plumbing.mean_and_ci([r["normalized"] for r in mine]),
                         "competent": sum(r["normalized"] >= COMPETENT for r in mine), "pairings": len(mine),
                         **{f"agent{k}": plumbing.mean_and_ci([r["normalized"] for r in mine
                                                               if r["trained_agent"] == k]) for k in (1, 2)}}
    out = {"target": target, "game": config["game"], "layout": config["layout"], "test_states": len(seeds),
           "seeds": [run["seed"] for run in runs], "reference": reference,
           "partners": {name: library.variants.get(name, "options.scripted_choice(): the project's scripted "
                                                          "teammate") for name in reference["partners"]},
           "summary": summary, "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    plumbing.write_json(os.path.join(target, "partners.json"), out)
    plumbing.write_file(os.path.join(target, "partners.md"), partners_markdown(out))
    print(f"{os.path.join(target, 'partners.md')} ({out['seconds']:.0f}s)")
    return out


def partners_markdown(out: dict) -> str:
    reference, n = out["reference"], len(out["seeds"])
    lines = [f"# Held-out partners of {out['target']} ({out['game']}/{out['layout']}, selected checkpoints, greedy)",
             "", f"`python audit.py --partners {out['target']}` ({out['seconds'] / 60:.1f} min). Each trained agent "
             "plays in its own seat (its own guards) with a scripted partner in the other (whole menus) on the "
             f"{out['test_states']} test start states of the final test; scores are normalized by the standard "
             f"scripted team's on the same states ({reference['standard_team']:.3f}). The held-out partners were "
             f"written before any trained agent played with them. A partner below {COMPETENT} x the standard team "
             "with the standard partner in the same seats cannot tell a trained agent's failure from its own: "
             "those pairings are marked and left out of the means.", "",
             "| partner | what it does | with the standard partner: partner in seat 1 | partner in seat 2 |",
             "| --- | --- | --- | --- |"]
    for name, does in out["partners"].items():
        scores = [f"{s:.3f}" + ("" if partner_solves(reference, name, k) else " (fails: no evidence)")
                  for k, s in enumerate(reference["partners"][name])]
        lines.append(f"| {name} | {does} | {scores[0]} | {scores[1]} |")
    lines += ["", f"Normalized score, mean [95% bootstrap CI] over seeds ({n}), or over seeds and seats (both); "
              f"competent: >= {COMPETENT}.", "",
              "| partner | trained agent 1 (partner in seat 2) | trained agent 2 (partner in seat 1) | both | "
              "competent pairings |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {name} | {plumbing.mean_ci(s['agent1'])} | {plumbing.mean_ci(s['agent2'])} | "
              f"{plumbing.mean_ci(s['both'])} | {s['competent']}/{s['pairings']} |"
              for name, s in out["summary"].items()]
    lines += ["", "| seed | trained agent | partner | score | normalized | evidence |", "|" + " --- |" * 6]
    lines += [f"| {r['seed']} | {r['trained_agent']} | {r['partner']} | {r['score']:.3f} | {r['normalized']:.3f} | "
              f"{'yes' if r['evidence'] else 'no'} |" for r in out["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = plumbing.ArgumentParser(description="Behavioral audits: who does the work, and what each agent "
                                                 "is worth counterfactually.")
    add = parser.add_argument
    add("run_dir", nargs="?", help="a train.py run folder: audit its frozen base and snapshots over training")
    add("--reference", action="store_true", help="audit the scripted coop and solo teams on every built-in layout")
    add("--final", nargs="+", metavar="RUN_DIR", help="one table row per run folder from train.py's final audit")
    add("--seeds", type=plumbing.number(1, 100_000, integer=True), default=10,
        help="episodes: the first N distinct test start states of each layout")
    add("--temperature", type=plumbing.number(0, 100), default=0.0,
        help="a run's teams: 0 plays them greedily (audit.*), T > 0 samples at T (audit_T{T}.*)")
    add("--device", help="a run's audit: cpu, cuda or cuda:N (default: the run's)")
    add("--decoupling", nargs="+", metavar="LABEL=SWEEP", help="the decoupling figure of sweeps audited over "
        "training, e.g. solo=runs/coop_push-small_boxes-seeds coop=runs/coop_push-heavy_only-seeds")
    add("--figure", default="decoupling.png", help="where --decoupling writes its PNG")
    add("--margins", metavar="RUN_DIR", help="greedy decisions of the final adapters: entropy, argmax margin, failed "
        "streaks (margins.jsonl/md)")
    add("--replay", metavar="RUN_DIR", help="redraw the final adapters' greedy episode (RUN_DIR/replay.txt, .gif)")
    add("--episode", type=plumbing.number(1, 100_000, integer=True),
        help="--replay: the K-th test start state instead of the first (replay_testK.txt/gif)")
    add("--cross-play", metavar="SWEEP", help="agent 1 of every seed of a train.py --seeds sweep with agent 2 of every "
        "seed (SWEEP/crossplay.json, .md, .png; crossplay_replay.txt/gif: the worst failed cross pair's worst episode)")
    add("--last", action="store_true", help="--cross-play: the last adapters, not the selected checkpoints")
    add("--partners", metavar="RUN_OR_SWEEP", help="each trained agent (selected checkpoint) with the standard and "
        "the held-out scripted partners in the other seat (partners.json, .md)")
    add("--variants", action="store_true", help="each held-out scripted partner with the standard one, either seat, "
        "on every built-in layout")
    cli = parser.parse_args(argv)
    if cli.episode is not None and not cli.replay:
        raise plumbing.InputError(f"--episode {cli.episode} applies to --replay RUN_DIR only")
    if cli.last and not cli.cross_play:
        raise plumbing.InputError("--last applies to --cross-play SWEEP only")
    if sum(map(bool, (cli.run_dir, cli.final, cli.reference, cli.decoupling, cli.margins, cli.replay, cli.cross_play,
                      cli.partners, cli.variants))) > 1:
        raise plumbing.InputError("RUN_DIR, --final, --reference, --decoupling, --margins and --replay are different "
                                  "audits, and so are --cross-play, --partners and --variants; expected one of them")
    for flag, finished in (("--margins", cli.margins), ("--replay", cli.replay)):
        if finished and not os.path.isdir(os.path.join(finished, "adapters")):
            raise plumbing.InputError(f"{flag} {finished}: no adapters/ folder; expected a finished run folder of "
                                      "train.py")
    if cli.device is not None:
        plumbing.check_device(cli.device)
    if cli.margins:
        margins_report(cli.margins, cli.seeds, cli.device)
    elif cli.replay:
        replay_run(cli.replay, cli.device, cli.episode or 1)
    elif cli.decoupling:
        pairs = [item.partition("=") for item in cli.decoupling]
        if any(not label or not sep or not sweep for label, sep, sweep in pairs):
            raise plumbing.InputError(f"--decoupling {' '.join(cli.decoupling)}: expected LABEL=SWEEP_FOLDER items")
        plumbing.check_output_file(cli.figure, "--figure")
        plumbing.plot_decoupling({label: sweep for label, _, sweep in pairs}, cli.figure)
        print(f"wrote {cli.figure}")
    elif cli.temperature > 0 and not cli.run_dir:
        raise plumbing.InputError("--temperature applies to a RUN_DIR audit only (--final reads saved greedy audits, "
                                  "--reference plays scripted teams)")
    elif cli.cross_play:
        cross_play(cli.cross_play, cli.last, cli.device)
    elif cli.partners:
        held_out_partners(cli.partners, cli.device)
    elif cli.variants:
        print(table(variant_rows(cli.seeds), ["game", "layout", "partner", "in seat 1", "in seat 2", "standard team",
                                              "solves", "what it does"]))
    elif cli.run_dir:
        if not os.path.isdir(cli.run_dir):
            raise plumbing.InputError(f"{cli.run_dir}: not a folder; expected a run folder of train.py")
        audit_run(cli.run_dir, cli.seeds, cli.temperature, cli.device)
    elif cli.final:
        print(table(final_audit_rows(cli.final), ["game", "layout", "solo_layout", "model", "advantage"]
                    + default_columns(2)))
    elif cli.reference:
        print(table(reference_audits(cli.seeds), ["game", "layout", "team", "solo_layout"] + default_columns(2)))
    else:
        parser.print_help()


if __name__ == "__main__":
    plumbing.run_cli(main)
