"""Train each agent's LoRA adapter with PA-MAGRPO on a spatial cooperative game.

    python train.py --game coop_push                 # the default run (SmolLM2-135M on CPU)
    python train.py --game kitchen --layout forced_coordination --shaping 1
    python train.py --resume runs/coop_push-classic-s0   # continue a killed run
    python train.py --game forage --seeds 0-4        # a sweep: one run per seed, then a summary over seeds
    python train.py --help                           # every flag, with its default and range
    torchrun --nproc_per_node 4 train.py --game coop_push --device cuda   # data parallel (see README)

`main` reads top to bottom like the method: seed -> game, layout, options, burn-in + guards (cached) ->
backbone + one LoRA adapter per agent -> evaluate the frozen base (primitive actions and guarded options) ->
`for iteration:` pamagrpo.iteration (group rollouts -> credit -> advantages -> update) -> log -> periodic
greedy validation -> final test, behavioral audit (audit.py) and the checkpoint selected on validation ->
report. Files, checkpoints, caches, ranks and sweeps are plumbing.py's.

A run folder holds: config.json, guards.json, metrics.jsonl (one flat record per iteration), eval.jsonl,
checkpoint/ (written atomically each iteration: adapters, optimizer states, iteration), snapshots/
(adapters at each evaluation, for audits over training), adapters/ (final, peft format), audit_final.json,
replay.txt and replay.gif (one held-out test episode of the trained team), report.md and curve.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import audit
import envs
import guards as guard_lib
import options
import pamagrpo
import plumbing
import policy as policy_lib

COMPETENT = 0.8  # a run is competent when its selected test score is >= 0.8 x the scripted team's
TRAIN_SEED0 = 10_000_000  # training scans seeds from here (start states split by key: envs.split_of)


@dataclass
class Args(pamagrpo.Config):  # the algorithm's hyperparameters (B, G, T, eps, gamma, ...) are pamagrpo.Config's
    game: str = "coop_push"  # coop_push | forage | kitchen
    layout: str | None = None  # a built-in layout name or a layout file; default: the game's classic layout
    model: str = "smollm2-135m"  # preset (smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b, tiny), folder, .gguf or hub id
    device: str = "cpu"  # cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bfloat16 where the hardware has it natively, else float32) | bfloat16 | float32
    threads: int = 2  # torch CPU threads
    iterations: int = 30  # PA-MAGRPO iterations (0: only evaluate the frozen base)
    temperature_decay: float = 1.0  # the last iteration samples at this fraction of --temperature (linear; 1: none)
    lora_rank: int = 16  # LoRA rank r
    lora_alpha: float = 32.0  # LoRA alpha (scale alpha / r)
    lora_targets: str = "all"  # comma-separated module names, or "all" (attention + MLP projections)
    lora_layers: int = 4  # adapt only the top k decoder layers (0 or >= depth: all); the update replays the rest
    scoring: str = "text"  # text (per-token mean option log-likelihood) | label (identity-tied labels)
    action_mode: str = "options"  # options | primitive (one-step options, the low-level baseline)
    feedback: str = "none"  # none | failures (the prompt names the agent's last option if it failed)
    arrived: str = "keep"  # keep | drop (options.drop_arrived: no goto next to its target on the menus)
    eval_interval: int = 10  # greedy validation every this many iterations (0: only the final test)
    eval_episodes: int = 20  # distinct test start states of the final evaluation (and validation states)
    base_temperatures: str = "0"  # comma-separated temperatures at which the frozen base is evaluated
    base_episodes: int = 10  # test start states of the frozen-base baselines (the first test states; 0: skip)
    audit_episodes: int = 10  # test start states of the final behavioral audit (audit.py; 0: skip)
    burn_in_episodes: int = 150  # random-policy burn-in episodes per round for the guards
    seed: int = 0  # seeds everything: guards, LoRA init, start states, sampling
    seeds: str = ""  # a sweep: "0-4" or "0,3,7" trains one run per seed into OUT/seedK ("": one run, --seed)
    jobs: int = 1  # a sweep's runs at once (CPU threads are split between them; on a GPU they share it)
    out: str | None = None  # run folder; default runs/GAME-LAYOUT-sSEED
    resume: str | None = None  # continue the run in this folder
    cache: str = field(default_factory=lambda: str(plumbing.cache_root()))  # model and guard cache folder


def main(argv: list[str] | None = None) -> str:
    t_process = time.perf_counter()
    args, given = parse_args(argv)
    if args.seeds or (args.resume and os.path.exists(os.path.join(args.resume, "sweep.json"))):
        return sweep(args, given, sys.argv[1:] if argv is None else list(argv))
    if args.resume:
        args = resolve_resume(args, given)
    ranks = start_process(args)  # threads, seeds, dtype, torchrun: rank 0 alone prints and writes
    probe = envs.make_game(args.game, args.layout, 0)  # a bad layout fails here, before anything is written
    args.layout = args.layout or probe.layout_name
    test_seeds, validation_seeds = held_out(args, probe)
    run = open_run_folder(args, ranks)  # checked before the model loads and before anything is written
    if run is None:
        return args.out
    policy = make_policy(args, probe.n_agents, ranks)
    task, guards = make_task(args, probe, ranks)
    optimizers = pamagrpo.make_optimizers(policy, policy.agents, args.lr)
    start = restore(args, run, policy, optimizers, guards)  # 0, or the iteration after the checkpoint's
    if start == 0:
        evaluate_baselines(args, run, policy, task, guards, test_seeds)

    # ------------------------------------------------------------------------- the training loop (the method)
    t_start = time.perf_counter()
    for it in range(start, args.iterations):
        seeds = training_seeds(probe, args.seed, it, args.start_states)  # B fresh start states of the train split
        try:
            record = pamagrpo.iteration(policy, optimizers, task, seeds, it, scheduled(args, it), args.seed)
        except plumbing.NonFiniteError as e:  # nothing of this iteration is saved: the checkpoint stays good
            kept = f"the checkpoint after iteration {it} is kept" if it else "no checkpoint was written"
            raise plumbing.NonFiniteError(f"iteration {it + 1}: {e}; training stopped and {kept} in {run.path}; "
                                          f"expected finite values: try a lower --lr (now {args.lr:g})") from None
        eta = (time.perf_counter() - t_start) / (it + 1 - start) * (args.iterations - it - 1)
        entropy = " ".join(f"H{n[-1]}={record[f'train/{n}.entropy']:.2f}" for n in policy.agents)
        ranks.print(f"iter {it + 1}/{args.iterations} score {record['rollout/score_mean']:.3f} "
                    f"return {record['rollout/return_mean']:.1f} zero-std {record['rollout/zero_std_groups']:.2f} "
                    f"{entropy} {record['time/iteration_s']:.0f}s/it ETA {eta / 60:.1f} min", flush=True)
        if args.eval_interval and (it + 1) % args.eval_interval == 0 and it + 1 < args.iterations:
            result = evaluate_team(policy, task, validation_seeds, args.seed)  # greedy, validation states
            record.update({f"validation/{k}": v for k, v in result.items()})
            run.append("eval.jsonl", {**eval_record("validation", it, result), "states": len(validation_seeds)})
            run.save_adapters(policy, "snapshots", f"iter_{it + 1:04d}")
            ranks.print(validation_line(result, len(validation_seeds)))
        run.append("metrics.jsonl", record)
        run.save_checkpoint(policy, optimizers, it)  # a killed run loses at most this iteration

    if args.iterations > 0:
        finish(args, run, policy, task, test_seeds, validation_seeds)
    if ranks.lead:
        plumbing.write_report(run.path, dataclasses.asdict(args), audit_section(run, args))
    ranks.print(f"done: {run.path} ({(time.perf_counter() - t_process) / 60:.1f} min in this process)")
    ranks.barrier()  # no rank leaves before rank 0 has written everything
    run.close()
    return run.path


# ----------------------------------------------------------------------------- set-up: process, task, policy, run


def start_process(args: Args) -> plumbing.Ranks:
    """Threads, the global seeds, the dtype (`auto` resolved, so config.json records what ran) and torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > args.start_states:  # ranks split whole groups: a rank without a start state would have no work
        raise plumbing.InputError(f"--start-states {args.start_states}: torchrun started {world} processes, each "
                                  f"needs at least one start state an iteration; expected --start-states >= {world}")
    if args.dtype == "auto":
        args.dtype = plumbing.auto_dtype(args.device)
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    return plumbing.Ranks(args.device)


def held_out(args: Args, probe: envs.Game) -> tuple[list[int], list[int]]:
    """The test start states (every reported score) and the validation ones (checkpoint selection), disjoint from
    training and from each other by the start state's key (envs.split_of)."""
    test = held_out_seeds(probe, "test", args.eval_episodes)
    validation = held_out_seeds(probe, "validation", args.eval_episodes) if args.eval_interval else []
    if not training_seeds(probe, args.seed, 0, 1):
        raise plumbing.InputError(f"layout {args.layout!r} has no training start state; expected a layout with many "
                                  "start states, e.g. with 'random_starts: yes'")
    return test, validation


def open_run_folder(args: Args, ranks: plumbing.Ranks) -> plumbing.RunFolder | None:
    """The run folder (--out, or --resume), claimed by this process (plumbing.claim_folder: refused when another
    process writes it, when it cannot be written, holds another run or sweep or lies inside one); None when a
    resumed run has already finished."""
    args.out = args.out or os.path.join("runs", f"{args.game}-{os.path.basename(args.layout)}-s{args.seed}")
    if args.resume and plumbing.finished_iterations(args.out) >= args.iterations and \
            os.path.exists(os.path.join(args.out, "result.json")):
        print(f"{args.out} already finished its {args.iterations} iterations (result.json); nothing to do (pass "
              "--iterations N with more iterations to train on)")
        return None
    if os.path.exists(args.cache) and not os.path.isdir(args.cache):
        raise plumbing.InputError(f"--cache {args.cache}: is a file; expected a folder for models and guards")
    trained_with = {k: v for k, v in dataclasses.asdict(args).items() if k not in ("out", "resume")}  # not where
    return plumbing.RunFolder(args.out, ranks, trained_with, bool(args.resume))


def make_policy(args: Args, n_agents: int, ranks: plumbing.Ranks) -> policy_lib.MenuPolicy:
    """The backbone with one LoRA adapter per agent (a missing model fails here, before anything is written)."""
    with ranks.lead_first():  # rank 0 first, so a GGUF preset is converted into the cache once
        model, tokenizer = plumbing.load_backbone(args.model, ranks.device, args.dtype)
    lora = policy_lib.LoRA(rank=args.lora_rank, alpha=args.lora_alpha, layers=args.lora_layers,
                           targets=policy_lib.parse_lora_targets(args.lora_targets))
    policy = policy_lib.MenuPolicy(model, tokenizer, policy_lib.agent_names(n_agents), lora, scoring=args.scoring,
                                   seed=args.seed)
    ranks.barrier()  # every rank has checked before rank 0 writes
    ranks.print("config:", json.dumps(dataclasses.asdict(args)))
    return policy


def make_task(args: Args, probe: envs.Game, ranks: plumbing.Ranks) -> tuple[options.Task, guard_lib.Guards | None]:
    """The game with its option library and guarded menus; the guards come from burn-in (cached by game, layout,
    settings and source)."""
    library = options.make_library(probe, args.action_mode, args.feedback == "failures")
    guards = None
    if args.action_mode == "options":
        settings = guard_lib.BurnInSettings(episodes=args.burn_in_episodes, seed=args.seed)
        with ranks.lead_first():  # rank 0 runs the burn-in and caches the guards; the others read the cache
            guards = guard_lib.cached_guards(probe, library, settings, os.path.join(args.cache, "guards"))
        if ranks.lead:
            menu_seed0 = envs.SPLIT_FIRST_SEED["validation"]
            print(guard_lib.report(guards, guard_lib.evaluate_menus(probe, library, None, 50, menu_seed0),
                                   guard_lib.evaluate_menus(probe, library, guards, 50, menu_seed0)))
    menu_filter = options.run_menu_filter(library, guards.menu_filter if guards else None, args.arrived)
    return options.Task(functools.partial(envs.make_game, args.game, args.layout, 0), library, menu_filter), guards


def restore(args: Args, run: plumbing.RunFolder, policy, optimizers: dict, guards) -> int:
    """Write config.json and guards.json; on --resume, restore the adapters and optimizers from the checkpoint
    first (checked whole before config.json is rewritten). Returns the first iteration to train."""
    start = plumbing.load_checkpoint(run.path, policy, optimizers) + 1 if args.resume else 0
    run.write_json("config.json", dataclasses.asdict(args))
    if guards and run.ranks.lead and not (args.resume and os.path.exists(run.file("guards.json"))):
        guards.save(run.file("guards.json"))
    run.restart(start)
    if start > 0:
        run.ranks.print(f"resumed {run.path} after iteration {start}")
    return start


def scheduled(args: Args, it: int) -> pamagrpo.Config:
    """The algorithm's hyperparameters at iteration `it`: Args' own, with two linear schedules from the first
    iteration to the last: the rollouts' T falls to --temperature x --temperature-decay, and the shaping weight w
    to 0 (as Carroll et al. 2019 anneal Overcooked-AI's shaping away), so late updates learn from the team reward."""
    progress = it / max(1, args.iterations - 1)  # 0 at the first iteration, 1 at the last
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(pamagrpo.Config)}
    return pamagrpo.Config(**{**values, "temperature": args.temperature * (1 - (1 - args.temperature_decay) * progress),
                              "shaping": args.shaping * (1 - progress)})


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def eval_record(tag: str, it: int, result: dict) -> dict:
    return {"tag": tag, "iteration": it, **{f"eval/{k}": v for k, v in result.items()}}


def validation_line(result: dict, states: int, which: str = "") -> str:
    """The progress line of one greedy validation (`which`: what was validated, if not the current adapters)."""
    return f"  validation{which} (greedy, {states} distinct start states): score {result['score']:.3f} " \
           f"({result['seconds']:.0f}s)"


def training_seeds(game: envs.Game, seed: int, it: int, start_states: int) -> list[int]:
    """The start states of iteration `it`: distinct, from the training split only (never a validation or
    test start state, whatever the seed integers), drawn afresh every iteration."""
    return envs.split_seeds(game, "train", start_states, TRAIN_SEED0 + seed * 1_000_000 + it * 1000)


def held_out_seeds(game: envs.Game, split: str, count: int) -> list[int]:
    """`count` distinct start states of the validation or test split; says so when the layout has fewer."""
    seeds = envs.split_seeds(game, split, count)
    if not seeds:
        raise plumbing.InputError(f"layout {game.layout_name!r} has no {split} start state (a start state's split "
                                  "is fixed by its key); expected a layout with many start states, e.g. with "
                                  "'random_starts: yes'")
    if len(seeds) < count:
        print(f"note: {game.name}/{game.layout_name} has only {len(seeds)} distinct {split} start states "
              f"(asked for {count}); using all {len(seeds)}")
    return seeds


def evaluate_team(policy: policy_lib.MenuPolicy, task: options.Task, seeds: list[int], seed: int,
                  episodes_out: list | None = None) -> dict:
    """The adapters in place, greedy (T = 0), on held-out start states; with the seconds it took."""
    t0 = time.perf_counter()
    result = pamagrpo.evaluate(policy, task, seeds, policy.agents, 0.0, seed, episodes_out=episodes_out)
    return {**result, "seconds": round(time.perf_counter() - t0, 1)}


def evaluate_baselines(args: Args, run: plumbing.RunFolder, policy, task: options.Task, guards,
                       test_seeds: list[int]) -> None:
    """The frozen base (adapters off) over primitive actions and over guarded options, and the scripted team, on
    the first test start states. The frozen base depends on neither the run's seed (greedy) nor its adapters: it
    is computed once per model, layout, guards, start states and source, then read from the cache."""
    probe = task.new_game()
    primitive = options.Task(task.new_game, options.make_library(probe, "primitive", args.feedback == "failures"))
    for tag, played in (("base/primitive", primitive), ("base/options", task)):
        for temperature in (float(t) for t in args.base_temperatures.split(",") if args.base_episodes):
            t0, seeds = time.perf_counter(), test_seeds[:args.base_episodes]
            path = baseline_cache_path(args, probe, guards if played is task else None, seeds, tag, temperature)
            compute = functools.partial(pamagrpo.evaluate, policy, played, seeds, [None] * probe.n_agents,
                                        temperature, args.seed)
            result, cached = plumbing.cached_json(path, compute, run.ranks)
            run.append("eval.jsonl", {**eval_record("baseline", -1, result), "policy": tag,
                                      "temperature": temperature, "states": len(seeds)})
            took = f"cached: {path}" if cached else f"{time.perf_counter() - t0:.0f}s"
            run.ranks.print(f"{tag} T={temperature}: score {result['score']:.3f} ({took})")
    if run.ranks.lead:
        scripted = float(np.mean([options.play_scripted(task.new_game(), "coop", s).score for s in test_seeds]))
        run.append("eval.jsonl", {"tag": "baseline", "iteration": -1, "policy": "scripted/coop", "temperature": 0.0,
                                  "eval/score": scripted, "states": len(test_seeds)})


def finish(args: Args, run: plumbing.RunFolder, policy, task: options.Task, test_seeds: list[int],
           validation_seeds: list[int]) -> None:
    """The last adapters on the test start states, the behavioral audit of the trained team, then the checkpoint
    selected on validation start states (never on test ones; the last adapters are a candidate too), tested."""
    intact: list = []  # the trained team's episodes, reused by the audit (one process only)
    last = evaluate_team(policy, task, test_seeds, args.seed, intact)
    run.append("eval.jsonl", {**eval_record("final", args.iterations - 1, last), "states": len(test_seeds)})
    run.save_adapters(policy, "adapters")
    run.save_adapters(policy, "snapshots", f"iter_{args.iterations:04d}")
    run.ranks.print(f"final test (greedy, {len(test_seeds)} distinct test start states): score {last['score']:.3f} "
                    f"({last['seconds']:.0f}s)")
    if args.audit_episodes and run.ranks.lead:  # who did the work, and what each agent is worth (audit.py)
        t0, seeds = time.perf_counter(), test_seeds[:args.audit_episodes]
        row = {"iteration": args.iterations, "team": "trained adapters", "episodes": len(seeds),
               **audit.audit_llm_team(policy, task, policy.agents, seeds, args.seed,
                                      intact=intact[:len(seeds)] if run.ranks.world == 1 else None)}
        audit.write_replay(run.path, policy, task, seeds[0])
        row["seconds"] = round(time.perf_counter() - t0, 1)  # the ablations' episodes and the replay
        run.write_json("audit_final.json", row)
        print(f"audit ({len(seeds)} test start states, {row['seconds']:.0f}s): {row['summary']}")
    if args.eval_interval:
        validation = evaluate_team(policy, task, validation_seeds, args.seed)
        run.append("eval.jsonl", {**eval_record("validation", args.iterations - 1, validation),
                                  "states": len(validation_seeds)})
        run.ranks.print(validation_line(validation, len(validation_seeds), " of the last adapters"))
    run.ranks.barrier()
    selected, chosen = select_checkpoint(run.records("eval.jsonl"), args.iterations), last
    if selected != args.iterations:
        policy.load_adapters(run.file("snapshots", f"iter_{selected:04d}"))
        chosen = evaluate_team(policy, task, test_seeds, args.seed)
    run.append("eval.jsonl", {**eval_record("selected", selected - 1, chosen), "states": len(test_seeds)})
    run.write_json("result.json", {
        "seed": args.seed, "last_test_score": last["score"], "selected_test_score": chosen["score"],
        "selected_iteration": selected, "iterations": args.iterations, "test_states": len(test_seeds),
        "validation_states": len(validation_seeds),
        "train_s": sum(m["time/iteration_s"] for m in run.records("metrics.jsonl"))})
    run.ranks.print(f"selected checkpoint: iteration {selected} (best greedy validation score); test score "
                    f"{chosen['score']:.3f} (last: {last['score']:.3f})")


def select_checkpoint(evals: list[dict], last: int) -> int:
    """The iteration (1-based) whose adapters scored best on the validation start states; the latest of equal
    scores; `last` when no validation was run."""
    scored = [(r["eval/score"], r["iteration"] + 1) for r in evals if r["tag"] == "validation"]
    return max(scored)[1] if scored else last


def audit_section(run: plumbing.RunFolder, args: Args) -> str | None:
    """report.md's section on the final audit (audit_final.json), if the run was audited."""
    if not os.path.exists(run.file("audit_final.json")):
        return None
    with open(run.file("audit_final.json")) as f:
        row = json.load(f)
    episodes = row.get("episodes", min(args.audit_episodes, args.eval_episodes))  # --audit-episodes is capped
    columns = ["team"] + audit.default_columns(sum(k.endswith(".progress_share") for k in row))
    return (f"## Behavioral audit of the trained team ({episodes} test start states, audit.py)\n\n"
            "Progress share, idle fraction and the relative score drop when the agent is replaced by an idle one, "
            "per agent (1/2); joint events per episode; the summary's thresholds are in audit.py.\n\n"
            + audit.table([row], columns))


# ----------------------------------------------------------------------------- command line (plumbing that needs Args)


# Per-game defaults, applied when a flag is not given (chosen by measurement; see results/README.md).
PRESETS: dict[str, dict] = {
    "coop_push": {},
    # undiscounted, every sampled rollout succeeds and the greedy policy oscillates between two foods; a discount
    # prefers the faster rollouts
    "forage": {"gamma": 0.95},
    # plain return-to-go credits a decision for how early it came in a long, two-soup episode; a time-aligned group
    # baseline and a discount remove that (the measurements: results/README.md)
    "kitchen": {"credit": "to_go_aligned", "gamma": 0.95, "iterations": 20},
}
CHOICES = {"game": tuple(envs.GAMES), "dtype": ("auto", *plumbing.DTYPES),
           "scoring": policy_lib.SCORINGS, "action_mode": ("options", "primitive"),
           "advantage": ("per_agent", "shared"), "credit": ("to_go", "episode", "to_go_aligned"),
           "feedback": ("none", "failures"), "arrived": ("keep", "drop")}
# accepted range of every numeric flag: (low, high, low end open, high end open); values must also be finite
RANGES: dict[str, tuple] = {
    "threads": (1, 1024, False, False), "iterations": (0, 1_000_000, False, False),
    "start_states": (1, 100_000, False, False), "group_size": (2, 4096, False, False),
    "temperature": (0, 100, False, False), "temperature_decay": (0, 1, True, False),
    "greedy_rollouts": (0, 4095, False, False), "lr": (0, 1, False, False), "lora_rank": (1, 1024, False, False),
    "shaping": (0, 100, False, False),
    "lora_alpha": (0, 1e6, True, False), "lora_layers": (0, 10_000, False, False), "clip_eps": (0, 1, False, True),
    "kl_coef": (0, 1e6, False, False), "entropy_coef": (0, 1e6, False, False), "epochs": (1, 1000, False, False),
    "minibatch": (1, 1_000_000, False, False), "max_grad_norm": (0, 1e9, True, False), "gamma": (0, 1, True, False),
    "eval_interval": (0, 1_000_000, False, False), "eval_episodes": (1, 100_000, False, False),
    "base_episodes": (0, 100_000, False, False), "audit_episodes": (0, 100_000, False, False),
    "burn_in_episodes": (1, 1_000_000, False, False), "seed": (0, 2**31 - 1, False, False),
    "jobs": (1, 1024, False, False),
}
# fields that may differ when resuming (everything else must match the checkpoint)
RESUMABLE = ("iterations", "resume", "threads", "eval_interval", "base_temperatures", "base_episodes",
             "audit_episodes", "jobs")


def parse_args(argv: list[str] | None = None) -> tuple[Args, set[str]]:
    """Args from the command line (the game's PRESETS fill what is not given); returns it with the names given."""
    presets = "; ".join(f"{g}: {' '.join(f'--{k} {v}' for k, v in p.items()) or 'none'}" for g, p in PRESETS.items())
    given = plumbing.parse_fields(Args, argv, RANGES, plumbing.field_docs(pamagrpo.Config, Args), description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog=f"Per-game presets (flags given explicitly win): {presets}")
    args = Args(**{**PRESETS.get(given.get("game", Args.game), {}), **given})
    validate(args)
    return args, set(given)


def validate(args: Args) -> None:
    """Every value's type and range (also a resumed run's saved config, which may have been edited), and the
    combinations that cannot train."""
    plumbing.check_fields(args, CHOICES, RANGES)
    plumbing.check_device(args.device)
    if args.temperature == 0 and args.iterations > 0:
        raise plumbing.InputError("--temperature 0: greedy rollouts of one start state are identical, so every "
                                  "group's advantages are 0 and nothing is learned; expected a sampling temperature "
                                  "> 0 (1: on-policy)")
    if args.shaping > 0 and not envs.GAMES[args.game].shaped:
        shaped = ", ".join(name for name, game in envs.GAMES.items() if game.shaped)
        raise plumbing.InputError(f"--shaping {args.shaping:g}: {args.game} has no shaped rewards; expected 0, or a "
                                  f"game with them: {shaped}")
    if args.greedy_rollouts >= args.group_size:
        raise plumbing.InputError(f"--greedy-rollouts {args.greedy_rollouts}: every rollout of a group would be "
                                  f"greedy and identical; expected fewer than --group-size {args.group_size}")
    try:
        temps = [float(t) for t in args.base_temperatures.split(",")]
    except ValueError:
        temps = [-1.0]
    if not all(math.isfinite(t) and 0 <= t <= 100 for t in temps):
        raise plumbing.InputError(f"--base-temperatures {args.base_temperatures!r}: expected comma-separated finite "
                                  "numbers in [0, 100] (0: greedy)")
    targets = policy_lib.parse_lora_targets(args.lora_targets)
    if not targets or not set(targets) <= set(policy_lib.LORA_TARGETS):
        raise plumbing.InputError(f"--lora-targets {args.lora_targets!r}: expected all or comma-separated module "
                                  f"names from {', '.join(policy_lib.LORA_TARGETS)}")
    for name in ("model", "out", "resume", "cache", "layout"):
        if getattr(args, name) is not None and not getattr(args, name).strip():
            raise plumbing.InputError(f"{plumbing.flag(name)} {getattr(args, name)!r}: expected a non-empty value")
    if args.seeds:
        plumbing.parse_seed_list(args.seeds, RANGES["seed"][1])


def resolve_resume(args: Args, given: set[str]) -> Args:
    """On --resume, the saved config wins; a flag that contradicts it is refused."""
    resumed = plumbing.resumed_fields(Args, args.resume, {k: getattr(args, k) for k in given}, RESUMABLE)
    resumed.out, resumed.resume = args.resume, args.resume
    try:
        validate(resumed)
    except plumbing.InputError as e:
        raise plumbing.InputError(f"--resume {args.resume}: {os.path.join(args.resume, 'config.json')} holds a bad "
                                  f"value: {e}") from None
    return resumed


def baseline_cache_path(args: Args, game: envs.Game, guards, seeds: list[int], tag: str, temperature: float) -> str:
    """Where a frozen-base evaluation is cached: keyed by everything its result depends on (model and its files,
    dtype, device kind, scoring, feedback, layout, guards and --arrived over them, start states, temperature, and
    the seed when it samples) and by the source of the modules that play and score it, so a code change never
    reuses it."""
    model = args.model
    folder = plumbing.cache_root() / model if model in plumbing.PRESETS else Path(model).expanduser()
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.glob("*") if p.is_file()) \
        if folder.is_dir() else str(folder)
    sources = [inspect.getsource(m) for m in (envs, options, policy_lib, pamagrpo)]
    key = plumbing.content_hash([model, files, args.dtype, args.device.split(":")[0], args.scoring, args.feedback,
                        guard_lib.layout_fingerprint(game), guards.data if guards else None,
                        args.arrived if guards else None, seeds, tag, temperature,
                        args.seed if temperature > 0 else None, sources])
    return os.path.join(args.cache, "baselines", f"{game.name}-{tag.replace('/', '-')}-{key[:16]}.json")


def sweep(args: Args, given: set[str], argv: list[str]) -> str:
    """--seeds: one train.py process per seed into OUT/seedK, then a summary over seeds (plumbing.run_sweep).
    `--resume OUT` finishes a killed sweep with the flags it started with (--jobs and --threads may change)."""
    if args.resume:
        out = args.resume
        plan = plumbing.read_sweep_plan(out)
        started = dataclasses.asdict(parse_args(plan["flags"])[0]) | {"seeds": plan["seeds_text"], "out": out}
        for name in sorted(given - {"resume", "jobs", "threads"}):
            if getattr(args, name) != started[name]:
                raise plumbing.InputError(f"--resume {out}: the sweep was started with {plumbing.flag(name)} "
                                          f"{started[name]!r} (sweep.json), not {getattr(args, name)!r}; a sweep "
                                          "resumes with its own flags (--jobs and --threads may change)")
        plan.update({k: getattr(args, k) for k in ("jobs", "threads") if k in given})
    else:
        layout = args.layout or envs.GAMES[args.game].default_layout
        envs.make_game(args.game, layout, 0)  # a bad layout fails here, before anything is written
        out = args.out or os.path.join("runs", f"{args.game}-{os.path.basename(layout)}-seeds")
        plan = {"seeds": plumbing.parse_seed_list(args.seeds, RANGES["seed"][1]), "seeds_text": args.seeds,
                "jobs": args.jobs, "threads": args.threads, "flags": plumbing.run_flags(argv), "wall_s": {}}
    plumbing.claim_folder(out, "sweep", "--resume" if args.resume else "--out", bool(args.resume))
    plumbing.write_json(os.path.join(out, "sweep.json"), plan)
    try:
        return plumbing.run_sweep(out, plan, os.path.abspath(__file__), audit.LABELS, COMPETENT)
    finally:
        plumbing.release_folders(out)


if __name__ == "__main__":
    try:
        plumbing.run_cli(main)  # every error of the project is a plumbing.InputError: one line, exit code 2
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
