"""Train two agents' LoRA adapters with PA-MAGRPO on a spatial cooperative game.

    python train.py --game coop_push                 # the default run (SmolLM2-135M on CPU)
    python train.py --game kitchen --layout forced_coordination
    python train.py --resume runs/coop_push-classic-s0   # continue a killed run
    python train.py --help                           # every flag, with its default and range
    torchrun --nproc_per_node 4 train.py --game coop_push --device cuda   # data parallel (see README)

The file reads top to bottom like the method: seed -> game and layout -> burn-in + guards (cached) ->
backbone + per-agent adapters -> evaluate the frozen base (primitive actions and guarded options) ->
`for iteration:` group rollouts -> advantages -> update -> log -> periodic evaluation -> final
evaluation + audit (with a replay as text and as an animated GIF) -> report. Sections marked PLUMBING hold
no algorithm.

A run folder holds: config.json, guards.json, metrics.jsonl (one flat record per iteration), eval.jsonl,
checkpoint/ (written atomically each iteration: adapters, optimizer states, iteration), snapshots/
(adapters at each evaluation, for audits over training), adapters/ (final, peft format), audit_final.json,
replay.txt and replay.gif (one held-out test episode of the trained team), report.md and curve.png.
"""

from __future__ import annotations

import argparse
import dataclasses
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
class Args:
    game: str = "coop_push"  # coop_push | forage | kitchen
    layout: str | None = None  # a built-in layout name or a layout file; default: the game's classic layout
    model: str = "smollm2-135m"  # preset (smollm2-135m, gemma3-270m, tiny), local dir, .gguf file or hub id
    device: str = "cpu"  # cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bfloat16 where the hardware has it natively, else float32) | bfloat16 | float32
    threads: int = 2  # torch CPU threads
    iterations: int = 30  # PA-MAGRPO iterations (0: only evaluate the frozen base)
    start_states: int = 2  # B: start states per iteration (fresh each iteration, from the training split)
    group_size: int = 4  # G: rollouts per start state; usually 4 to 16
    temperature: float = 1.0  # sampling temperature of the rollouts, > 0 (1: on-policy; otherwise off-policy)
    temperature_decay: float = 1.0  # the last iteration samples at this fraction of --temperature (linear; 1: none)
    greedy_rollouts: int = 1  # rollouts of each group played greedily (T = 0; off-policy), chosen over 5 seeds
    shaping: float = 0.0  # kitchen: weight of Overcooked-AI's shaped rewards, linearly to 0 at the last iteration
    lr: float = 1e-3  # AdamW learning rate of each adapter; usually 3e-4 to 1e-3 (top-layer adapters)
    lora_rank: int = 16  # LoRA rank r
    lora_alpha: float = 32.0  # LoRA alpha (scale alpha / r)
    lora_targets: str = "all"  # comma-separated module names, or "all" (attention + MLP projections)
    lora_layers: int = 4  # adapt only the top k decoder layers (0 or >= depth: all); the update replays the rest
    clip_eps: float = 0.2  # PPO clip range of the ratio; usually 0.1 to 0.3
    kl_coef: float = 0.05  # weight of the exact KL(pi_i || pi_base) over the menu
    entropy_coef: float = 0.0  # weight of an entropy bonus (0: none)
    epochs: int = 1  # optimizer steps per agent per iteration, each on all its decisions (PPO-style epochs)
    minibatch: int = 32  # decisions per forward in the update (bounds memory; gradients accumulate)
    max_grad_norm: float = 1.0  # gradient-norm clip of each adapter
    scoring: str = "text"  # text (per-token mean option log-likelihood) | label (identity-tied labels)
    action_mode: str = "options"  # options | primitive (one-step options, the low-level baseline)
    feedback: str = "none"  # none | failures (the prompt names the agent's last option if it failed)
    arrived: str = "keep"  # keep | drop (options.drop_arrived: no goto next to its target on the menus)
    advantage: str = "per_agent"  # per_agent (PA-MAGRPO) | shared (MAGRPO baseline, the ablation)
    credit: str = "to_go"  # to_go (return-to-go) | episode | to_go_aligned (minus the group's same-step mean)
    gamma: float = 1.0  # discount of the credited return (1: none; < 1 prefers faster rollouts), in (0, 1]
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


# Per-game defaults, applied when a flag is not given (chosen by measurement; see results/README.md).
PRESETS: dict[str, dict] = {
    "coop_push": {},
    # undiscounted, every sampled rollout succeeds from the start and the greedy policy stays at 0 (it oscillates
    # between two foods); discounting prefers the faster rollouts: greedy 0.0 -> 1.0 by iteration 10
    "forage": {"gamma": 0.95},
    # plain return-to-go credits a decision for how early it came in a 100-step, two-soup episode: rollout
    # scores stayed flat for 10 iterations; with a time-aligned group baseline and the discount they rose
    # 0.48 -> 0.76 in 20; greedy 1.000 on cramped_room with the current options, but 20 iterations took 59 min
    # in float32 on a 2-core CPU; --iterations 10 fits 30 min there and scores 0.800, no margin (results/README.md).
    # --feedback failures was tried and is not in the preset: greedy 0.275 after 10 iterations (results/README.md)
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


class ArgError(plumbing.InputError):
    """A bad flag value: the message says what is wrong and what is accepted."""


def parse_args(argv: list[str] | None = None) -> tuple[Args, set[str]]:
    """Build argparse from the dataclass; returns the resolved Args and the names given explicitly."""
    presets = "; ".join(f"{g}: {' '.join(f'--{k} {v}' for k, v in p.items()) or 'none'}" for g, p in PRESETS.items())
    parser = plumbing.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=f"Per-game presets (flags given explicitly win): {presets}")
    docs = {}
    for line in open(__file__).read().split("class Args:")[1].split("\n\n")[0].splitlines()[1:]:
        name, _, doc = line.strip().partition("#")
        docs[name.split(":")[0].strip()] = doc.strip()
    for f in dataclasses.fields(Args):
        default = getattr(Args(), f.name)
        low, high, low_open, high_open = RANGES.get(f.name, (-math.inf, math.inf, False, False))
        kind = plumbing.number(low, high, type(default) is int, low_open, high_open) if type(default) in (int, float) \
            else str
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=None,
                            help=docs.get(f.name, ""))
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    game = given.get("game", Args.game)
    values = {**PRESETS.get(game, {}), **given}
    args = Args(**values)
    validate(args)
    return args, set(given)


def flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def validate(args: Args) -> None:
    """Every value's type and range (also a resumed run's saved config, which may have been edited)."""
    defaults = Args()
    for f in dataclasses.fields(Args):
        value, default = getattr(args, f.name), getattr(defaults, f.name)
        kind = type(default) if default is not None else str
        if not (type(value) is kind or (kind is float and type(value) is int) or (value is None and default is None)):
            expected = {int: "an integer", float: "a number", str: "text"}[kind]
            raise ArgError(f"{flag(f.name)} {value!r}: expected {expected}")
    for name, accepted in CHOICES.items():
        if getattr(args, name) not in accepted:
            raise ArgError(f"{flag(name)} {getattr(args, name)!r}: expected one of {', '.join(accepted)}")
    plumbing.check_device(args.device)
    for name, (low, high, low_open, high_open) in RANGES.items():
        value = getattr(args, name)
        inside = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        if not (math.isfinite(value) and inside):
            kind = "an integer" if isinstance(getattr(Args(), name), int) else "a finite number"
            accepted = plumbing.number(low, high, kind == "an integer", low_open, high_open).accepted
            raise ArgError(f"{flag(name)} {value}: expected {accepted}")
    if args.temperature == 0 and args.iterations > 0:
        raise ArgError("--temperature 0: greedy rollouts of one start state are identical, so every group's advantages "
                       "are 0 and nothing is learned; expected a sampling temperature > 0 (1: on-policy)")
    if args.shaping > 0 and not envs.GAMES[args.game].shaped:
        shaped = ", ".join(name for name, game in envs.GAMES.items() if game.shaped)
        raise ArgError(f"--shaping {args.shaping:g}: {args.game} has no shaped rewards; expected 0, or a game with "
                       f"them: {shaped}")
    if args.greedy_rollouts >= args.group_size:
        raise ArgError(f"--greedy-rollouts {args.greedy_rollouts}: every rollout of a group would be greedy and "
                       f"identical; expected fewer than --group-size {args.group_size}")
    try:
        temps = [float(t) for t in args.base_temperatures.split(",")]
    except ValueError:
        temps = [-1.0]
    if not all(math.isfinite(t) and 0 <= t <= 100 for t in temps):
        raise ArgError(f"--base-temperatures {args.base_temperatures!r}: expected comma-separated finite numbers in "
                       "[0, 100] (0: greedy)")
    targets = policy_lib.parse_lora_targets(args.lora_targets)
    if not targets or not set(targets) <= set(policy_lib.LORA_TARGETS):
        raise ArgError(f"--lora-targets {args.lora_targets!r}: expected all or comma-separated module names from "
                       f"{', '.join(policy_lib.LORA_TARGETS)}")
    for name in ("model", "out", "resume", "cache", "layout"):
        if getattr(args, name) is not None and not getattr(args, name).strip():
            raise ArgError(f"{flag(name)} {getattr(args, name)!r}: expected a non-empty value")
    if args.seeds:
        parse_seed_list(args.seeds)


def parse_seed_list(text: str) -> list[int]:
    """'0-4' -> [0, 1, 2, 3, 4]; '0,3,7' -> [0, 3, 7]; ranges and lists mix ('0-2,9')."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            if int(high or low) - int(low) > 10_000:
                raise ValueError("too many")
            seeds += list(range(int(low), int(high or low) + 1))
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or max(seeds) > RANGES["seed"][1] or len(seeds) > 10_000 or \
            len(set(seeds)) != len(seeds):
        raise ArgError(f"--seeds {text!r}: expected up to 10,000 distinct seeds in [0, {RANGES['seed'][1]}] as a "
                       "range or a list, e.g. 0-4 or 0,3,7")
    return seeds


# ----------------------------------------------------------------------------- PLUMBING: files


# Every file is written whole or not at all (plumbing.write_file: a temporary file, then a rename), so a kill, a full
# disk or a missing permission leaves the previous version; the records are small, so an append rewrites the file.


def resolve_resume(args: Args, given: set[str]) -> Args:
    """On --resume, the saved config wins; a flag that contradicts it is refused."""
    path = os.path.join(args.resume, "config.json")
    try:
        saved = json.loads(plumbing.read_text(path, "a run folder of train.py"))
    except (plumbing.InputError, json.JSONDecodeError) as e:
        raise ArgError(f"--resume {args.resume}: cannot read {path} ({plumbing.one_line(e)}); expected a run folder of "
                       "train.py") from None
    names = {f.name for f in dataclasses.fields(Args)}
    if not isinstance(saved, dict) or not set(saved) <= names or len(saved) < len(names) // 2:
        raise ArgError(f"--resume {args.resume}: {path} is not a config of this train.py")
    # a flag added after the run was started takes its default, which is what the run trained with
    saved = {**{f.name: getattr(Args(), f.name) for f in dataclasses.fields(Args)}, **saved}
    for name in given - set(RESUMABLE):
        if getattr(args, name) != saved[name]:
            raise ArgError(f"--resume {args.resume}: the checkpoint was made with --{name.replace('_', '-')} "
                           f"{saved[name]!r}, not {getattr(args, name)!r}")
    resumed = Args(**{**saved, **{k: getattr(args, k) for k in given & set(RESUMABLE)}})
    resumed.out, resumed.resume = args.resume, args.resume
    try:
        validate(resumed)
    except plumbing.InputError as e:
        raise ArgError(f"--resume {args.resume}: {path} holds a bad value: {e}") from None
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


def read_cached_baseline(path: str) -> dict | None:
    """A cached frozen-base result, or None when there is none or it does not match its content hash."""
    try:
        cached = json.loads(plumbing.read_text(path, "a cached baseline"))
        if cached["content_hash"] == plumbing.content_hash(cached["result"]):
            return cached["result"]
        print(f"note: the cached baseline {path} does not match its content hash; recomputing it", file=sys.stderr)
    except (plumbing.InputError, ValueError, KeyError, TypeError):
        pass
    return None


def schedule_progress(args: Args, it: int) -> float:
    """How far training is at iteration `it`: 0 at the first iteration, 1 at the last (the linear schedules)."""
    return it / max(1, args.iterations - 1)


def sampling_temperature(args: Args, it: int) -> float:
    """The rollouts' temperature at iteration `it`: --temperature, falling linearly to --temperature x
    --temperature-decay at the last iteration."""
    return args.temperature * (1 - (1 - args.temperature_decay) * schedule_progress(args, it))


def shaping_weight(args: Args, it: int) -> float:
    """The weight of the shaped rewards at iteration `it`: --shaping at the first iteration, falling linearly to 0
    at the last (as Carroll et al. 2019 anneal Overcooked-AI's shaping away), so late updates learn from the
    team reward alone."""
    return args.shaping * (1 - schedule_progress(args, it))


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
        raise ArgError(f"layout {game.layout_name!r} has no {split} start state (a start state's split is fixed by "
                       "its key); expected a layout with many start states, e.g. with 'random_starts: yes'")
    if len(seeds) < count:
        print(f"note: {game.name}/{game.layout_name} has only {len(seeds)} distinct {split} start states "
              f"(asked for {count}); using all {len(seeds)}")
    return seeds


def scripted_score(game_factory, seeds: list[int]) -> float:
    return float(np.mean([options.play_scripted(game_factory(), "coop", s).score for s in seeds]))


# ----------------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> str:
    t_process = time.perf_counter()
    args, given = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if args.seeds or (args.resume and os.path.exists(os.path.join(args.resume, "sweep.json"))):
        return run_sweep(args, given, argv)
    if args.resume:
        args = resolve_resume(args, given)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > args.start_states:  # ranks split whole groups: a rank without a start state would have no work
        raise ArgError(f"--start-states {args.start_states}: torchrun started {world} processes, each needs at least "
                       f"one start state an iteration; expected --start-states >= {world}")
    if args.dtype == "auto":  # the config records what ran
        args.dtype = plumbing.auto_dtype(args.device)
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    device = plumbing.start_distributed(args.device)
    lead = plumbing.rank_and_world()[0] == 0  # rank 0 alone prints and writes files

    # game, layout, option library (a bad layout fails here, before anything is written)
    probe = envs.make_game(args.game, args.layout, 0)
    layout = args.layout or probe.layout_name
    args.layout = layout

    def game_factory() -> envs.Game:
        return envs.make_game(args.game, layout, 0)

    library = options.make_library(probe, args.action_mode, args.feedback == "failures")
    # held-out start states: test (every reported score) and validation (periodic evaluations), disjoint from
    # training and from each other by the start state's key
    eval_seeds = held_out_seeds(probe, "test", args.eval_episodes)
    validation_seeds = held_out_seeds(probe, "validation", args.eval_episodes) if args.eval_interval else []
    if not training_seeds(probe, args.seed, 0, 1):
        raise ArgError(f"layout {layout!r} has no training start state; expected a layout with many start states, "
                       "e.g. with 'random_starts: yes'")
    # the run folder: checked (and a finished run recognized) before the model loads and before anything is written
    run_dir = args.out or os.path.join("runs", f"{args.game}-{os.path.basename(layout)}-s{args.seed}")
    args.out = run_dir
    if not args.resume and os.path.exists(os.path.join(run_dir, "config.json")):
        raise ArgError(f"--out {run_dir}: a run already exists there; pass --resume {run_dir} or another --out")
    if args.resume and plumbing.finished_iterations(run_dir) >= args.iterations and \
            os.path.exists(os.path.join(run_dir, "result.json")):
        print(f"{run_dir} already finished its {args.iterations} iterations (result.json); nothing to do (pass "
              "--iterations N with more iterations to train on)")
        return run_dir
    if lead:
        plumbing.check_output_folder(run_dir, "--resume" if args.resume else "--out")
        if os.path.exists(args.cache) and not os.path.isdir(args.cache):
            raise ArgError(f"--cache {args.cache}: is a file; expected a folder for models and guards")
    # backbone + one LoRA adapter per agent (a missing model fails here, before anything is written);
    # rank 0 first, so a GGUF preset is converted into the cache once
    if not lead:
        plumbing.barrier()
    model, tokenizer = plumbing.load_backbone(args.model, device, args.dtype)
    if lead:
        plumbing.barrier()
    names = policy_lib.agent_names(probe.n_agents)
    policy = policy_lib.MenuPolicy(model, tokenizer, names, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha,
                                   lora_targets=policy_lib.parse_lora_targets(args.lora_targets),
                                   lora_layers=args.lora_layers, scoring=args.scoring, seed=args.seed)
    plumbing.barrier()  # every rank has checked before rank 0 writes
    if lead:
        print("config:", json.dumps(dataclasses.asdict(args)))

    # burn-in + guards (cached by game, layout and settings)
    guards = None
    if args.action_mode == "options":
        settings = guard_lib.BurnInSettings(episodes=args.burn_in_episodes, seed=args.seed)
        if not lead:  # rank 0 runs the burn-in and caches the guards; the others read the cache
            plumbing.barrier()
        guards = guard_lib.cached_guards(probe, library, settings, os.path.join(args.cache, "guards"))
        if lead:
            plumbing.barrier()
            menu_seed0 = envs.SPLIT_FIRST_SEED["validation"]
            print(guard_lib.report(guards, guard_lib.evaluate_menus(probe, library, None, 50, menu_seed0),
                                   guard_lib.evaluate_menus(probe, library, guards, 50, menu_seed0)))
    menu_filter = options.run_menu_filter(library, guards.menu_filter if guards else None, args.arrived)

    def evaluate_team(seeds: list[int], episodes_out: list | None = None) -> dict:
        """The adapters in place, greedy (T = 0), on held-out start states; with the seconds it took."""
        t0 = time.perf_counter()
        result = pamagrpo.evaluate(policy, game_factory, library, menu_filter, seeds, names, 0.0, args.seed,
                                   episodes_out=episodes_out)
        return {**result, "seconds": round(time.perf_counter() - t0, 1)}

    optimizers = pamagrpo.make_optimizers(policy, names, args.lr)
    cfg = pamagrpo.UpdateConfig(args.clip_eps, args.kl_coef, args.entropy_coef, args.epochs, args.minibatch,
                                args.max_grad_norm)
    metrics_path, eval_path = os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "eval.jsonl")
    # a resume is checked whole (the checkpoint loads) before config.json is rewritten
    start = plumbing.load_checkpoint(run_dir, policy, optimizers) + 1 if args.resume else 0
    if lead:
        plumbing.write_json(os.path.join(run_dir, "config.json"), dataclasses.asdict(args))
        if guards and not (args.resume and os.path.exists(os.path.join(run_dir, "guards.json"))):
            guards.save(os.path.join(run_dir, "guards.json"))
    if start > 0 and lead:  # drop records of iterations the checkpoint does not hold (killed mid-iteration), and
        # the final records of a finished run trained further (--iterations raised); baselines (iteration -1) stay
        for path in (metrics_path, eval_path):
            plumbing.write_jsonl(path, [r for r in plumbing.read_jsonl(path) if r["iteration"] < start
                               and r.get("tag") not in ("final", "selected")])
        if os.path.exists(os.path.join(run_dir, "result.json")):
            os.remove(os.path.join(run_dir, "result.json"))
        print(f"resumed {run_dir} after iteration {start}")
    elif start == 0:
        for path in (metrics_path, eval_path) if lead else ():
            plumbing.write_jsonl(path, [])
        # evaluate the frozen base: over primitive actions, and over guarded options
        base_agents = [None] * probe.n_agents
        primitive = options.make_library(probe, "primitive", args.feedback == "failures")
        for tag, lib, filt in (("base/primitive", primitive, None), ("base/options", library, menu_filter)):
            for temperature in (float(t) for t in args.base_temperatures.split(",") if args.base_episodes):
                # the frozen base does not depend on the run's seed (greedy) or its adapters: computed once per
                # model, layout, guards, start states and source, then read from the cache (verified by hash)
                t0, seeds = time.perf_counter(), eval_seeds[:args.base_episodes]
                path = baseline_cache_path(args, probe, guards if lib is library else None, seeds, tag, temperature)
                result = read_cached_baseline(path)
                if not all(plumbing.all_gather([result is not None])):  # every rank takes the same branch
                    result = pamagrpo.evaluate(policy, game_factory, lib, filt, seeds, base_agents, temperature,
                                               args.seed)
                    if lead:
                        plumbing.check_output_folder(os.path.dirname(path), "--cache")
                        plumbing.write_json(path, {"result": result, "content_hash": plumbing.content_hash(result)})
                    took = f"{time.perf_counter() - t0:.0f}s"
                else:
                    took = f"cached: {path}"
                record = {**eval_record("baseline", -1, result), "policy": tag, "temperature": temperature,
                          "states": len(seeds)}
                if lead:
                    plumbing.append_jsonl(eval_path, record)
                    print(f"{tag} T={temperature}: score {result['score']:.3f} ({took})")
        if lead:
            scripted = scripted_score(game_factory, eval_seeds)
            plumbing.append_jsonl(eval_path, {"tag": "baseline", "iteration": -1, "policy": "scripted/coop",
                                     "temperature": 0.0, "eval/score": scripted, "states": len(eval_seeds)})

    # ------------------------------------------------------------------------- training loop (the algorithm)
    t_start = time.perf_counter()
    for it in range(start, args.iterations):
        seeds = training_seeds(probe, args.seed, it, args.start_states)
        try:
            record = pamagrpo.iteration(policy, optimizers, game_factory, library, menu_filter, seeds,
                                        args.group_size, sampling_temperature(args, it), args.credit,
                                        args.advantage, cfg, args.seed, it, args.gamma, args.greedy_rollouts,
                                        shaping_weight(args, it))
        except plumbing.NonFiniteError as e:  # nothing of this iteration is saved: the checkpoint stays good
            kept = f"the checkpoint after iteration {it} is kept" if it else "no checkpoint was written"
            raise plumbing.NonFiniteError(f"iteration {it + 1}: {e}; training stopped and {kept} in {run_dir}; "
                                          f"expected finite values: try a lower --lr (now {args.lr:g})") from None
        done = it + 1 - start
        eta = (time.perf_counter() - t_start) / done * (args.iterations - it - 1)
        entropy = " ".join(f"H{n[-1]}={record[f'train/{n}.entropy']:.2f}" for n in names)
        if lead:
            print(f"iter {it + 1}/{args.iterations} score {record['rollout/score_mean']:.3f} "
                  f"return {record['rollout/return_mean']:.1f} zero-std {record['rollout/zero_std_groups']:.2f} "
                  f"{entropy} {record['time/iteration_s']:.0f}s/it ETA {eta / 60:.1f} min", flush=True)
        if args.eval_interval and (it + 1) % args.eval_interval == 0 and it + 1 < args.iterations:
            result = evaluate_team(validation_seeds)
            record.update({f"validation/{k}": v for k, v in result.items()})
            if lead:
                plumbing.append_jsonl(eval_path, {**eval_record("validation", it, result), "states": len(validation_seeds)})
                plumbing.save_adapters(policy, os.path.join(run_dir, "snapshots", f"iter_{it + 1:04d}"))
                print(validation_line(result, len(validation_seeds)))
        if lead:
            plumbing.append_jsonl(metrics_path, record)
            plumbing.save_checkpoint(run_dir, policy, optimizers, it)

    # ------------------------------------------------------------------------- final evaluation and report
    if args.iterations > 0:
        final_episodes: list = []  # the intact team's episodes, reused by the audit (one process only)
        result = evaluate_team(eval_seeds, final_episodes)
        if lead:
            plumbing.append_jsonl(eval_path, {**eval_record("final", args.iterations - 1, result), "states": len(eval_seeds)})
            plumbing.save_adapters(policy, os.path.join(run_dir, "adapters"))
            plumbing.save_adapters(policy, os.path.join(run_dir, "snapshots", f"iter_{args.iterations:04d}"))
            print(f"final test (greedy, {len(eval_seeds)} distinct test start states): score {result['score']:.3f} "
                  f"({result['seconds']:.0f}s)")
            if args.audit_episodes:  # who did the work, and what each agent is worth (audit.py)
                t0 = time.perf_counter()
                audit_seeds = eval_seeds[:args.audit_episodes]
                intact = final_episodes[:len(audit_seeds)] if plumbing.rank_and_world()[1] == 1 else None
                row = {"iteration": args.iterations, "team": "trained adapters", "episodes": len(audit_seeds),
                       **audit.audit_llm_team(policy, game_factory, library, names, audit_seeds, menu_filter,
                                              args.seed, intact=intact)}
                audit.write_replay(run_dir, policy, game_factory, library, names, audit_seeds[0], menu_filter)
                row["seconds"] = round(time.perf_counter() - t0, 1)  # the ablations' episodes and the replay
                plumbing.write_json(os.path.join(run_dir, "audit_final.json"), row)
                print(f"audit ({len(audit_seeds)} test start states, {row['seconds']:.0f}s): "
                      f"{row['summary']}")
        # checkpoint selection on validation start states, never on test ones: the last adapters are a
        # candidate too; the selected adapters are then scored on the test states, beside the last ones
        if args.eval_interval:
            validation = evaluate_team(validation_seeds)
            if lead:
                plumbing.append_jsonl(eval_path, {**eval_record("validation", args.iterations - 1, validation),
                                         "states": len(validation_seeds)})
                print(validation_line(validation, len(validation_seeds), " of the last adapters"))
        plumbing.barrier()
        selected = select_checkpoint(plumbing.read_jsonl(eval_path), args.iterations)
        chosen = result
        if selected != args.iterations:
            policy.load_adapters(os.path.join(run_dir, "snapshots", f"iter_{selected:04d}"))
            chosen = evaluate_team(eval_seeds)
        if lead:
            plumbing.append_jsonl(eval_path, {**eval_record("selected", selected - 1, chosen), "states": len(eval_seeds)})
            summary = {"seed": args.seed, "last_test_score": result["score"], "selected_test_score": chosen["score"],
                       "selected_iteration": selected, "iterations": args.iterations, "test_states": len(eval_seeds),
                       "validation_states": len(validation_seeds),
                       "train_s": sum(m["time/iteration_s"] for m in plumbing.read_jsonl(metrics_path))}
            plumbing.write_json(os.path.join(run_dir, "result.json"), summary)
            print(f"selected checkpoint: iteration {selected} (best greedy validation score); test score "
                  f"{chosen['score']:.3f} (last: {result['score']:.3f})")
    if lead:
        write_report(run_dir, args)
        print(f"done: {run_dir} ({(time.perf_counter() - t_process) / 60:.1f} min in this process)")
    plumbing.barrier()  # no rank leaves before rank 0 has written everything
    return run_dir


def select_checkpoint(evals: list[dict], last: int) -> int:
    """The iteration (1-based) whose adapters scored best on the validation start states; the latest of equal
    scores; `last` when no validation was run."""
    scored = [(r["eval/score"], r["iteration"] + 1) for r in evals if r["tag"] == "validation"]
    return max(scored)[1] if scored else last


# ----------------------------------------------------------------------------- PLUMBING: many seeds at once


def run_sweep(args: Args, given: set[str], argv: list[str]) -> str:
    """One training process per seed (OUT/seedK, at most --jobs at once), one progress line per seed, then
    OUT/summary.json and OUT/summary.md. `--resume OUT` finishes a killed sweep: finished runs are kept,
    interrupted ones resume from their checkpoint, missing ones start."""
    import subprocess

    if args.resume:
        out = args.resume
        try:
            with open(os.path.join(out, "sweep.json")) as f:
                plan = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ArgError(f"--resume {out}: cannot read {out}/sweep.json ({e}); expected a sweep folder "
                           "(for a single run, drop --seeds)") from None
        if "jobs" in given:
            plan["jobs"] = args.jobs
    else:
        layout = args.layout or envs.GAMES[args.game].default_layout
        envs.make_game(args.game, layout, 0)  # a bad layout fails here, before anything is written
        out = args.out or os.path.join("runs", f"{args.game}-{os.path.basename(layout)}-seeds")
        if os.path.exists(os.path.join(out, "sweep.json")):
            raise ArgError(f"--out {out}: a sweep already exists there; pass --resume {out} or another --out")
        plan = {"seeds": parse_seed_list(args.seeds), "seeds_text": args.seeds, "jobs": args.jobs,
                "threads": args.threads,
                "flags": plumbing.run_flags(argv), "wall_s": {}}
        plumbing.check_output_folder(out, "--out")
        plumbing.write_json(os.path.join(out, "sweep.json"), plan)
    jobs, threads = plan["jobs"], max(1, plan["threads"] // plan["jobs"])
    print(f"sweep {out}: seeds {plan['seeds']}, {jobs} at a time, {threads} CPU thread(s) each; logs in "
          f"{out}/seedK/train.log", flush=True)
    pending = [s for s in plan["seeds"] if not os.path.exists(os.path.join(out, f"seed{s}", "result.json"))]
    running: dict[int, tuple] = {}
    shown: dict[int, str] = {}
    failed: dict[int, str] = {}
    while pending or running:
        while pending and len(running) < jobs:
            seed = pending.pop(0)
            run_dir = os.path.join(out, f"seed{seed}")
            if os.path.exists(os.path.join(run_dir, "config.json")):
                cmd = [sys.executable, os.path.abspath(__file__), "--resume", run_dir]
            else:
                cmd = [sys.executable, os.path.abspath(__file__), *plan["flags"], "--seed", str(seed), "--out", run_dir]
            os.makedirs(run_dir, exist_ok=True)
            log = open(os.path.join(run_dir, "train.log"), "a")
            proc = subprocess.Popen(cmd + ["--threads", str(threads)], stdout=log, stderr=subprocess.STDOUT)
            running[seed] = (proc, time.time(), log, plan["wall_s"].get(str(seed), 0.0))
        time.sleep(1.0)
        for seed, (proc, t0, log, before) in list(running.items()):
            line = plumbing.last_progress(os.path.join(out, f"seed{seed}", "train.log"))
            if line and line != shown.get(seed):
                shown[seed] = line
                print(f"seed {seed}: {line}", flush=True)
                # the seed's clock so far, kept at each progress line: a killed sweep loses at most one line's time
                plan["wall_s"][str(seed)] = before + time.time() - t0
                plumbing.write_json(os.path.join(out, "sweep.json"), plan)
            if proc.poll() is None:
                continue
            line = plumbing.last_progress(os.path.join(out, f"seed{seed}", "train.log"))  # its last line, written at exit
            if line and line != shown.get(seed):
                print(f"seed {seed}: {line}", flush=True)
            log.close()
            del running[seed]
            plan["wall_s"][str(seed)] = before + time.time() - t0
            plumbing.write_json(os.path.join(out, "sweep.json"), plan)
            if proc.returncode != 0:
                failed[seed] = f"exit {proc.returncode}: {line}"
                print(f"seed {seed}: FAILED ({failed[seed]})", flush=True)
    summary = sweep_summary(out, plan)
    print(f"sweep {out}: {summary['competent']}/{summary['seeds']} seeds competent{plumbing.unfinished_note(summary)}; "
          f"selected test score, mean [95% CI]: {plumbing.mean_ci(summary['selected_test_score'])}; {out}/summary.md",
          flush=True)
    if failed:
        raise ArgError(f"sweep {out}: seed(s) {', '.join(map(str, failed))} failed; their logs are in "
                       f"{out}/seedK/train.log; fix the cause and pass --resume {out}")
    return out


def audit_of_run(run_dir: str) -> dict:
    """The final team's audit label and each agent's relative score drop when replaced by an idle agent
    (audit_final.json, written by train.py's final audit); {} when the run was not audited."""
    try:
        with open(os.path.join(run_dir, "audit_final.json")) as f:
            row = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    drops = [row[f"agent{i}.ablation_idle_drop_rel"] for i in range(row["n_agents"])]
    label = next(label for label in audit.LABELS if row["summary"].startswith(label))
    return {"audit": label, "idle_drops": drops, "idle_drop_min": min(drops), "idle_drop_max": max(drops)}


def sweep_summary(out: str, plan: dict) -> dict:
    """summary.json and summary.md of a sweep from each run's result.json and eval.jsonl."""
    rows = []
    for seed in plan["seeds"]:
        run_dir = os.path.join(out, f"seed{seed}")
        row: dict = {"seed": seed, "wall_s": round(plan["wall_s"].get(str(seed), 0.0), 1)}
        try:
            with open(os.path.join(run_dir, "result.json")) as f:
                row.update(json.load(f))
        except (OSError, json.JSONDecodeError):
            rows.append({**row, "status": "unfinished"})
            continue
        scripted = [r["eval/score"] for r in plumbing.read_jsonl(os.path.join(run_dir, "eval.jsonl"))
                    if r.get("policy") == "scripted/coop"]
        row["scripted_test_score"] = scripted[-1] if scripted else 1.0
        row["competent"] = row["selected_test_score"] >= COMPETENT * row["scripted_test_score"]
        row.update(audit_of_run(run_dir))
        rows.append({**row, "status": "done"})
    done = [r for r in rows if r["status"] == "done"]
    summary: dict = {"seeds": len(rows), "finished": len(done), "competent": sum(r["competent"] for r in done),
                     "competent_means": f"selected test score >= {COMPETENT} x the scripted team's",
                     "flags": " ".join(plan["flags"])}
    for key in ("selected_test_score", "last_test_score"):
        summary[key] = plumbing.mean_and_ci([r[key] for r in done])
    audited = [r for r in done if "audit" in r]
    summary["audits"] = {label: sum(r["audit"] == label for r in audited) for label in audit.LABELS
                         if any(r["audit"] == label for r in audited)}
    for key in ("idle_drop_min", "idle_drop_max"):
        summary[key] = plumbing.mean_and_ci([r[key] for r in audited])
    summary["runs"] = rows
    plumbing.write_json(os.path.join(out, "summary.json"), summary)
    if done:
        plot_sweep(out, [os.path.join(out, f"seed{r['seed']}") for r in done], os.path.join(out, "curves.png"))

    lines = [f"# Sweep {out}", "", f"`python train.py {summary['flags']} --seeds {plan['seeds_text']}`", "",
             f"**{summary['competent']}/{summary['seeds']} seeds competent** ({summary['competent_means']}"
             f"{plumbing.unfinished_note(summary)}); mean test score with a 95% bootstrap CI over seeds: selected "
             f"{plumbing.mean_ci(summary['selected_test_score'])}, "
             f"last {plumbing.mean_ci(summary['last_test_score'])}.", ""]
    if done:
        lines += ["Learning curves with bands over seeds: `curves.png`.", ""]
    if audited:
        labels = ", ".join(f"{label} {count}" for label, count in summary["audits"].items())
        plural = "" if len(audited) == 1 else "s"
        lines += [f"Audits of the final teams (audit.py, `audit_final.json` of each seed, "
                  f"{len(audited)} seed{plural}): {labels}. Relative score drop when an agent is replaced by an "
                  f"idle one, mean [95% CI] over seeds: the less necessary agent "
                  f"{plumbing.mean_ci(summary['idle_drop_min'])}, the more necessary {plumbing.mean_ci(summary['idle_drop_max'])}.", ""]
    lines += ["| seed | selected test score (iteration) | last test score | scripted | competent | test states | "
              "audit (drop if agent 1 / 2 idles) | wall clock |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["status"] != "done":
            clock = f"{r['wall_s'] / 60:.1f} min so far" if r["wall_s"] else ""  # not started: no clock
            lines.append(f"| {r['seed']} | {r['status']} | | | | | | {clock} |")
            continue
        competent = "yes" if r["competent"] else "no"
        team = f"{r['audit']} ({' / '.join(f'{d:.2f}' for d in r['idle_drops'])})" if "audit" in r else "-"
        lines.append(f"| {r['seed']} | {r['selected_test_score']:.3f} ({r['selected_iteration']}) | "
                     f"{r['last_test_score']:.3f} | {r['scripted_test_score']:.2f} | {competent} "
                     f"| {r['test_states']} | {team} | {r['wall_s'] / 60:.1f} min |")
    plumbing.write_file(os.path.join(out, "summary.md"), "\n".join(lines) + "\n")
    return summary


def plot_sweep(out: str, run_dirs: list[str], path: str) -> None:
    """Learning curves over the seeds of a sweep: the sampled rollout score and the greedy validation score at
    every iteration, each seed as a thin line, their mean with a 95% bootstrap band over seeds; the frozen base
    (options and primitive actions) and the scripted team as lines (means over seeds); the selected checkpoints'
    test scores at the right with their CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [plumbing.read_jsonl(os.path.join(d, "metrics.jsonl")) for d in run_dirs]
    evals = [plumbing.read_jsonl(os.path.join(d, "eval.jsonl")) for d in run_dirs]
    iterations = min(len(m) for m in metrics)
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(1, iterations + 1)
    rollout = [[r["rollout/score_mean"] for r in m[:iterations]] for m in metrics]
    validation_at = sorted(set.intersection(*[{r["iteration"] for r in e if r["tag"] == "validation"}
                                              for e in evals])) if evals else []
    validation = [[next(r["eval/score"] for r in e if r["tag"] == "validation" and r["iteration"] == it)
                   for it in validation_at] for e in evals]
    for values, at, colour, label in ((rollout, x, "C0", "rollout score (sampled)"),
                                      (validation, np.array(validation_at) + 1, "C1",
                                       "greedy, validation start states")):
        if not len(at):
            continue
        for seed_values in values:
            ax.plot(at, seed_values, color=colour, alpha=0.25, linewidth=0.8)
        mean, low, high = plumbing.band(values)
        ax.plot(at, mean, color=colour, linewidth=2, marker="o" if colour == "C1" else None,
                label=f"{label}: mean of {len(values)} seeds")
        ax.fill_between(at, low, high, color=colour, alpha=0.2)
    baselines = {}
    for e in evals:
        for r in e:
            if r["tag"] == "baseline" and r.get("temperature", 0.0) == 0.0:
                baselines.setdefault(r["policy"], []).append(r["eval/score"])
    for (name, scores), style in zip(sorted(baselines.items()), (":", "--", "-.")):
        ax.axhline(float(np.mean(scores)), color="gray", linestyle=style, linewidth=1, label=f"{name} (greedy)")
    selected = [r["eval/score"] for e in evals for r in e if r["tag"] == "selected"]
    if selected:  # the summary's rule: a mean, and a CI from two seeds on
        stat = plumbing.mean_and_ci(selected)
        mean = stat["mean"]
        low, high = stat["ci95"] or (mean, mean)
        ax.errorbar([iterations + 1.5], [mean], yerr=[[mean - low], [high - mean]], fmt="s", color="C3",
                    capsize=4, label=f"selected checkpoint, test states: {plumbing.mean_ci(stat)}")
    ax.set(xlabel="iteration", ylabel="normalized score", ylim=(-0.02, 1.02),
           title=f"{os.path.basename(os.path.normpath(out))}: "
                 + ("one seed" if len(run_dirs) == 1 else f"{len(run_dirs)} seeds, 95% bootstrap bands"))
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    plumbing.save_figure(fig, path, dpi=110)


def write_report(run_dir: str, args: Args) -> None:
    """report.md (frozen base vs trained vs scripted) and curve.png from the run's own records."""
    evals = plumbing.read_jsonl(os.path.join(run_dir, "eval.jsonl"))
    metrics = plumbing.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    rows = [(f"{r['policy']} (T={r['temperature']:g})", r["eval/score"]) for r in evals if r["tag"] == "baseline"]
    method = "PA-MAGRPO" if args.advantage == "per_agent" else "MAGRPO (shared advantages)"
    rows += [(f"{method}, iteration {r['iteration'] + 1} (greedy, validation states)", r["eval/score"])
             for r in evals if r["tag"] in ("greedy", "validation")]
    final = [r for r in evals if r["tag"] == "final"]
    if final:
        rows.append((f"**{method}, final: iteration {args.iterations} (greedy)**", final[-1]["eval/score"]))
    rows += [(f"**{method}, selected on validation: iteration {r['iteration'] + 1} (greedy)**", r["eval/score"])
             for r in evals if r["tag"] == "selected"][-1:]
    states = final[-1].get("states", "?") if final else "?"
    lines = [f"# {args.game} / {args.layout} / {args.model}", "",
             f"Normalized score (1.0 = all reward) on {states} distinct test start states, never used in training "
             "(periodic rows: validation start states).", "",
             "| policy | score |", "| --- | --- |"] + [f"| {name} | {score:.3f} |" for name, score in rows]
    if metrics:
        total = sum(m["time/iteration_s"] for m in metrics)
        lines += ["", f"{len(metrics)} iterations, {total / 60:.1f} min of training "
                      f"({total / len(metrics):.0f} s per iteration)."]
    audit_path, replay_path = os.path.join(run_dir, "audit_final.json"), os.path.join(run_dir, "replay.txt")
    if os.path.exists(audit_path):
        with open(audit_path) as f:
            row = json.load(f)
        episodes = row.get("episodes", min(args.audit_episodes, args.eval_episodes))  # --audit-episodes is capped
        lines += ["", f"## Behavioral audit of the trained team ({episodes} test start states, audit.py)", "",
                  "Progress share, idle fraction and the relative score drop when the agent is replaced by an idle "
                  "one, per agent (1/2); joint events per episode; the summary's thresholds are in audit.py.", "",
                  audit.table([row], ["team"] + audit.default_columns(sum(k.endswith(".progress_share") for k in row)))]
    if os.path.exists(replay_path):
        with open(replay_path) as f:
            lines += ["", "## Replay of one held-out episode (greedy, trained adapters)", "", "```",
                      f.read().rstrip("\n"), "```"]
    plumbing.write_file(os.path.join(run_dir, "report.md"), "\n".join(lines) + "\n")
    if metrics:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([m["iteration"] + 1 for m in metrics], [m["rollout/score_mean"] for m in metrics],
                label="rollout score (sampled)")
        greedy = [r for r in evals if r["tag"] in ("greedy", "validation")]
        ax.plot([r["iteration"] + 1 for r in greedy], [r["eval/score"] for r in greedy], "o-",
                label="greedy, validation states")
        ax.plot([r["iteration"] + 1 for r in final], [r["eval/score"] for r in final], "s", color="C3",
                label="greedy, test states (final)")
        for r, style in zip([r for r in evals if r["tag"] == "baseline"], (":", "--", "-.", ":", "--")):
            ax.axhline(r["eval/score"], linestyle=style, color="gray", linewidth=1,
                       label=f"{r['policy']} (T={r['temperature']:g})")
        ax.set(xlabel="iteration", ylabel="normalized score", ylim=(-0.02, 1.02), title=f"{args.game}/{args.layout}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        plumbing.save_figure(fig, os.path.join(run_dir, "curve.png"), dpi=110)


if __name__ == "__main__":
    try:
        plumbing.run_cli(main)  # every error of the project is a plumbing.InputError: one line, exit code 2
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
