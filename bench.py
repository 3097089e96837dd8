"""Speed benchmarks: environments, option runner, menu scoring, the training step.

    python bench.py                 # every section, a table
    python bench.py --only env      # one section: env | prompts | dtype | scoring | train
    python bench.py --dtypes float32  # LLM sections in these dtypes only (default: float32, bfloat16)
    python bench.py --models tiny   # LLM sections for these models only (default: tiny, smollm2-135m)
    python bench.py --json          # one JSON object
    python bench.py --device cuda --only train --groups 2x4,8x8   # on a GPU: cost of larger groups
    python bench.py --only backbones  # each preset in its own process: scoring, one iteration, peak memory

Speed is measured here and reported in the README, never asserted by timed tests.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import itertools
import json
import subprocess
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import envs
import guards as guard_lib
import options
import pamagrpo
import plumbing
import policy as policy_lib
import train

MODELS = ("tiny", "smollm2-135m")  # --models' default
DTYPES = ("float32", "bfloat16")  # what --dtypes accepts, and its default
BACKBONES = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")  # the presets (--only backbones)
PROFILE_SCOPES = ("rollout", "update: base pass", "update: gradient pass", "update: backward", "update: optimizer")


def device_name(device: str) -> str:
    """'cpu (AVX512)' or the GPU's name, so a figure always says what produced it."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"


def profile_dtype(args: argparse.Namespace) -> str:
    """The dtype `--dtype auto` picks where it is among --dtypes, else the last of them."""
    auto = plumbing.auto_dtype(args.device)
    return auto if auto in args.dtypes else args.dtypes[-1]


def bench_env(game_name: str, steps: int, seed: int = 0) -> float:
    """Primitive environment steps per second under uniformly random joint actions (one thread)."""
    game = envs.make_game(game_name, None, seed)
    rng = np.random.default_rng(seed)
    joint = rng.integers(0, len(envs.ACTIONS), size=(steps, game.n_agents)).tolist()
    episode, start = 0, time.perf_counter()
    for actions in joint:
        if game.done:
            episode += 1
            game.reset(seed + episode)
        game.step(actions)
    return steps / (time.perf_counter() - start)


def bench_runner(game_name: str, episodes: int, seed: int = 0) -> tuple[float, float]:
    """Primitive steps and option decisions per second with the asynchronous runner, random options."""
    game = envs.make_game(game_name, None, seed)
    library = options.make_library(game)
    choose = options.random_choice(np.random.default_rng(seed))
    steps = decisions = 0
    start = time.perf_counter()
    for e in range(episodes):
        episode = options.run_episode(game, library, choose, seed + e)
        steps += episode.steps
        decisions += len(episode.executions)
    elapsed = time.perf_counter() - start
    return steps / elapsed, decisions / elapsed


def section_env(args: argparse.Namespace) -> dict:
    out = {}
    for name in envs.GAMES:
        steps_per_s = bench_env(name, 50_000 if args.quick else 200_000)
        runner_steps, runner_decisions = bench_runner(name, 50 if args.quick else 200)
        out[name] = {"env_steps_per_s": round(steps_per_s), "runner_steps_per_s": round(runner_steps),
                     "runner_decisions_per_s": round(runner_decisions)}
    return out


def print_env(result: dict) -> None:
    print(f"{'game':<10} {'env steps/s':>12} {'runner steps/s':>15} {'decisions/s':>12}")
    for name, row in result.items():
        print(f"{name:<10} {row['env_steps_per_s']:>12,} {row['runner_steps_per_s']:>15,} "
              f"{row['runner_decisions_per_s']:>12,}")


def real_decisions(policy, game_name: str, n: int, seed: int = 0, feedback: bool = False) -> list:
    """n real decisions of the default layout (guarded menus, random options), both agents; a group's
    rollouts share their start state, so about one decision in four repeats one already seen."""
    game = envs.make_game(game_name, None, seed)
    library = options.make_library(game, feedback=feedback)
    guard = guard_lib.cached_guards(game, library, guard_lib.BurnInSettings(), str(plumbing.cache_root() / "guards"))
    rng = np.random.default_rng(seed)
    out, episode = [], 0
    while len(out) < n:
        game.reset(seed + episode // 4)  # four rollouts per start state
        runner = options.Runner(game, library, guard.menu_filter)
        while not runner.done and len(out) < n:
            for agent in runner.pending():
                menu = runner.menu(agent)
                view, texts = options.observation(runner, agent, menu)
                out.append(policy_lib.Decision(f"agent{agent}", policy.build_prompt(game.rules, view, texts),
                                               tuple(texts)))
                runner.assign(agent, menu[int(rng.integers(len(menu)))])
            runner.advance()
        episode += 1
    return out[:n]


def llm_policy(model: str, dtype: str, device: str, scoring: str = "text") -> policy_lib.MenuPolicy:
    network, tokenizer = plumbing.load_backbone(model, device, dtype)
    return policy_lib.MenuPolicy(network, tokenizer, ["agent0", "agent1"], scoring=scoring)


def bench_scoring(model: str, n: int, dtype: str, device: str, scoring: str = "text") -> dict:
    """Decisions/s of the batched scorer (prefix shared by the options, duplicates computed once, many
    decisions per forward) vs the naive one-option-at-a-time scorer, on the same real decisions."""
    policy = llm_policy(model, dtype, device, scoring)
    decisions = real_decisions(policy, "coop_push", n)
    policy.menu_log_probs(decisions[:2])  # warm-up
    start, tokens = time.perf_counter(), policy.tokens_processed
    batched = policy.menu_log_probs(decisions)
    batched_s, tokens = time.perf_counter() - start, policy.tokens_processed - tokens
    start = time.perf_counter()
    naive = [policy_lib.naive_menu_log_probs(policy, d) for d in decisions]
    naive_s = time.perf_counter() - start
    prompt_tokens = [len(policy.tokenize_decision(d)[0]) for d in decisions]
    return {"device": device_name(device), "model": model, "dtype": dtype, "scoring": scoring, "decisions": n,
            "unique": len(set(decisions)), "prompt_tokens": float(np.mean(prompt_tokens)),
            "options": float(np.mean([len(d.menu) for d in decisions])), "batched_per_s": n / batched_s,
            "tokens_per_s": tokens / batched_s, "naive_per_s": n / naive_s, "speedup": naive_s / batched_s,
            "max_abs_diff": max(float((a - b).abs().max()) for a, b in zip(batched, naive))}


def coop_push_iteration(model: str, dtype: str, device: str, lora_layers: int, start_states: int, group_size: int,
                        profiler=None) -> tuple[dict, int, int]:
    """One real PA-MAGRPO iteration on coop_push/classic from the first training start states (guards from the
    cache), inside `profiler` (a torch.profiler context) if given: (its metrics, adapted layers, vocabulary size)."""
    network, tokenizer = plumbing.load_backbone(model, device, dtype)
    layers = min(lora_layers, network.config.num_hidden_layers - 1)  # keep a trunk on small models
    policy = policy_lib.MenuPolicy(network, tokenizer, ["agent0", "agent1"], policy_lib.LoRA(layers=layers))
    game = envs.make_game("coop_push", None, 0)
    library = options.make_library(game)
    guard = guard_lib.cached_guards(game, library, guard_lib.BurnInSettings(), str(plumbing.cache_root() / "guards"))
    config = pamagrpo.Config(group_size=group_size)  # train.py's defaults otherwise
    optimizers = pamagrpo.make_optimizers(policy, policy.agents, config.lr)
    seeds = train.training_seeds(game, 0, 0, start_states)
    task = options.Task(functools.partial(envs.make_game, "coop_push", None, 0), library, guard.menu_filter)
    with profiler or contextlib.nullcontext():
        record = pamagrpo.iteration(policy, optimizers, task, seeds, 0, config, seed=0)
    return record, layers or network.config.num_hidden_layers, network.get_output_embeddings().weight.shape[0]


def bench_train(model: str, dtype: str, device: str, lora_layers: int, start_states: int, group_size: int) -> dict:
    """One real PA-MAGRPO iteration on coop_push (start_states x group_size rollouts, then the update): decisions
    per second in the rollouts and in the update (base pass + forward + backward + step), and its wall time."""
    record, layers, _ = coop_push_iteration(model, dtype, device, lora_layers, start_states, group_size)
    n = record["rollout/decisions"]
    return {"device": device_name(device), "model": model, "dtype": dtype, "lora_layers": layers,
            "groups": f"{start_states}x{group_size}", "decisions": n, "rollout_per_s": n / record["time/rollout_s"],
            "update_per_s": n / record["time/update_s"], "iteration_s": record["time/iteration_s"]}


def bench_backbone(model: str, dtype: str, device: str) -> dict:
    """One backbone in this process: load time (from the converted cache), size, packed menu scoring (decisions and
    tokens a second), one PA-MAGRPO iteration of train.py's defaults on coop_push (1 start state x 4 rollouts,
    top 4 layers adapted), and the process's peak resident memory (VmHWM: every phase above included)."""
    start = time.perf_counter()
    network, tokenizer = plumbing.load_backbone(model, device, dtype)
    load_s, parameters = time.perf_counter() - start, sum(p.numel() for p in network.parameters())
    del network
    scoring = bench_scoring(model, 16, dtype, device)
    record, _, _ = coop_push_iteration(model, dtype, device, 4, 1, 4)
    with open("/proc/self/status") as f:
        peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return {"device": device_name(device), "model": model, "dtype": dtype, "parameters_M": parameters / 1e6,
            "vocabulary": len(tokenizer), "load_s": load_s, "scoring_decisions_per_s": scoring["batched_per_s"],
            "scoring_tokens_per_s": scoring["tokens_per_s"], "iteration_s": record["time/iteration_s"],
            "peak_rss_GiB": peak_kib / 2**20}


def section_backbone(args: argparse.Namespace) -> list:
    return [bench_backbone(m, d, args.device) for m, d in itertools.product(args.models, args.dtypes)]


def section_backbones(args: argparse.Namespace) -> list:
    """bench_backbone for each preset, each in a process of its own (so each peak memory is its own)."""
    rows = []
    for model in BACKBONES:
        out = subprocess.run([sys.executable, __file__, "--only", "backbone", "--models", model, "--dtypes",
                              profile_dtype(args), "--device", args.device, "--threads", str(args.threads), "--json"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise plumbing.InputError(f"backbone {model}: {(out.stderr.strip().splitlines() or ['failed'])[-1]}")
        rows += json.loads(out.stdout.strip().splitlines()[-1])["backbone"]
    return rows


@contextlib.contextmanager
def profile_scopes():
    """Name for torch.profiler the phases of an iteration (PROFILE_SCOPES) and, inside every scoring, the layers and
    the vocabulary head, by wrapping the functions that run them (the method itself carries no profiler code)."""
    in_update = [False]

    def scoped(owner, name: str, label) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            scope = label(*args, **kwargs)
            with record_function(scope) if scope else contextlib.nullcontext():
                return original(*args, **kwargs)

        patched.append((owner, name, original))
        setattr(owner, name, wrapper)

    def update(*args, **kwargs):  # marks the update, so its scoring calls are told from the rollouts'
        in_update[0] = True
        try:
            return original_update(*args, **kwargs)
        finally:
            in_update[0] = False

    original_update = pamagrpo.update
    patched = [(pamagrpo, "update", original_update)]
    pamagrpo.update = update
    scoped(pamagrpo, "play", lambda *a, **k: "rollout")
    scoped(policy_lib.MenuPolicy, "menu_log_probs", lambda *a, grad=False, **k: None if not in_update[0] else
           "update: gradient pass" if grad else "update: base pass")
    scoped(torch.Tensor, "backward", lambda *a, **k: "update: backward" if in_update[0] else None)
    scoped(torch.optim.AdamW, "step", lambda *a, **k: "update: optimizer")
    scoped(policy_lib.MenuPolicy, "forward_layers", lambda *a, **k: "layers")
    scoped(policy_lib.MenuPolicy, "head_logits", lambda *a, **k: "head")
    scoped(policy_lib.MenuPolicy, "_text_log_probs", lambda *a, **k: "head")
    try:
        yield
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def bench_profile(model: str, dtype: str, device: str) -> list[dict]:
    """Where one PA-MAGRPO iteration of train.py's defaults (coop_push, B x G = 2 x 4, adapters on the top 4 layers)
    spends its time, from a torch.profiler trace of the scopes profile_scopes() names, layers vs head inside each
    (backward ops count as head when an input has the vocabulary's size). The profiler's own overhead is included,
    so shares are what to compare, not seconds."""
    defaults = train.Args()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    prof = profile(activities=activities, record_shapes=True)
    with profile_scopes():
        record, _, vocab = coop_push_iteration(model, dtype, device, defaults.lora_layers, defaults.start_states,
                                               defaults.group_size, prof)
    seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
    for event in prof.events():
        chain, parent = [], event.cpu_parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        phase = next((n for n in [event.name] + chain if n in PROFILE_SCOPES), None)
        if phase is None or any(n in ("layers", "head") for n in chain):
            continue  # outside the scopes, or already counted by an enclosing layers/head scope
        if event.name == phase:
            seconds[phase, "total"] += event.cpu_time_total / 1e6
        elif event.name in ("layers", "head"):
            seconds[phase, event.name] += event.cpu_time_total / 1e6
        elif phase == "update: backward":  # autograd runs outside the forward scopes: tell the head by shape
            head = any(vocab in (shape or []) for shape in event.input_shapes or [])
            seconds[phase, "head" if head else "layers"] += event.self_cpu_time_total / 1e6
    rows = []
    for phase in PROFILE_SCOPES:
        parts = [p for p in ("layers", "head") if (phase, p) in seconds]
        rows += [{"phase": phase, "part": part, "seconds": seconds[phase, part]} for part in parts]
        rest = seconds.get((phase, "total"), 0.0) - sum(seconds[phase, p] for p in parts)
        rows.append({"phase": phase, "part": "Python, game and the rest" if parts else "all", "seconds": rest})
    whole = sum(r["seconds"] for r in rows)
    for r in rows:
        r.update(share=r["seconds"] / whole, device=device_name(device), model=model, dtype=dtype,
                 decisions=record["rollout/decisions"])
    return rows


def section_prompts(args: argparse.Namespace) -> list:
    """Prompt tokens (SmolLM2 tokenizer; the tiny model shares it) of real decisions of each default layout, and
    the tokens of a packed row and its head rows with the options flat or as a token tree (policy.py)."""
    policy = llm_policy("tiny", "float32", args.device)
    rows = []
    for game_name, feedback in [(g, False) for g in envs.GAMES] + [("kitchen", True)]:
        decisions = real_decisions(policy, game_name, 32 if args.quick else 128, feedback=feedback)
        tokenized = [policy.tokenize_decision(d) for d in decisions]  # (prompt ids, option ids)
        tokens = [len(prompt) for prompt, _ in tokenized]
        # a packed row: the prompt, then every option flat or as a token tree (shared leading tokens once); head
        # rows: the positions whose next-token distribution is read (the last prompt token, every inner token)
        flat = [len(p) + sum(map(len, o)) for p, o in tokenized]
        tree = [len(p) + len({tuple(x[:t]) for x in o for t in range(1, len(x) + 1)}) for p, o in tokenized]
        head_flat = [1 + sum(len(x) - 1 for x in o) for _, o in tokenized]
        head_tree = [1 + len({tuple(x[:t]) for x in o for t in range(1, len(x))}) for _, o in tokenized]
        rows.append({"game": game_name + (" --feedback failures" if feedback else ""), "decisions": len(decisions),
                     "mean_prompt_tokens": float(np.mean(tokens)), "max_prompt_tokens": max(tokens),
                     "mean_options": float(np.mean([len(d.menu) for d in decisions])),
                     "row_tokens_flat": float(np.mean(flat)), "row_tokens_tree": float(np.mean(tree)),
                     "head_rows_flat": float(np.mean(head_flat)), "head_rows_tree": float(np.mean(head_tree))})
    return rows


def section_dtype(args: argparse.Namespace) -> list:
    """One no-grad forward of 8 sequences of 200 tokens per dtype: whether this CPU computes bfloat16
    natively (fast) or emulates it (slow), which is what `--dtype auto` in train.py decides from CPU flags."""
    tokens = torch.randint(0, 1000, (8, 200), generator=torch.Generator().manual_seed(0))
    repeats = 1 if args.quick else 3
    rows = []
    for model, dtype in itertools.product(args.models, args.dtypes):
        network, _ = plumbing.load_backbone(model, "cpu", dtype)
        with torch.no_grad():
            network(tokens)  # warm-up
            start = time.perf_counter()
            for _ in range(repeats):
                network(tokens)
        rows.append({"model": model, "dtype": dtype, "forward_s": (time.perf_counter() - start) / repeats,
                     "cpu": torch.backends.cpu.get_cpu_capability(), "auto": plumbing.auto_dtype("cpu")})
    return rows


def section_scoring(args: argparse.Namespace) -> list:
    return [bench_scoring(m, 16 if args.quick else 48, d, args.device)
            for m, d in itertools.product(args.models, args.dtypes) if m != "tiny" or d == "float32"]


def section_train(args: argparse.Namespace) -> dict:
    """The training step: adapters on every layer (0) vs the top 4 layers (trunk cached and replayed), for each
    --groups size (start states x rollouts); then a profile of one iteration of train.py's defaults per model
    (in the dtype --dtype auto picks where it is among --dtypes)."""
    dtypes = args.dtypes[-1:] if args.quick else args.dtypes
    steps = [bench_train(m, d, args.device, layers, b, g) for m, d in itertools.product(args.models, dtypes)
             for layers in (0, 4) for b, g in args.groups]
    profiled = [r for m in args.models for r in bench_profile(m, profile_dtype(args), args.device)]
    return {"steps": steps, "profile": profiled}


def print_train(result: dict) -> None:
    print_rows(result["steps"])
    print("-- profile of one iteration (train.py defaults; torch.profiler, named scopes)")
    print(f"{'model':<14} {'phase':<22} {'part':<26} {'seconds':>8} {'share':>6}")
    for r in result["profile"]:
        print(f"{r['model']:<14} {r['phase']:<22} {r['part']:<26} {r['seconds']:>8.2f} {r['share']:>6.1%}")
    print(f"device: {result['profile'][0]['device']}, dtype {result['profile'][0]['dtype']}")


def print_rows(rows: list) -> None:
    columns = list(rows[0])
    print("  ".join(columns))
    for r in rows:
        print("  ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in columns))


SECTIONS = {"env": (section_env, print_env), "prompts": (section_prompts, print_rows),
            "dtype": (section_dtype, print_rows), "scoring": (section_scoring, print_rows),
            "train": (section_train, print_train), "backbone": (section_backbone, print_rows),
            "backbones": (section_backbones, print_rows)}
ON_REQUEST = ("backbone", "backbones")  # run with --only only (they load every preset)


def main(argv: list[str] | None = None) -> None:
    parser = plumbing.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SECTIONS), help="run one section")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated models of the LLM sections")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated dtypes of the LLM sections")
    parser.add_argument("--threads", type=plumbing.number(1, 1024, integer=True), default=2, help="torch threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the LLM sections run")
    parser.add_argument("--groups", default="1x4", help="train section: comma-separated START_STATESxGROUP_SIZE")
    args = parser.parse_args(argv)
    for dtype in args.dtypes.split(","):
        if dtype not in DTYPES:
            raise plumbing.InputError(f"--dtypes {args.dtypes!r}: unknown dtype {dtype!r}; expected a "
                                      f"comma-separated list of {', '.join(DTYPES)}")
    if not all(args.models.split(",")):
        raise plumbing.InputError(f"--models {args.models!r}: expected comma-separated model names, e.g. "
                                  "tiny,smollm2-135m")
    try:
        groups = [tuple(int(x) for x in g.split("x")) for g in args.groups.split(",")]
    except ValueError:
        groups = []
    if not groups or any(len(g) != 2 or not 1 <= min(g) <= max(g) <= 4096 for g in groups):
        raise plumbing.InputError(f"--groups {args.groups!r}: expected comma-separated BxG with integers in "
                                  "[1, 4096], e.g. 2x4,8x8")
    plumbing.check_device(args.device)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise plumbing.InputError(f"--device {args.device}: no CUDA device is available to torch here; expected cpu")
    torch.set_num_threads(args.threads)
    args.models, args.dtypes, args.groups = args.models.split(","), args.dtypes.split(","), groups
    results = {}
    for name, (run, show) in SECTIONS.items():
        if (args.only and name != args.only) or (not args.only and name in ON_REQUEST):
            continue
        results[name] = run(args)
        if not args.json:
            print(f"== {name}")
            show(results[name])
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    plumbing.run_cli(main)
