"""Symbolic options per game, grounding, and the asynchronous macro-action runner.

Options (Sutton, Precup & Singh 1999) are typed, short-horizon behaviours executed by the BFS planner:
`push(box, direction)`, `load(food)`, `put_onion(pot)`, ... Each has a canonical one-line text, a horizon
(a timeout in primitive steps) and a termination test that reports success or failure with a reason.
`Library.ground` enumerates every type-correct option for an agent; which of them are worth showing is
learned by guards.py, not checked here.

The `Runner` executes options asynchronously, as in macro-action Dec-POMDPs (Amato et al. 2014/2019): when
an agent's option terminates only that agent chooses again while the others keep going. It records every
execution (agent, option, start step, duration, outcome, reason) and every attributed event.
`PrimitiveLibrary` turns the primitive actions into one-step options for the same runner and policy.

Reference teams: `scripted_choice` (a cooperative heuristic; `solo=True`: one agent works, the others wait),
`random_choice` (uniform over the menu) and the held-out partners (`variant_choice`, `Library.variants`):
scripted teammates with other conventions, written before any trained agent played with them (audit.py
--partners). Run `python options.py --game forage --show`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import envs
from envs import ACTIONS, DIRECTIONS, Game
from planner import adjacent_cells, distances, neighbours, step_toward
import plumbing

WAIT_STEPS = 3  # a wait option idles this many primitive steps


@dataclass(frozen=True, order=True)
class Option:
    kind: str  # the option type, e.g. "push"
    args: tuple  # its arguments, e.g. (1, "north")
    text: str  # canonical text, e.g. "push box 2 north"
    horizon: int  # timeout in primitive steps


@dataclass
class Execution:
    agent: int
    option: Option
    start: int  # primitive step at which it started
    duration: int = 0
    success: bool | None = None  # None: still running when the episode ended
    reason: str = ""
    facts: dict | None = None  # facts that held when it started (guards.py burn-in only)


class Library:
    """The option library of one game. Subclasses implement grounding, execution and the fact vocabulary."""

    kinds: tuple[str, ...] = ()
    feedback: bool = False  # observation() names the agent's last option when it failed (make_library)
    variants: dict[str, str] = {}  # held-out scripted partners: name -> what it does (scripted_variant)

    def ground(self, game: Game, agent: int) -> list[Option]:
        raise NotImplementedError

    def act(self, game: Game, agent: int, option: Option, memory: dict) -> int:
        """The primitive action this step; `memory` is the execution's private scratch dict."""
        raise NotImplementedError

    def outcome(self, game: Game, agent: int, option: Option, memory: dict, events: list) -> tuple | None:
        """After a step: (success, reason) if the option terminated, else None."""
        raise NotImplementedError

    def facts(self, game: Game, agent: int, option: Option) -> dict[str, bool]:
        """Boolean facts about self, partner and each argument (names by role: 'arg0.heavy')."""
        return {}

    def describe(self, game: Game, agent: int, option: Option) -> str:
        """Menu text shown to the policy (may add the step distance: 'goto box 2 (3 steps)')."""
        return option.text

    def arrived(self, game: Game, agent: int, option: Option) -> bool:
        """True for a goto already next to its target: it would report success standing still (drop_arrived)."""
        return False

    def scripted(self, game: Game, runner: Runner, agent: int, menu: list[Option], solo: bool) -> Option:
        raise NotImplementedError

    def scripted_variant(self, game: Game, runner: Runner, agent: int, menu: list[Option], name: str) -> Option:
        """The option of the held-out scripted partner `name` (one of `variants`), in either seat."""
        raise NotImplementedError

    # helpers shared by the libraries
    @staticmethod
    def wait() -> Option:
        return Option("wait", (), "wait", WAIT_STEPS)

    def idle(self) -> Option:
        """The option of an agent that does nothing (the audits' idle stand-in)."""
        return self.wait()

    @staticmethod
    def wait_action(game: Game, agent: int, passable) -> int:
        """Idle, but step away from an adjacent partner, so a waiting agent never blocks the only way to a target."""
        pos, others = game.pos[agent], partner_cells(game, agent)
        if not any(game.manhattan(pos, p) == 1 for p in others):
            return 0
        away = [(min(game.manhattan(n, p) for p in others), a) for a, n in neighbours(pos, game.width, game.height)
                if passable(n) and n not in others]
        far, action = max(away, key=lambda x: x[0], default=(0, 0))  # the first of the farthest
        return action if far > 1 else 0

    @staticmethod
    def waited(memory: dict) -> tuple | None:
        memory["steps"] = memory.get("steps", 0) + 1
        return (True, "waited") if memory["steps"] >= WAIT_STEPS else None

    @staticmethod
    def pick(menu: list[Option], kind: str, *args) -> Option:
        """The menu entry (kind, args), or wait if it is not on the menu."""
        fallback = next((o for o in menu if o.kind == "wait"), menu[-1])
        return next((o for o in menu if o.kind == kind and o.args == args), fallback)

    @staticmethod
    def mine(events: list, kind: str, agent: int, obj=None) -> bool:
        return any(e[0] == kind and agent in e[1] and (obj is None or e[2] == obj) for e in events)


def partner_cells(game: Game, agent: int) -> list[int]:
    return [p for j, p in enumerate(game.pos) if j != agent]


def with_steps(text: str, reach: dict[int, int], targets) -> str:
    """A menu text with the steps to the nearest of `targets` in `reach`: 'goto box 2 (3 steps)'."""
    steps = min((reach[c] for c in targets if c in reach), default=None)
    words = "here" if steps == 0 else f"{steps} step" + ("" if steps == 1 else "s")
    return text if steps is None else f"{text} ({words})"


def navigate(game: Game, agent: int, targets: list[int], passable, memory: dict) -> int:
    """Next action toward the nearest passable target, going around the partner, or through it if only the
    partner blocks the way (it may move). Stay (0), with memory['stuck'] set, when none is reachable at all.

    Deterministic planners can block each other for good, so every agent but the lowest-indexed gives way:
    after a failed move it stays one step (two agents entering one cell), and after a second it steps aside
    to a free neighbour (two agents in a corridor, each where the other must go: no waiting resolves it)."""
    pos, others = game.pos[agent], partner_cells(game, agent)
    targets = [c for c in targets if passable(c)]
    memory["stuck"] = False
    failed = memory.get("last_move") == pos
    if failed:
        memory["fails"] = memory.get("fails", 0) + 1
    elif not memory.get("yielded"):  # a step given way is not a success: keep counting
        memory["fails"] = 0
    memory["last_move"] = memory["yielded"] = None
    if failed and agent > 0:
        if memory["fails"] == 1:
            memory["yielded"] = True
            return 0
        aside = [(a, n) for a, n in neighbours(pos, game.width, game.height)
                 if passable(n) and n not in others and n != memory.get("entering")]
        if aside:
            memory["last_move"], memory["entering"] = pos, aside[0][1]
            return aside[0][0]
    goals = [c for c in targets if c not in others] or targets
    action = step_toward(pos, goals, passable, game.width, game.height, others)
    if action is None:
        action = step_toward(pos, targets, passable, game.width, game.height)
    if action:
        memory["last_move"] = pos
        memory["entering"] = next(n for a, n in neighbours(pos, game.width, game.height) if a == action)
    memory["stuck"] = action is None
    return action or 0


# ----------------------------------------------------------------------------- coop_push
class PushOptions(Library):
    """goto_box(b): walk next to box b. push(b, d): walk to the side opposite d and push until the small
    box moves one cell. push_heavy(b, d): the same for the heavy box, waiting there for the partner. wait()."""

    kinds = ("goto_box", "push", "push_heavy", "wait")
    variants = {"heavy_first": "pushes the heavy box north until it is delivered, then the small boxes in index "
                               "order (box 1 first), skipping one its partner pushes",
                "small_first": "pushes the small boxes first (the nearest one its partner does not push), and the "
                               "heavy box only when no small box is left for it"}

    def free(self, game, cell: int) -> bool:
        return not game.wall[cell] and cell not in game.box_at

    def ground(self, game, agent):
        menu = []
        for k in range(len(game.boxes)):
            menu.append(Option("goto_box", (k,), f"goto box {k + 1}", 15))
            # the two box types are two option types: a heavy box moves only under two pushers
            kind, word = ("push_heavy", "heavy box") if game.box_heavy[k] else ("push", "box")
            menu += [Option(kind, (k, d), f"push {word} {k + 1} {d}", 15) for d in DIRECTIONS]
        return menu + [self.wait()]

    def side(self, game, k: int, d: str, sign: int) -> list[int]:
        """Cells next to box k toward d (sign 1: where it moves) or away from d (-1: where its pushers stand)."""
        step = sign * game.delta[DIRECTIONS.index(d) + 1]
        return [c + step for c in game.boxes[k] if c + step not in game.boxes[k]]

    def act(self, game, agent, option, memory):
        if option.kind == "wait":
            return self.wait_action(game, agent, lambda c: self.free(game, c))
        pos, k = game.pos[agent], option.args[0]
        if game.delivered[k]:
            return 0
        if option.kind == "goto_box":
            targets = [c for box_cell in game.boxes[k] for c in adjacent_cells(box_cell, game.width, game.height)]
        else:
            d = option.args[1]
            if any(not self.free(game, c) for c in self.side(game, k, d, 1)):
                memory["blocked"] = True  # a wall or another box is in the way: fail at once
                return 0
            targets = self.side(game, k, d, -1)
            if pos in targets:
                memory["pushed"] = game.boxes[k]  # where the box was when we pushed
                return DIRECTIONS.index(d) + 1
        return navigate(game, agent, targets, lambda c: self.free(game, c), memory)

    def outcome(self, game, agent, option, memory, events):
        if option.kind == "wait":
            return self.waited(memory)
        k = option.args[0]
        pushed = memory.pop("pushed", None)
        if pushed is not None and (game.delivered[k] or game.boxes[k] != pushed):
            return True, "box moved"
        if game.delivered[k]:
            return False, "box already delivered"
        if memory.pop("blocked", False):
            return False, "box is blocked"
        if self.arrived(game, agent, option):
            return True, "next to the box"
        if memory.get("stuck"):
            return False, "no path"
        # a small box that did not move is blocked; a heavy box may still be waiting for the partner
        if pushed is not None and (not game.box_heavy[k] or
                                   any(not self.free(game, c) for c in self.side(game, k, option.args[1], 1))):
            return False, "box did not move"
        return None

    def facts(self, game, agent, option):
        me, others = game.pos[agent], partner_cells(game, agent)
        reach = distances(me, lambda c: self.free(game, c), game.width, game.height)
        f = {"self.next_to_partner": any(game.manhattan(me, p) == 1 for p in others)}
        if option.args:
            k = option.args[0]
            cells = game.boxes[k]
            around = [c for b in cells for c in adjacent_cells(b, game.width, game.height) if self.free(game, c)]
            f.update({"arg0.delivered": game.delivered[k], "arg0.heavy": game.box_heavy[k],
                      "arg0.next_to_self": any(game.manhattan(me, c) == 1 for c in cells),
                      "arg0.next_to_partner": any(game.manhattan(p, c) == 1 for p in others for c in cells),
                      "arg0.reachable_by_self": any(c in reach for c in around)})
        if len(option.args) > 1:
            d = option.args[1]
            behind = self.side(game, k, d, -1)
            f.update({**{f"arg1.{w}": d == w for w in DIRECTIONS},
                      "arg0.beyond_arg1_free": all(self.free(game, c) for c in self.side(game, k, d, 1)),
                      "arg0.arg1_toward_goal": min(game.goal_dist[c + game.delta[DIRECTIONS.index(d) + 1]]
                                                   for c in cells) < game.box_distance(k),
                      "arg0.behind_arg1_reachable_by_self": any(c in reach for c in behind),
                      "arg0.self_behind_arg1": me in behind,
                      "arg0.partner_behind_arg1": any(p in behind for p in others)})
        return f

    def arrived(self, game, agent, option):
        return option.kind == "goto_box" and not game.delivered[option.args[0]] and \
            any(game.manhattan(game.pos[agent], c) == 1 for c in game.boxes[option.args[0]])

    def describe(self, game, agent, option):
        if option.kind == "wait" or game.delivered[option.args[0]]:
            return option.text
        k = option.args[0]
        targets = self.side(game, k, option.args[1], -1) if option.kind != "goto_box" else \
            [c for b in game.boxes[k] for c in adjacent_cells(b, game.width, game.height)]
        reach = distances(game.pos[agent], lambda c: self.free(game, c), game.width, game.height)
        return with_steps(option.text, reach, targets)

    def scripted(self, game, runner, agent, menu, solo):
        """Heavy box first (both agents push it north), then the small boxes, split between the agents."""
        if solo and agent != 0:
            return self.pick(menu, "wait")
        return self.pusher(game, runner, agent, menu, solo, heavy_first=not solo)

    def pusher(self, game, runner, agent: int, menu: list[Option], solo: bool, heavy_first: bool,
               nearest: bool = True) -> Option:
        """The heavy box north if heavy_first, else a small box: one nobody else is pushing, preferably with no
        agent on its pushing spot or path, the nearest (nearest=False: the lowest index); with no small box left
        for it, the heavy box (solo: wait)."""
        left = [k for k in range(len(game.boxes)) if not game.delivered[k]]
        heavy = [k for k in left if game.box_heavy[k]]
        if heavy and heavy_first:
            return self.pick(menu, "push_heavy", heavy[0], "north")
        small = [k for k in left if not game.box_heavy[k]]
        taken = {o.args[0] for j, o in enumerate(runner.current) if j != agent and o is not None and o.args}
        free = [k for k in small if k not in taken] or ([] if len(small) == 1 and not solo else small)
        others = partner_cells(game, agent)
        free = [k for k in free if game.boxes[k][0] + game.width not in others and
                game.boxes[k][0] - game.width not in others] or free  # prefer no agent on its pushing spot/path
        if free:  # agents decide in index order, so they split the boxes
            k = min(free, key=lambda k: (game.manhattan(game.pos[agent], game.boxes[k][0] + game.width) if nearest
                                         else 0, k))
            return self.pick(menu, "push", k, "north")
        return self.pick(menu, "push_heavy", heavy[0], "north") if heavy and not solo else self.pick(menu, "wait")

    def scripted_variant(self, game, runner, agent, menu, name):
        return self.pusher(game, runner, agent, menu, False, name == "heavy_first", nearest=name == "small_first")


# ----------------------------------------------------------------------------- forage
class ForageOptions(Library):
    """goto_food(f): walk next to food f. load(f): walk next to f and load until it is collected. wait()."""

    kinds = ("goto_food", "load", "wait")
    variants = {"nearest_food": "loads the nearest food left; after a load of its own failed, it joins the food its "
                                "partner goes for",
                "highest_level": "loads the highest-level food left first (the nearest of equal levels); after a "
                                 "load of its own failed, it joins the food its partner goes for"}

    def free(self, game, cell: int) -> bool:
        return not game.wall[cell] and cell not in game.food_at

    def ground(self, game, agent):
        menu = []
        for k in range(len(game.food)):
            menu.append(Option("goto_food", (k,), f"goto food {k + 1}", 15))
            menu.append(Option("load", (k,), f"load food {k + 1}", 15))
        return menu + [self.wait()]

    def act(self, game, agent, option, memory):
        if option.kind == "wait":
            return self.wait_action(game, agent, lambda c: self.free(game, c))
        k = option.args[0]
        if game.collected[k]:
            return 0
        pos, food = game.pos[agent], game.food[k]
        if pos in game.neighbours[food]:
            return 5 if option.kind == "load" else 0
        return navigate(game, agent, game.neighbours[food], lambda c: self.free(game, c), memory)

    def outcome(self, game, agent, option, memory, events):
        if option.kind == "wait":
            return self.waited(memory)
        k = option.args[0]
        if option.kind == "load" and self.mine(events, "food_loaded", agent, k):
            return True, "food collected"
        if game.collected[k]:
            return False, "food already collected"
        if self.arrived(game, agent, option):
            return True, "next to the food"
        if memory.get("stuck"):
            return False, "no path"
        return None

    def facts(self, game, agent, option):
        me, others = game.pos[agent], partner_cells(game, agent)
        f = {"self.next_to_food": any(n in game.food_at for n in game.neighbours[me]),
             "self.next_to_partner": any(p in game.neighbours[me] for p in others)}
        if option.args:
            k = option.args[0]
            food = game.food[k]
            reach = distances(me, lambda c: self.free(game, c) and c not in others, game.width, game.height)
            f.update({"arg0.collected": game.collected[k],
                      "arg0.level_at_most_self": game.food_levels[k] <= game.agent_levels[agent],
                      "arg0.level_at_most_team": game.food_levels[k] <= sum(game.agent_levels),
                      "arg0.next_to_self": me in game.neighbours[food],
                      "arg0.next_to_partner": any(p in game.neighbours[food] for p in others),
                      "arg0.reachable_by_self": any(c in reach for c in game.neighbours[food])})
        return f

    def arrived(self, game, agent, option):
        return option.kind == "goto_food" and not game.collected[option.args[0]] and \
            game.pos[agent] in game.neighbours[game.food[option.args[0]]]

    def describe(self, game, agent, option):
        if option.kind == "wait" or game.collected[option.args[0]]:
            return option.text
        others = partner_cells(game, agent)
        reach = distances(game.pos[agent], lambda c: self.free(game, c) and c not in others, game.width, game.height)
        return with_steps(option.text, reach, game.neighbours[game.food[option.args[0]]])

    def scripted(self, game, runner, agent, menu, solo):
        """Cooperative: every agent loads the same food (the first one left), so any level sum suffices.
        Solo: the highest-level agent loads the food it can lift alone; the others wait."""
        left = [k for k in range(len(game.food)) if not game.collected[k]]
        if solo:
            worker = int(np.argmax(game.agent_levels))
            lift = [k for k in left if game.food_levels[k] <= game.agent_levels[worker]]
            if agent != worker or not lift:
                return self.pick(menu, "wait")
            return self.pick(menu, "load", min(lift, key=lambda k: (game.manhattan(game.pos[agent], game.food[k]), k)))
        return self.pick(menu, "load", left[0]) if left else self.pick(menu, "wait")

    def scripted_variant(self, game, runner, agent, menu, name):
        left = [k for k in range(len(game.food)) if not game.collected[k]]
        if not left:
            return self.pick(menu, "wait")
        # yield after a failure (a load that timed out waiting for help): otherwise two loaders that insist on
        # different foods that need both of them wait at them forever
        mine = runner.running[agent]  # this agent's last execution (ended: it is choosing), None at the start
        theirs = [run.option.args[0] for j, run in enumerate(runner.running) if j != agent and run is not None
                  and run.option.kind in ("goto_food", "load") and not game.collected[run.option.args[0]]]
        if mine is not None and mine.option.kind == "load" and mine.success is False and theirs:
            return self.pick(menu, "load", theirs[0])
        level_first = name == "highest_level"
        return self.pick(menu, "load", min(left, key=lambda k: (-game.food_levels[k] if level_first else 0,
                                                                game.manhattan(game.pos[agent], game.food[k]), k)))


# ----------------------------------------------------------------------------- kitchen
class KitchenOptions(Library):
    """fetch_onion(), fetch_dish(), put_onion(pot), plate_soup(pot) (waits at the pot while the soup cooks),
    serve(), place() (on the free counter nearest the partner's side), take(item), wait(). Each walks next to
    its station, faces it and interacts; an interaction that changes nothing is a failure, and three options
    fail at once, where the agent stands, when the state says they cannot act (`refusal`)."""

    kinds = ("fetch_onion", "fetch_dish", "put_onion", "plate_soup", "serve", "place", "take", "wait")
    SUCCESS = {"put_onion": "onion_in_pot", "plate_soup": "soup_plated", "serve": "soup_served",
               "place": "counter_place", "take": "counter_take"}
    variants = {"onion_cook": "fetches onions and puts them in pots (over a counter where it cannot reach a pot), "
                              "never dishes or soup",
                "dish_cook": "fetches dishes, plates soup and serves it (dishes over a counter where it cannot "
                             "reach a pot), never onions",
                "lone_cook": "the scripted cook as if it were alone: it fetches every onion and dish itself, "
                             "whatever its partner is fetching"}

    def ground(self, game, agent):
        menu = [Option("fetch_onion", (), "fetch an onion", 20), Option("fetch_dish", (), "fetch a dish", 20)]
        for k in range(len(game.pots)):
            menu.append(Option("put_onion", (k,), f"put onion in pot {k + 1}", 20))
            menu.append(Option("plate_soup", (k,), f"plate soup from pot {k + 1}", 20 + game.cook_time))
        menu += [Option("serve", (), "serve soup", 20), Option("place", (), "place item on counter", 20)]
        menu += [Option("take", (item,), f"take {item} from counter", 20) for item in game.ITEMS]
        return menu + [self.wait()]

    def reach(self, game, agent: int, others: bool = True) -> dict[int, int]:
        avoid = set(partner_cells(game, agent)) if others else set()
        return distances(game.pos[agent], lambda c: game.floor[c] and c not in avoid, game.width, game.height)

    def reachable(self, game, agent: int):
        """A test of cells: can the agent get next to one of them (walking through its partner)?"""
        reach = self.reach(game, agent, others=False)
        return lambda cells: any(n in reach for c in cells for n in adjacent_cells(c, game.width, game.height))

    def stations(self, game, agent: int, option: Option) -> list[int]:
        """Candidate cells to interact with, nearest first."""
        fixed = {"fetch_onion": game.onion_dispensers, "fetch_dish": game.dish_dispensers, "serve": game.windows}
        if option.kind in fixed:
            cells = fixed[option.kind]
        elif option.kind in ("put_onion", "plate_soup"):
            cells = [game.pots[option.args[0]]]
        elif option.kind == "take":
            cells = [c for c, (item, _) in game.on_counter.items() if item == option.args[0]]
        else:  # place: free counters, those the partner can also reach first (a hand-off spot)
            cells = [c for c in game.counters if c not in game.on_counter]
            mine = self.reachable(game, agent)
            theirs = [self.reachable(game, j) for j in range(game.n_agents) if j != agent]
            cells = [c for c in cells if mine([c]) and any(reachable([c]) for reachable in theirs)] or cells
        # nearest first, going around the partner; stations only reachable through the partner come last
        found = []
        for reach in (self.reach(game, agent), self.reach(game, agent, others=False)):
            dist = {c: min((reach[n] for n in adjacent_cells(c, game.width, game.height) if n in reach),
                           default=None) for c in cells}
            found += sorted((c for c in cells if dist[c] is not None and c not in found), key=lambda c: (dist[c], c))
        return found

    def act(self, game, agent, option, memory):
        if option.kind == "wait":
            return self.wait_action(game, agent, lambda c: game.floor[c])
        if refusal := self.refusal(game, agent, option):
            memory["refused"] = refusal
            return 0
        targets = self.stations(game, agent, option)
        if not targets:
            memory["stuck"] = True
            return 0
        # keep heading for the station chosen first: re-choosing the nearest each step can turn back and forth
        # forever when a partner steps aside in the same direction (a mirrored dance)
        targets.sort(key=lambda c: c != memory.get("station"))
        memory["station"] = targets[0]
        pos = game.pos[agent]
        for station in targets:
            if game.manhattan(pos, station) == 1:
                face = next(a for a in (1, 2, 3, 4) if pos + game.delta[a] == station)
                if game.facing[agent] != face:
                    return face  # turns without moving: the faced cell is not floor
                memory["interacted"] = True
                return 5
        return navigate(game, agent, adjacent_cells(targets[0], game.width, game.height), lambda c: game.floor[c],
                        memory)

    @staticmethod
    def refusal(game, agent: int, option: Option) -> str | None:
        """Why the option cannot act from this state (it then fails at once), or None. Walking first, a fetch
        with full hands would "succeed" with the item held all along, and a put or plate would block the tile by
        the pot and sometimes succeed as the partner changes it: no guard could hide them. Refused at once, they
        fail exactly when the state says so, and burn-in learns guards ("plate needs a full pot")."""
        kind = option.kind
        if kind in ("fetch_onion", "fetch_dish") and game.held[agent] is not None:
            return "hands are full"
        if kind == "put_onion" and game.pot_onions[option.args[0]] == 3:
            return "the pot is full"
        if kind == "plate_soup" and game.pot_onions[option.args[0]] < 3:
            return "no soup in the pot"
        return None

    def outcome(self, game, agent, option, memory, events):
        kind = option.kind
        if kind == "wait":
            return self.waited(memory)
        if "refused" in memory:
            return False, memory.pop("refused")
        if kind in ("fetch_onion", "fetch_dish") and memory.get("interacted"):
            want = "onion" if kind == "fetch_onion" else "dish"
            return (True, f"holding {want}") if game.held[agent] == want else (False, "hands are full")
        if kind in self.SUCCESS and self.mine(events, self.SUCCESS[kind], agent):
            return True, "done"
        if memory.pop("stuck", False):
            return False, "nothing reachable"
        if memory.pop("interacted", False):
            cooking = kind == "plate_soup" and game.held[agent] == "dish" and \
                game.pot_onions[option.args[0]] == 3 and game.pot_timer[option.args[0]] > 0
            if not cooking:
                return False, "interaction changed nothing"
        return None

    def facts(self, game, agent, option):
        reachable = self.reachable(game, agent)
        held = game.held[agent]
        partner = [j for j in range(game.n_agents) if j != agent]
        f = {"self.empty_handed": held is None, **{f"self.holding_{i}": held == i for i in game.ITEMS},
             "self.reaches_onions": reachable(game.onion_dispensers),
             "self.reaches_dishes": reachable(game.dish_dispensers),
             "self.reaches_window": reachable(game.windows), "self.reaches_a_pot": reachable(game.pots),
             "self.reaches_free_counter": reachable([c for c in game.counters if c not in game.on_counter]),
             **{f"partner.holding_{i}": any(game.held[j] == i for j in partner) for i in game.ITEMS},
             "partner.empty_handed": all(game.held[j] is None for j in partner),
             "partner.next_to_self": any(game.manhattan(game.pos[agent], game.pos[j]) == 1 for j in partner)}
        if option.kind in ("put_onion", "plate_soup"):
            k = option.args[0]
            state = game.pot_state(k)
            f.update({"arg0.empty": state == "empty", "arg0.full": game.pot_onions[k] == 3,
                      "arg0.cooking": state == "cooking", "arg0.ready": state == "ready",
                      "arg0.reachable_by_self": reachable([game.pots[k]]),
                      "arg0.next_to_self": game.manhattan(game.pos[agent], game.pots[k]) == 1})
        if option.kind == "take":
            item = option.args[0]
            f.update({f"arg0.{i}": item == i for i in game.ITEMS})
            f["arg0.on_reachable_counter"] = reachable([c for c, (i, _) in game.on_counter.items() if i == item])
        return f

    def describe(self, game, agent, option):
        if option.kind == "wait":
            return option.text
        targets = self.stations(game, agent, option)
        if not targets:
            return option.text
        reach = self.reach(game, agent, others=False)
        return with_steps(option.text, reach, adjacent_cells(targets[0], game.width, game.height))

    def scripted(self, game, runner, agent, menu, solo):
        """Cook, plate and serve; an agent that cannot reach a pot (forced_coordination) fetches onions and
        dishes and puts them on the shared counter, and the other takes them from there."""
        if solo and agent != 0:
            return self.pick(menu, "wait")
        others = [j for j in range(game.n_agents) if j != agent and not solo]
        return self.cook(game, runner, agent, menu, others, ("onion", "dish"))

    def scripted_variant(self, game, runner, agent, menu, name):
        if name == "lone_cook":
            return self.cook(game, runner, agent, menu, [], ("onion", "dish"))
        others = [j for j in range(game.n_agents) if j != agent]
        return self.cook(game, runner, agent, menu, others, ("onion",) if name == "onion_cook" else ("dish",))

    def cook(self, game, runner, agent: int, menu: list[Option], others: list[int], roles: tuple[str, ...]) -> Option:
        """The scripted cook's next option, counting on the items that `others` (agents) hold or fetch, and taking
        up only the steps of `roles`: 'onion' (fetch, take and put onions), 'dish' (fetch and take dishes, plate
        and serve soup). An item already in hand is always taken where it goes."""
        can = self.reachable(game, agent)
        counter = [item for item, _ in game.on_counter.values()]
        doing = [None if o is None else (o.kind, o.args) for o in runner.current]

        def busy_with(item: str) -> int:  # items on counters, or that other agents hold or are fetching
            fetching = ((f"fetch_{item}", ()), ("take", (item,)))
            return counter.count(item) + sum(game.held[j] == item or doing[j] in fetching for j in others)

        pots = [k for k in range(len(game.pots)) if can([game.pots[k]])]
        soups = game.pot_onions.count(3) + game.held.count("soup")
        fullest = max((n for n in game.pot_onions if n < 3), default=3)  # onions in the fullest open pot
        onions_needed = 3 - fullest if game.served + soups < game.orders else 0
        dish_needed = 3 in game.pot_onions and "dish" not in game.held and "soup" not in game.held and \
            busy_with("dish") == 0
        held = game.held[agent]
        if held == "soup":
            return self.pick(menu, "serve" if can(game.windows) else "place")
        if held == "dish":
            full = sorted((k for k in pots if game.pot_onions[k] == 3), key=lambda k: game.pot_timer[k])
            return self.pick(menu, "plate_soup", full[0]) if full else self.pick(menu, "place" if not pots else "wait")
        if held == "onion":
            open_pots = sorted((k for k in pots if game.pot_onions[k] < 3), key=lambda k: (-game.pot_onions[k], k))
            return self.pick(menu, "put_onion", open_pots[0]) if open_pots else self.pick(menu, "place")
        if "dish" in roles:
            if "soup" in counter and can(game.windows):
                return self.pick(menu, "take", "soup")
            if pots and "dish" in counter and (dish_needed or any(game.pot_onions[k] == 3 for k in pots)):
                return self.pick(menu, "take", "dish")
            if dish_needed and can(game.dish_dispensers):
                return self.pick(menu, "fetch_dish")
        if "onion" in roles:
            if pots and "onion" in counter:
                return self.pick(menu, "take", "onion")
            if onions_needed > busy_with("onion") and can(game.onion_dispensers):
                return self.pick(menu, "fetch_onion")
        return self.pick(menu, "wait")


# ----------------------------------------------------------------------------- primitive actions
class PrimitiveLibrary(Library):
    """The low-level action mode: every primitive action is a one-step option."""

    kinds = ("act",)

    def __init__(self, game_name: str):
        names = ACTIONS[:5] if game_name == "coop_push" else ACTIONS
        words = {"stay": "stay", "interact": "load" if game_name == "forage" else "interact"}
        self.options = [Option("act", (a,), words.get(n, f"move {n}"), 1) for a, n in enumerate(names)]

    def ground(self, game, agent):
        return list(self.options)

    def idle(self) -> Option:
        return self.options[0]  # stay

    def act(self, game, agent, option, memory):
        memory["from"] = game.pos[agent]
        return option.args[0]

    def outcome(self, game, agent, option, memory, events):
        a = option.args[0]
        ok = a == 0 or (game.pos[agent] != memory["from"] if a < 5 else any(agent in e[1] for e in events))
        return ok, "done" if ok else "no effect"


LIBRARIES = {"coop_push": PushOptions, "forage": ForageOptions, "kitchen": KitchenOptions}


def make_library(game: Game, action_mode: str = "options", feedback: bool = False) -> Library:
    """The option library for a game ('primitive': one-step primitive options); feedback: see Library.feedback."""
    if action_mode not in ("options", "primitive"):
        raise ValueError(f"unknown action mode '{action_mode}'; expected options or primitive")
    library = PrimitiveLibrary(game.name) if action_mode == "primitive" else LIBRARIES[game.name]()
    library.feedback = feedback
    return library


def drop_arrived(library: Library, menu_filter=None):
    """A menu filter: `menu_filter` (the guards') first, then without the options that have already arrived
    (Library.arrived); `wait` stays when nothing else does. Such an option reports success without acting, so
    a greedy policy can pick it forever and never see a failure."""

    def keep(game: Game, agent: int, menu: list[Option]) -> list[Option]:
        menu = menu_filter(game, agent, menu) if menu_filter is not None else menu
        kept = [o for o in menu if not library.arrived(game, agent, o)]
        return kept or [o for o in menu if o.kind == "wait"] or [library.wait()]

    return keep


def run_menu_filter(library: Library, guards_filter=None, arrived: str = "keep"):
    """The menu filter a run plays with (train.py's `--arrived`): its guards, then drop_arrived when arrived is
    'drop'. One place, so the audits of a run folder rebuild exactly the menus it trained on."""
    return drop_arrived(library, guards_filter) if arrived == "drop" else guards_filter


@dataclass
class Task:
    """What a team plays: a fresh game per episode, its option library, and the menu filter (run_menu_filter)."""

    new_game: Callable[[], Game]
    library: Library
    menu_filter: Callable | None = None


# ----------------------------------------------------------------------------- the asynchronous runner
@dataclass
class Runner:
    """Runs one episode of asynchronous options. Use: while not done: for agent in pending(): assign(...);
    advance(). `menu_filter(game, agent, options) -> options` applies guards (guards.py)."""

    game: Game
    library: Library
    menu_filter: object = None
    record_facts: bool = False
    current: list = field(default_factory=list)  # each agent's running Option (None: needs a decision)
    executions: list = field(default_factory=list)  # every Execution, in start order
    events: list = field(default_factory=list)  # (t, kind, agents, obj)
    rewards: list = field(default_factory=list)  # team reward of each step
    shaping: list = field(default_factory=list)  # the game's shaped reward of each step (training only; kitchen)
    on_step: object = None  # called as on_step(runner) after every primitive step (audit.py's GIF replay)

    def __post_init__(self):
        n = self.game.n_agents
        self.current, self.memory, self.running = [None] * n, [None] * n, [None] * n

    @property
    def done(self) -> bool:
        return self.game.done

    def pending(self) -> list[int]:
        """Agents whose option has terminated and who must choose the next one now."""
        return [] if self.game.done else [i for i, o in enumerate(self.current) if o is None]

    def menu(self, agent: int) -> list[Option]:
        options = self.library.ground(self.game, agent)
        return options if self.menu_filter is None else self.menu_filter(self.game, agent, options)

    def assign(self, agent: int, option: Option) -> None:
        facts = self.library.facts(self.game, agent, option) if self.record_facts else None
        run = Execution(agent, option, self.game.t, facts=facts)
        self.executions.append(run)
        self.current[agent], self.memory[agent], self.running[agent] = option, {}, run

    def advance(self) -> None:
        """Step the game until some agent needs a decision or the episode ends."""
        game, lib = self.game, self.library
        while not game.done and None not in self.current:
            joint = [lib.act(game, i, self.current[i], self.memory[i]) for i in range(game.n_agents)]
            reward, _, _, events = game.step(joint)
            self.rewards.append(reward)
            self.shaping.append(game.shaping)
            self.events += [(game.t, *e) for e in events]
            for i in range(game.n_agents):
                run = self.running[i]
                run.duration += 1
                result = lib.outcome(game, i, self.current[i], self.memory[i], events)
                if result is None and run.duration >= run.option.horizon:
                    result = (False, "timeout")
                if result is not None:
                    run.success, run.reason = result
                    self.current[i] = None
            if self.on_step is not None:
                self.on_step(self)


def observation(runner: Runner, agent: int, menu: list[Option]) -> tuple[str, list[str]]:
    """What the policy reads: the agent's view, what the partner is doing now, and the menu texts (with step
    distances). With `library.feedback`, also the agent's last option if it failed: otherwise a greedy policy
    sees the same text after a failure and retries the same option forever."""
    game = runner.game
    lines = [game.view(agent)]
    for j, option in enumerate(runner.current):
        if j != agent:
            # a partner who chose at this very step is still choosing: one step's decisions are made together
            doing = "choosing" if option is None or runner.running[j].start == game.t else option.text
            lines.append(f"{game.partner_word(agent, j).capitalize()} is doing: {doing}.")
    last = runner.running[agent]  # the agent's latest execution (ended, since it is choosing), or None
    if runner.library.feedback and last is not None and last.success is False:
        lines.append(f"Failed: {last.option.text}.")  # terse: prompts stay short
    return "\n".join(lines), [runner.library.describe(game, agent, o) for o in menu]


@dataclass
class Episode:
    total_reward: float
    score: float
    steps: int
    executions: list
    events: list
    frames: list


def run_episode(game: Game, library: Library, choose, seed: int, menu_filter=None, record_facts: bool = False,
                show: bool = False, on_step=None) -> Episode:
    """Reset `game` with `seed` and play one episode; `choose(runner, agent, menu) -> Option`."""
    game.reset(seed)
    runner = Runner(game, library, menu_filter, record_facts, on_step=on_step)
    if on_step is not None:
        on_step(runner)  # the start state, before any option runs
    frames = [game.render()] if show else []
    while not runner.done:
        for agent in runner.pending():
            runner.assign(agent, choose(runner, agent, runner.menu(agent)))
        runner.advance()
        if show:
            doing = "  ".join(f"{i + 1}:{o.text if o else '-'}" for i, o in enumerate(runner.current))
            frames.append(game.render() + "\n" + doing)
    return Episode(game.total_reward, game.score, game.t, runner.executions, runner.events, frames)


def scripted_choice(solo: bool = False):
    """The scripted team as a `choose` function (cooperative, or solo: one agent works)."""
    return lambda runner, agent, menu: runner.library.scripted(runner.game, runner, agent, menu, solo)


def variant_choice(name: str):
    """A held-out scripted partner (Library.variants) as a `choose` function; 'standard' is scripted_choice()."""
    if name == "standard":
        return scripted_choice()
    return lambda runner, agent, menu: runner.library.scripted_variant(runner.game, runner, agent, menu, name)


def random_choice(rng: np.random.Generator):
    """Uniform over the menu it is given (the unfiltered menu unless a menu_filter is set)."""
    return lambda runner, agent, menu: menu[int(rng.integers(len(menu)))]


def play_scripted(game: Game, team: str, seed: int, show: bool = False) -> Episode:
    """Play one episode with the 'coop', 'solo' or 'random' (uniform over options) team."""
    choose = random_choice(np.random.default_rng(seed)) if team == "random" else scripted_choice(team == "solo")
    episode = run_episode(game, make_library(game), choose, seed, show=show)
    for frame in episode.frames:
        print(frame + "\n")
    return episode


def main(argv: list[str] | None = None) -> None:
    parser = plumbing.ArgumentParser(description="Watch a scripted team play one episode of a game.")
    parser.add_argument("--game", default="coop_push", choices=list(envs.GAMES))
    parser.add_argument("--layout", default=None, help="a built-in layout name or a layout file")
    parser.add_argument("--seed", type=plumbing.number(0, integer=True), default=0)
    parser.add_argument("--team", default="coop", choices=["coop", "solo", "random"])
    parser.add_argument("--show", action="store_true", help="print every frame")
    cli = parser.parse_args(argv)
    game = envs.make_game(cli.game, cli.layout, cli.seed)
    result = play_scripted(game, cli.team, cli.seed, show=cli.show)
    print(f"{cli.game}/{game.layout_name} team={cli.team} seed={cli.seed}: reward {result.total_reward:g}, "
          f"score {result.score:.2f}, steps {result.steps}")


if __name__ == "__main__":
    plumbing.run_cli(main)
