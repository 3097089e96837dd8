"""Feasibility guards synthesized from random burn-in, never written by hand.

1. Burn-in: a uniformly random policy over the *unfiltered* grounded menu plays `episodes` episodes of the
   layout (no LLM), logging every option execution: its type, arguments, outcome, and the boolean facts that
   held when it started (options.Library.facts: a generic vocabulary about self, partner and each argument).
2. Synthesis, per option type, over its logged executions. A candidate literal is a fact or its negation. It
   is adopted as a guard only if it hides no logged success (it is true in every one) and explains repeated
   failures (it is false in at least `k` logged failures not explained by the guards adopted before it).
   Literals are adopted greedily, most newly explained failures first (ties: by literal text), until none
   qualifies. A type with fewer than `min_successes` logged successes adopts no guard (thin evidence never
   hides an option).
   Departure (on by default; `rounds=1` turns it off): a random policy over the unfiltered menu rarely reaches
   deep states (in forced_coordination it almost never plates a soup), so later rounds choose uniformly over
   the menu guarded by the previous round's guards, except for a share `explore` of choices that stays
   unfiltered, and synthesis reruns over all rounds' logs: every option is still tried in every kind of state,
   and no guard that a logged success contradicts is adopted.
3. The guarded menu of an agent: the grounded options whose guards all hold; `wait` stays if every other
   option is filtered out, so a menu is never empty.

Guards are saved as JSON with their evidence and the burn-in settings; `load_guards` validates a file.
Test: `pytest test_all.py -k guard`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

import envs
from envs import Game
from options import Library, Option, make_library, run_episode
import plumbing

FORMAT = "pamagrpo-guards/1"


class GuardError(plumbing.InputError):
    """A guards file that is corrupt or belongs to another game or layout."""


@dataclass(frozen=True)
class BurnInSettings:
    episodes: int = 150  # random-policy episodes per round
    seed: int = 0  # burn-in plays training start states found from seed, seed + 1, ... (envs.split_seeds)
    k: int = 3  # a guard must explain at least k failures not already explained
    min_successes: int = 5  # option types with fewer logged successes adopt no guard
    rounds: int = 4  # burn-in rounds; round 1 is uniform over the unfiltered menu (the paper's burn-in)
    explore: float = 0.2  # later rounds: share of choices uniform over the unfiltered menu


@dataclass(frozen=True)
class Record:
    kind: str
    args: tuple
    facts: dict
    success: bool


def holds(literal: tuple[str, bool], facts: dict) -> bool:
    return facts.get(literal[0], False) == literal[1]


def literal_text(literal: tuple[str, bool]) -> str:
    return literal[0] if literal[1] else f"not {literal[0]}"


def burn_in(game: Game, library: Library, episodes: int, seed: int, guards: Guards | None = None,
            explore: float = 0.5) -> list[Record]:
    """Log every finished option execution of a random policy over the unfiltered menu; with `guards` (later
    rounds), over the guarded menu except with probability `explore`, so a wrong guard can still be refuted."""
    rng = np.random.default_rng(seed)

    def choose(runner, agent, menu):  # without guards: uniform, one draw per choice (options.random_choice)
        if guards is not None and rng.random() >= explore:
            menu = guards.menu_filter(runner.game, agent, menu)
        return menu[int(rng.integers(len(menu)))]

    # training start states only: validation and test states stay unseen by everything a run learns from
    starts = envs.split_seeds(game, "train", episodes, seed, distinct=False)
    return [Record(x.option.kind, x.option.args, x.facts, x.success) for start in starts
            for x in run_episode(game, library, choose, start, record_facts=True).executions if x.success is not None]


def synthesize_kind(records: list[Record], k: int, min_successes: int) -> dict:
    """Guards of one option type from its logged executions (the rule in the module docstring)."""
    successes = [r.facts for r in records if r.success]
    failures = [r.facts for r in records if not r.success]
    entry = {"guards": [], "executions": len(records), "successes": len(successes), "failures": len(failures),
             "failures_explained": 0}
    if len(successes) < min_successes:
        entry["status"] = f"too few successes to judge (< {min_successes}): no guard"
        return entry
    facts = sorted({f for r in records for f in r.facts})
    # a literal that hides no logged success: true in every success
    candidates = [(f, v) for f in facts for v in (True, False) if all(holds((f, v), s) for s in successes)]
    unexplained = list(range(len(failures)))
    while True:
        # failures each candidate newly explains (it is false there)
        counts = {lit: sum(not holds(lit, failures[i]) for i in unexplained) for lit in candidates}
        best = min(counts, key=lambda lit: (-counts[lit], literal_text(lit)), default=None)
        if best is None or counts[best] < k:
            break
        entry["guards"].append({"literal": literal_text(best), "fact": best[0], "value": best[1],
                                "failures_explained": counts[best]})
        unexplained = [i for i in unexplained if holds(best, failures[i])]
        candidates.remove(best)
    entry["failures_explained"] = len(failures) - len(unexplained)
    entry["status"] = "guarded" if entry["guards"] else "no literal explains repeated failures: no guard"
    return entry


def layout_fingerprint(game: Game) -> str:
    text = "\n".join(game.rows) + "\n" + json.dumps(game.options, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Guards:
    """Adopted guards of one game and layout; `menu_filter` plugs into options.Runner."""

    def __init__(self, data: dict, library: Library):
        self.data, self.library = data, library
        self.literals = {kind: [(g["fact"], g["value"]) for g in entry["guards"]]
                         for kind, entry in data["options"].items()}

    def allows(self, game: Game, agent: int, option: Option) -> bool:
        if not (literals := self.literals.get(option.kind)):
            return True
        facts = self.library.facts(game, agent, option)
        return all(holds(lit, facts) for lit in literals)

    def menu_filter(self, game: Game, agent: int, menu: list[Option]) -> list[Option]:
        kept = [o for o in menu if self.allows(game, agent, o)]
        return kept or [o for o in menu if o.kind == "wait"] or [self.library.wait()]

    def save(self, path: str) -> None:
        """Write atomically (plumbing.write_file), with the content hash that load_guards verifies."""
        plumbing.write_file(path, json.dumps({**self.data, "content_hash": content_hash(self.data)}, indent=1,
                                         sort_keys=True))


def content_hash(data: dict) -> str:
    """sha256 of a guards record's canonical JSON (its own hash aside), so an edited file is never applied."""
    return plumbing.content_hash({k: v for k, v in data.items() if k != "content_hash"})


def build_guards(game: Game, library: Library, settings: BurnInSettings) -> Guards:
    """Burn-in rounds, then synthesis over the union of all logged executions."""
    records: list[Record] = []
    guards = None
    for i in range(settings.rounds):
        records += burn_in(game, library, settings.episodes, settings.seed + i * settings.episodes, guards,
                           settings.explore)
        synthesized = {kind: synthesize_kind([x for x in records if x.kind == kind], settings.k,
                                             settings.min_successes) for kind in library.kinds}
        guards = Guards({"format": FORMAT, "game": game.name, "layout": game.layout_name, "layout_fingerprint":
                         layout_fingerprint(game), "settings": asdict(settings), "records": len(records),
                         "options": synthesized}, library)
    return guards


def load_guards(path: str, game: Game, library: Library, settings: BurnInSettings | None = None) -> Guards:
    """Read and validate a guards file; corrupt or mismatched files raise GuardError (one line)."""
    try:
        data = json.loads(plumbing.read_text(path, f"a {FORMAT} guards file (guards.py)"))
    except plumbing.InputError as e:
        raise GuardError(str(e)) from None
    except json.JSONDecodeError as e:
        raise GuardError(f"guards file {path} is corrupt (not JSON: {e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("options"), dict):
        raise GuardError(f"guards file {path} is not a {FORMAT} file")
    if data.get("content_hash") != content_hash(data):
        raise GuardError(f"guards file {path} does not match its content hash (edited or damaged after synthesis); "
                         "expected a file written by guards.py or train.py, unedited")
    data = {k: v for k, v in data.items() if k != "content_hash"}
    if data.get("game") != game.name or data.get("layout_fingerprint") != layout_fingerprint(game):
        raise GuardError(f"guards file {path} is for {data.get('game')}/{data.get('layout')}, "
                         f"not {game.name}/{game.layout_name}")
    if settings is not None and data.get("settings") != asdict(settings):
        raise GuardError(f"guards file {path} was made with burn-in settings {data.get('settings')}, "
                         f"not {asdict(settings)}")
    for kind, entry in data["options"].items():
        ok = kind in library.kinds and isinstance(entry, dict) and all(
            isinstance(g, dict) and isinstance(g.get("fact"), str) and isinstance(g.get("value"), bool)
            and g.get("literal") == literal_text((g["fact"], g["value"])) for g in entry.get("guards", [None]))
        if not ok:
            raise GuardError(f"guards file {path} is corrupt: bad entry for option type '{kind}'")
    return Guards(data, library)


def cached_guards(game: Game, library: Library, settings: BurnInSettings, cache_dir: str) -> Guards:
    """Guards for this game, layout and settings, reused from `cache_dir` when already synthesized. The key also
    covers the game and option modules' source, so a change in how options act never reuses old guards."""
    sources = [inspect.getsource(sys.modules[type(x).__module__]) for x in (game, library)]
    key = hashlib.sha256(json.dumps([game.name, layout_fingerprint(game), asdict(settings), FORMAT,
                                     *sources]).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, f"guards-{game.name}-{key}.json")
    if os.path.exists(path):
        try:
            guards = load_guards(path, game, library, settings)
            if guards.data.get("cache_key") != key:
                raise GuardError(f"guards cache {path} was synthesized under another source of the game or options "
                                 f"(key {guards.data.get('cache_key')}, expected {key})")
            return guards
        except GuardError as e:  # an edited or damaged cache entry is reported and rebuilt, never applied
            print(f"note: {e}; rebuilding it", file=sys.stderr)
    guards = build_guards(game, library, settings)
    guards.data["cache_key"] = key  # game, layout, settings and source: checked on every reuse
    plumbing.check_output_folder(cache_dir, "--cache")
    guards.save(path)
    return guards


def evaluate_menus(game: Game, library: Library, guards: Guards | None, episodes: int, seed: int) -> dict:
    """Failure rate of a random policy's option executions and mean menu size, with or without guards."""
    rng = np.random.default_rng(seed)
    menu_filter = guards.menu_filter if guards else None
    sizes: list[int] = []

    def choose(runner, agent, menu):
        sizes.append(len(menu))
        return menu[int(rng.integers(len(menu)))]

    runs = [x for e in range(episodes) for x in run_episode(game, library, choose, seed + e, menu_filter).executions
            if x.success is not None]
    return {"failure_rate": float(np.mean([not x.success for x in runs])) if runs else 0.0,
            "menu_size": float(np.mean(sizes)) if sizes else 0.0, "executions": len(runs)}


def report(guards: Guards, before: dict, after: dict) -> str:
    """Guards per option type in words, and random-policy failure rate and menu size before vs after."""
    d = guards.data
    s = d["settings"]
    lines = [f"Guards for {d['game']}/{d['layout']} (burn-in: {s['rounds']} x {s['episodes']} random episodes, "
             f"seed {s['seed']}, k={s['k']}, min successes {s['min_successes']}; {d['records']} executions logged)"]
    for kind, entry in d["options"].items():
        rule = " and ".join(g["literal"] for g in entry["guards"]) or "-"
        lines.append(f"  {kind:<11} requires {rule:<60} ({entry['successes']} ok, {entry['failures']} failed, "
                     f"{entry['failures_explained']} explained; {entry['status']})")
    lines.append(f"  random policy: option failure rate {before['failure_rate']:.2f} -> {after['failure_rate']:.2f}, "
                 f"mean menu size {before['menu_size']:.1f} -> {after['menu_size']:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = plumbing.ArgumentParser(description="Synthesize and report guards for one game and layout.")
    parser.add_argument("--game", default="coop_push", choices=list(envs.GAMES))
    parser.add_argument("--layout", default=None, help="a built-in layout name or a layout file")
    parser.add_argument("--episodes", type=plumbing.number(1, 100_000, integer=True), default=BurnInSettings.episodes,
                        help="random burn-in episodes per round")
    parser.add_argument("--seed", type=plumbing.number(0, integer=True), default=0)
    parser.add_argument("--out", default=None, help="write guards.json here (a file path in an existing folder)")
    cli = parser.parse_args(argv)
    if cli.out:
        plumbing.check_output_file(cli.out, "--out")
    game = envs.make_game(cli.game, cli.layout, cli.seed)
    library = make_library(game)
    start = time.perf_counter()
    guards = build_guards(game, library, BurnInSettings(episodes=cli.episodes, seed=cli.seed))
    took = time.perf_counter() - start
    before = evaluate_menus(game, library, None, 100, cli.seed + 10_000)
    after = evaluate_menus(game, library, guards, 100, cli.seed + 10_000)
    print(report(guards, before, after))
    print(f"  burn-in and synthesis took {took:.1f} s")
    if cli.out:
        guards.save(cli.out)


if __name__ == "__main__":
    plumbing.run_cli(main)
