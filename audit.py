"""Behavioral audits: reward is not cooperation (the paper's second finding).

A rising reward curve may only mean that one agent learned to run the whole task while its partner idles.
This file measures who did the work, from the events each game attributes to the agents that caused them
(envs.py), over evaluation episodes on fixed seeds, and what each agent is worth counterfactually.

Metrics (`episode_metrics`, pooled over all episodes; a ratio whose denominator is 0 is 0):
- `agentI.progress_share`: agent I's share of task-progress events (`progress_events`): PROGRESS_KINDS (a
  box moved toward the goal or delivered, a food loaded, an onion put in a pot, a soup plated or served),
  and counter moves only when they pass an item on (a take that is a hand-off, a place whose item the
  partner takes next: putting one's own dish down and taking it back is no progress). An event of two
  agents counts once for each and shares are normalized by the sum of those counts, so they sum to 1 (a
  team whose every event is joint gets 0.5 / 0.5). JOINT_KINDS markers are not counted: each repeats a
  progress event of the same step. `agentI.reward_share`: the same over REWARD_KINDS only.
- `agentI.idle_fraction`: the fraction of primitive steps agent I spent in `wait` options or in options that
  failed (timeouts included); an option still running at the end counts as busy unless it is a `wait`.
- `agentI.usage.KIND`: the fraction of agent I's option executions of each option type (by count).
- `agentI.failure_rate`: failed / finished executions, `wait` excluded (a wait never fails).
- `joint_events_per_episode`: joint_push, joint_load and handoff events per episode.
- `overlap_fraction`: the fraction of steps in which two agents run options with the same first argument,
  whatever the option type (`goto box 2` and `push box 2 north`).
- Counterfactual value (`audit_team`, `audit_llm_team`): the same seeds re-run with agent I replaced by an
  idle agent (always `wait`, which still steps aside when next to its partner) and, separately, by a
  uniformly random agent over its (guarded) menu. `agentI.ablation_idle_drop` is the drop of the mean
  normalized score, `..._drop_rel` that drop over the intact team's score (0 when that is 0). A negative
  drop means the team does better without that agent.

Summary (`summarize`), checked in this order; agents are numbered from 1 in text, as on the map:
- "no reward": the intact team scores 0, so there is nothing to lose by removing an agent.
- "interdependent": removing any one agent costs >= NECESSARY_DROP (50%) of the score.
- "solo": one agent does >= SOLO_SHARE (90%) of the progress, or it alone is necessary (removing it costs
  >= 50%) while removing any other costs < DISPENSABLE_DROP (10%).
- "redundant": all agents work but removing any one costs < 10%: each could do the task alone.
- "mixed": anything else.
Audits are deterministic when the `choose` functions are: each random stand-in draws from a generator
seeded by (rng_seed, agent, episode seed).

Run `python audit.py --reference` (the scripted teams on every built-in layout), `RUN_DIR` (a run's frozen
base and snapshots over training, greedy; `--temperature T` samples the teams, which may score only when
sampled), `--final RUN_DIR...` (one row per run from train.py's final audit), `--decoupling LABEL=SWEEP...`
(the decoupling figure), `--margins RUN_DIR` (greedy argmax margins and failed streaks) or `--replay RUN_DIR
[--episode K]` (redraw a run's replay); `--seeds N`: the first N test start states.
Test: `pytest test_all.py -k "audit or replay or margins or decoupling"`.
Needs envs (games, events), options (runner, Task, scripted teams), policy (LLM teams, the lockstep `play`),
guards (a run's menus) and plumbing (files, errors, CLI, figures); never pamagrpo or train: an audit needs no
training algorithm.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Sequence

import numpy as np

import envs
from envs import Game
import guards as guard_lib
from options import Library, Task, make_library, random_choice, run_episode, run_menu_filter, scripted_choice
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

Choose = Callable  # (runner, agent, menu) -> Option, as options.run_episode expects


def team_choose(chooses: Sequence[Choose]) -> Choose:
    """One `choose` for run_episode from one function per agent."""
    return lambda runner, agent, menu: chooses[agent](runner, agent, menu)


# ----------------------------------------------------------------------------- metrics from episodes


def shares(events: list, n_agents: int, kinds: Sequence[str]) -> list[float]:
    """Each agent's share of the events of `kinds` it took part in (a two-agent event counts once for each,
    and the shares are normalized by the sum of those counts); all 0 without such events."""
    counts = [0] * n_agents
    for _, kind, agents, _ in events:
        if kind in kinds:
            for i in agents:
                counts[i] += 1
    total = sum(counts)
    return [c / total if total else 0.0 for c in counts]


def progress_events(events: list) -> list:
    """One episode's events (t, kind, agents, obj) that moved the task forward (module docstring): a counter take
    is a hand-off when a 'handoff' event at that step and cell names the taker."""
    handoffs = {(t, agents[1], cell) for t, kind, agents, cell in events if kind == "handoff"}
    kept = []
    for n, (t, kind, agents, obj) in enumerate(events):
        if kind == "counter_take":
            if (t, agents[0], obj) not in handoffs:
                continue
        elif kind == "counter_place":
            taker = next((e[2][0] for e in events[n + 1:] if e[1] == "counter_take" and e[3] == obj), None)
            if taker is None or taker == agents[0]:
                continue
        elif kind not in PROGRESS_KINDS:
            continue
        kept.append((t, kind, agents, obj))
    return kept


def overlap_steps(executions: list, n_agents: int, steps: int) -> int:
    """Steps in which two agents run options with the same first argument (the same box, food or pot)."""
    target: list[list] = [[None] * steps for _ in range(n_agents)]  # (agent, step) -> object or None
    for x in executions:
        if x.option.kind != "wait" and x.option.args:
            for t in range(x.start, min(x.start + x.duration, steps)):
                target[x.agent][t] = x.option.args[0]
    count = 0
    for t in range(steps):
        objects = [target[i][t] for i in range(n_agents) if target[i][t] is not None]
        count += len(objects) != len(set(objects))
    return count


def episode_metrics(episodes: list, n_agents: int, kinds: Sequence[str]) -> dict:
    """The flat metrics dict (module docstring) of episodes with .score, .total_reward, .steps,
    .executions and .events, as options.Episode; `kinds` are the option types to report usage for."""
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
    """The agent put in an ablated agent's place: 'idle' (always the library's idle option: wait, or stay over
    primitives) or 'random' (uniform over its menu, with a generator seeded by (rng_seed, agent, episode seed))."""
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
    """audit_with for LLM agents (adapter names, or None for the frozen base) batched through policy_lib.play:
    greedy, or sampled at `temperature` with generators seeded by (rng_seed, episode seed). intact: the intact
    team's episodes on these seeds when already played (train.py's final evaluation), so they are reused."""
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
        gens = [policy_lib.sampling_generator(rng_seed, policy_lib.EVAL_ITERATION, s, 0) for s in seeds]
        runners, _ = policy_lib.play(task, seeds, policy, team, temperature, gens)
        return policy_lib.episodes(runners)

    return audit_with(play_team, len(agents), task.library.kinds)


# ----------------------------------------------------------------------------- replays


def replay(game: Game, library: Library, chooses: Sequence[Choose], seed: int, menu_filter=None,
           gif: str | None = None) -> str:
    """One episode as ASCII frames, one at each decision point, with what each agent ran up to it; with `gif`, the
    same episode is also written there as an animation, one frame a primitive step (plumbing.replay_gif)."""
    steps: list[tuple[str, list[str], dict]] = []  # (render(), each agent's option, labels()) after every step

    def record(runner) -> None:
        doing = []
        for run in runner.running:
            ended = "" if run is None or run.success is None else (" -> ok" if run.success else " -> failed")
            doing.append("-" if run is None else run.option.text + ended)
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


# colours of the map characters of every game's render() (agents are drawn as numbered discs on top)


def write_replay(run_dir: str, policy: policy_lib.MenuPolicy, task: Task, seed: int, stem: str = "replay") -> str:
    """The loaded adapters' greedy episode from start state `seed`: RUN/{stem}.txt and the same episode as
    RUN/{stem}.gif (train.py's final audit; `audit.py --replay`)."""
    text = replay(task.new_game(), task.library, [policy_lib.llm_choose(policy, n) for n in policy.agents], seed,
                  task.menu_filter, gif=os.path.join(run_dir, f"{stem}.gif"))
    plumbing.write_file(os.path.join(run_dir, f"{stem}.txt"), text + "\n")
    return text


# ----------------------------------------------------------------------------- reports


def reference_audits(episodes: int) -> list[dict]:
    """The scripted cooperative and solo teams (options.scripted_choice) on every built-in layout, on its first
    `episodes` distinct test start states."""
    rows = []
    for game_name, cls in envs.GAMES.items():
        for layout in cls.layouts:
            game = envs.make_game(game_name, layout)
            seeds = envs.split_seeds(game, "test", episodes)
            library = make_library(game)
            for team, solo in (("coop", False), ("solo", True)):
                result = audit_team(game, library, [scripted_choice(solo)] * game.n_agents, seeds)
                rows.append({"game": game_name, "layout": layout, "team": f"scripted {team}",
                             "solo_layout": layout in cls.solo_layouts, **result})
    return rows


def default_columns(n_agents: int) -> list[str]:
    per_agent = ("progress_share", "idle_fraction", "ablation_idle_drop_rel")
    return ["score"] + [f"agent{i}.{key}" for key in per_agent for i in range(n_agents)] + \
        ["joint_events_per_episode", "summary"]


def table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """A markdown table of audit rows; by default game/layout/team (when present), score, progress share,
    idle fraction and relative idle-ablation drop per agent, joint events per episode and the summary."""
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
    """Why greedy play can fail where sampled play succeeds: every decision of greedy episodes on `seeds`, with
    the menu's entropy, the argmax margin, the chosen option, whether it failed, and its failed streak: how many
    times in a row this agent chose this option and saw it fail (a loop greedy play cannot leave)."""
    seeds = list(seeds)
    gens = [policy_lib.sampling_generator(0, policy_lib.EVAL_ITERATION, s, 0) for s in seeds]
    runners, steps = policy_lib.play(task, seeds, policy, policy.agents, 0.0, gens)
    outcome = {(r, x.agent, x.start): x for r, run in enumerate(runners) for x in run.executions}
    streak: dict[tuple[int, int], tuple[str, int]] = {}
    rows = []
    for st in sorted(steps, key=lambda st: (st.rollout, st.t, st.agent)):
        logp = st.old_logp.detach().float().cpu()  # (K,)
        text = st.decision.menu[st.choice]
        x = outcome.get((st.rollout, st.agent, st.t))
        failed = x is not None and x.success is False
        last, count = streak.get((st.rollout, st.agent), ("", 0))
        count = (count + 1 if last == text else 1) if failed else 0
        streak[st.rollout, st.agent] = (text, count)
        rows.append({"episode": st.rollout, "seed": seeds[st.rollout], "t": st.t, "agent": st.agent + 1,
                     "option": text, "menu": len(st.decision.menu), "entropy": float(-(logp.exp() * logp).sum()),
                     "margin": argmax_margin(logp), "failed": failed, "failed_streak": count,
                     "score": runners[st.rollout].game.score})
    return rows


def argmax_margin(logp) -> float:
    """The chosen option's log-probability minus the runner-up's (inf for a one-option menu)."""
    if len(logp) < 2:
        return float("inf")
    first, second = logp.topk(2).values.tolist()
    return first - second


def margins_summary(rows: list[dict]) -> list[dict]:
    """Per episode: score, decisions, mean entropy and margin, the failure rate of greedy choices, and the
    longest failed streak with its option."""
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


def load_run(run_dir: str, device: str | None = None) -> tuple[dict, Task, policy_lib.MenuPolicy]:
    """(config, task, policy) of a train.py run folder: the menus the run trained on (its guards, and
    options.drop_arrived with --arrived drop) and its policy, whose adapters are still to be loaded."""
    path = os.path.join(run_dir, "config.json")
    try:
        config = json.loads(plumbing.read_text(path, "a run folder of train.py"))
    except (plumbing.InputError, json.JSONDecodeError) as e:
        raise plumbing.InputError(f"{run_dir}: no readable config.json ({plumbing.one_line(e)}); expected a run folder "
                                  "of train.py") from None
    needed = ("game", "layout", "action_mode", "device", "dtype", "model", "lora_rank", "lora_alpha", "lora_targets",
              "scoring", "seed")
    if not isinstance(config, dict) or any(k not in config for k in needed):
        raise plumbing.InputError(f"{path} is not a config of train.py (it needs {', '.join(needed)})")
    probe = envs.make_game(config["game"], config["layout"], 0)
    library = make_library(probe, config["action_mode"], config.get("feedback", "none") == "failures")
    guards = guard_lib.load_guards(os.path.join(run_dir, "guards.json"), probe, library) \
        if config["action_mode"] == "options" else None
    menu_filter = run_menu_filter(library, guards.menu_filter if guards else None, config.get("arrived", "keep"))
    device = device or config["device"]  # a run trained on a GPU can be audited on the CPU (--device cpu)
    dtype = config["dtype"] if device.startswith("cuda") == config["device"].startswith("cuda") else "auto"
    backbone, tokenizer = plumbing.load_backbone(config["model"], device, dtype)
    lora = policy_lib.LoRA(rank=config["lora_rank"], alpha=config["lora_alpha"],
                           targets=policy_lib.parse_lora_targets(config["lora_targets"]),
                           layers=config.get("lora_layers", 0))
    policy = policy_lib.MenuPolicy(backbone, tokenizer, policy_lib.agent_names(probe.n_agents), lora,
                                   scoring=config["scoring"], seed=config["seed"])
    task = Task(functools.partial(envs.make_game, config["game"], config["layout"], 0), library, menu_filter)
    return config, task, policy


def audit_run(run_dir: str, episodes: int, temperature: float = 0.0, device: str | None = None) -> list[dict]:
    """Audit a run's frozen base and every adapter snapshot on its first `episodes` test start states (the
    ones train.py's final evaluation uses): RUN/audit.jsonl, audit.md (table and a greedy replay) and audit.png,
    or audit_T{temperature}.* for sampled teams, beside a greedy audit already there."""
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
    plumbing.write_file(stem + ".jsonl", "".join(json.dumps(r) + "\n" for r in rows))
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
    """greedy_margins of a run's final adapters on its first `episodes` test start states: RUN/margins.jsonl (one
    row per decision) and RUN/margins.md (one row per episode), and the per-episode table printed."""
    config, task, policy = load_run(run_dir, device)
    policy.load_adapters(os.path.join(run_dir, "adapters"))
    seeds = envs.split_seeds(task.new_game(), "test", episodes)
    rows = greedy_margins(policy, task, seeds)
    summary = margins_summary(rows)
    plumbing.write_file(os.path.join(run_dir, "margins.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    text = (f"# Greedy decisions of {run_dir} ({config['game']}/{config['layout']}, final adapters, "
            f"{len(seeds)} test start states)\n\n{table(summary, list(summary[0]))}\n")
    plumbing.write_file(os.path.join(run_dir, "margins.md"), text)
    print(text)
    return rows


def replay_run(run_dir: str, device: str | None = None, episode: int = 1) -> str:
    """Redraw a run's replay with its final adapters on its `episode`-th test start state: episode 1 is the one
    train.py's final audit plays (replay.txt/gif), another K is written to replay_testK.txt/gif beside it."""
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
    """One row per train.py run folder from the audit it wrote at its final evaluation (audit_final.json),
    with the run's game, layout, model, advantage mode and whether the layout can be solved alone."""
    rows = []
    for run_dir in run_dirs:
        try:
            with open(os.path.join(run_dir, "config.json")) as f:
                config = json.load(f)
            with open(os.path.join(run_dir, "audit_final.json")) as f:
                row = json.load(f)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise plumbing.InputError(f"{run_dir}: no readable config.json and audit_final.json "
                                      f"({plumbing.one_line(e)}); expected a run folder of train.py with "
                                      "--audit-episodes > 0") from None
        if not isinstance(config, dict) or config.get("game") not in envs.GAMES or not isinstance(row, dict):
            raise plumbing.InputError(f"{run_dir}: config.json or audit_final.json is not what train.py writes")
        cls = envs.GAMES[config["game"]]
        rows.append({"game": config["game"], "layout": config["layout"], "model": config["model"],
                     "advantage": config["advantage"], "solo_layout": config["layout"] in cls.solo_layouts, **row})
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = plumbing.ArgumentParser(description="Behavioral audits: who does the work, and what each agent "
                                                 "is worth counterfactually.")
    parser.add_argument("--reference", action="store_true",
                        help="audit the scripted coop and solo teams on every built-in layout")
    parser.add_argument("--final", nargs="+", metavar="RUN_DIR",
                        help="one table row per run folder from the audit train.py wrote at its final evaluation")
    parser.add_argument("run_dir", nargs="?", help="a train.py run folder: audit its snapshots over training")
    parser.add_argument("--seeds", type=plumbing.number(1, 100_000, integer=True), default=10,
                        help="episodes: the first N distinct test start states of each layout")
    parser.add_argument("--temperature", type=plumbing.number(0, 100), default=0.0,
                        help="a run's teams: 0 plays them greedily (audit.*), T > 0 samples at T (audit_T{T}.*)")
    parser.add_argument("--device", default=None, help="a run's audit: cpu, cuda or cuda:N (default: the run's)")
    parser.add_argument("--decoupling", nargs="+", metavar="LABEL=SWEEP",
                        help="the decoupling figure of sweeps whose runs were audited over training, e.g. "
                             "solo=runs/coop_push-small_boxes-seeds coop=runs/coop_push-heavy_only-seeds")
    parser.add_argument("--figure", default="decoupling.png", help="where --decoupling writes its PNG")
    parser.add_argument("--margins", metavar="RUN_DIR", help="greedy play of a run's final adapters on test start "
                        "states: entropy, argmax margin and failed-choice streaks per decision (margins.jsonl/md)")
    parser.add_argument("--replay", metavar="RUN_DIR", help="the final adapters' greedy episode on the run's first "
                        "test start state: RUN_DIR/replay.txt and replay.gif (as train.py's final audit writes them)")
    parser.add_argument("--episode", type=plumbing.number(1, 100_000, integer=True), default=None,
                        help="--replay: the K-th test start state instead of the first (replay_testK.txt/gif)")
    cli = parser.parse_args(argv)
    if cli.episode is not None and not cli.replay:
        raise plumbing.InputError(f"--episode {cli.episode} applies to --replay RUN_DIR only")
    if sum(map(bool, (cli.run_dir, cli.final, cli.reference, cli.decoupling, cli.margins, cli.replay))) > 1:
        raise plumbing.InputError("RUN_DIR, --final, --reference, --decoupling, --margins and --replay are different "
                                  "audits; expected one of them")
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
    elif cli.run_dir:
        if not os.path.isdir(cli.run_dir):
            raise plumbing.InputError(f"{cli.run_dir}: not a folder; expected a run folder of train.py")
        audit_run(cli.run_dir, cli.seeds, cli.temperature, cli.device)
    elif cli.final:
        rows = final_audit_rows(cli.final)
        print(table(rows, ["game", "layout", "solo_layout", "model", "advantage"] + default_columns(2)))
    elif cli.reference:
        columns = ["game", "layout", "team", "solo_layout"] + default_columns(2)
        print(table(reference_audits(cli.seeds), columns))
    else:
        parser.print_help()


if __name__ == "__main__":
    plumbing.run_cli(main)
