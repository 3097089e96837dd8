"""Differential check: envs.Kitchen against the Overcooked-AI 1.1.0 package itself, rule by rule.

Not part of the suite (overcooked-ai is not a dependency; the suite checks a plain reading of its step instead,
`-k oai_differential`). To re-run (about a minute on one core):
    pip install --no-deps --target /tmp/oai overcooked-ai==1.1.0 gym==0.26.2 cloudpickle gym_notices
    PYTHONPATH=/tmp/oai nice -n 10 python results/kitchen-oai-differential/compare.py \
        2>/dev/null > results/kitchen-oai-differential/output.txt
One-step comparisons: at every step of random play (uniform random joint actions), kitchen's state is written as
a 1.1.0 `OvercookedState` on the same terrain (built from kitchen's layout, so the agents are numbered as in
kitchen), both take the same joint action, and the results are compared per rule. Episodes start from kitchen's
own resets, then from random states (random items in hands and on counters, pots at every stage), where soups
get served. Two 1.1.0 games are stepped: as released, and with the 2019 paper's automatic start
(`old_dynamics=True` in later Overcooked-AI; 1.1.0 lacks it): a pot holding 3 onions starts cooking at the end
of the step, and an empty-handed interact at a pot does nothing (replaced by "stay", the same effect there).
"""
import argparse
import os
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")  # gym 0.26's NumPy 2 notice
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from overcooked_ai_py.mdp.actions import Action, Direction  # noqa: E402
from overcooked_ai_py.mdp.overcooked_mdp import (  # noqa: E402
    ObjectState, OvercookedGridworld, OvercookedState, PlayerState, SoupState)

import envs  # noqa: E402

ACTIONS = [Action.STAY, Direction.NORTH, Direction.SOUTH, Direction.WEST, Direction.EAST, Action.INTERACT]
ORDERS = [{"ingredients": ["onion"] * 3}]  # onion soup, the only order (20 points)


class AutoStart(OvercookedGridworld):
    """1.1.0 with the automatic start: a pot's 3rd onion starts it at the end of the step, cooking that step."""

    def step_environment_effects(self, state):
        for obj in state.objects.values():
            if obj.name == "soup" and obj.is_idle and len(obj.ingredients) == 3:
                obj.begin_cooking()
        super().step_environment_effects(state)


def tick(game: envs.Kitchen, k: int) -> int:
    """A kitchen pot's cooking progress as 1.1.0's tick: -1 idle; timer T (steps left, counted down before the
    interacts) is tick min(cook_time + 1 - T, cook_time) (counted up after them)."""
    c = game.cook_time
    return min(c + 1 - game.pot_timer[k], c) if game.pot_onions[k] == 3 else -1


def item(name: str, xy: tuple) -> ObjectState:
    return SoupState.get_soup(xy, num_onions=3, finished=True) if name == "soup" else ObjectState(name, xy)


def to_oai(game: envs.Kitchen) -> OvercookedState:
    xy = [tuple(reversed(game.rc(c))) for c in range(len(game.cells))]  # (x, y) = (column, row)
    players = [PlayerState(xy[p], ACTIONS[f], item(h, xy[p]) if h else None)
               for p, f, h in zip(game.pos, game.facing, game.held)]
    objects = {xy[c]: item(name, xy[c]) for c, (name, _) in game.on_counter.items()}
    for k, c in enumerate(game.pots):
        if game.pot_onions[k]:
            objects[xy[c]] = SoupState.get_soup(xy[c], num_onions=game.pot_onions[k], cooking_tick=tick(game, k))
    return OvercookedState(players, objects, all_orders=ORDERS)


def kitchen_view(game: envs.Kitchen) -> dict:
    """What each rule decides, in kitchen's terms."""
    return {"positions": [game.rc(p) for p in game.pos], "facing": list(game.facing), "held": list(game.held),
            "counters": {game.rc(c): name for c, (name, _) in game.on_counter.items()},
            "pot onions": list(game.pot_onions), "pot ticks": [tick(game, k) for k in range(len(game.pots))]}


def oai_view(game: envs.Kitchen, state: OvercookedState) -> dict:
    pots = [state.objects.get(tuple(reversed(game.rc(c)))) for c in game.pots]
    return {"positions": [(y, x) for x, y in state.player_positions],
            "facing": [ACTIONS.index(o) for o in state.player_orientations],
            "held": [p.held_object.name if p.held_object else None for p in state.players],
            "counters": {(y, x): o.name for (x, y), o in state.objects.items() if (x, y) not in
                         {tuple(reversed(game.rc(c))) for c in game.pots}},
            "pot onions": [len(s.ingredients) if s else 0 for s in pots],
            "pot ticks": [s._cooking_tick if s else -1 for s in pots]}


ROWS = ["positions (movement, collisions)", "facing", "held items", "counters", "pot onions",
        "pot cooking, no pot filled or empty-handed interact", "a pot's 3rd onion: cooking starts",
        "empty-handed interact at a 1-2 onion pot: nothing", "delivery reward (20 a soup), steps with one",
        "shaping: onion in pot (3), steps with one", "shaping: soup plated (5), steps with one",
        "shaping: dish from dispenser (3), steps with one"]


def random_state(game: envs.Kitchen, rng: np.random.Generator) -> None:
    """Random items in hands and on counters, random pots (cooking and ready too): every interact occurs."""
    items = (None, "onion", "dish", "soup")
    game.held = [items[int(rng.integers(4))] for _ in game.held]
    game.on_counter = {c: (items[int(rng.integers(1, 4))], -1) for c in game.counters if rng.random() < 0.25}
    game.pot_onions = [int(rng.integers(4)) for _ in game.pots]
    game.pot_timer = [int(rng.integers(game.cook_time + 1)) if n == 3 else 0 for n in game.pot_onions]


def compare(layout: str, starts: str, steps: int, rng: np.random.Generator, counts: dict, extra: dict) -> None:
    """`steps` one-step comparisons on `layout`, episodes from kitchen's resets or from random states."""
    game = envs.make_game("kitchen", layout)
    params = {"start_all_orders": ORDERS, "cook_time": game.cook_time}
    released = OvercookedGridworld.from_grid([r.replace(".", " ") for r in game.rows], params)
    autostart = OvercookedGridworld.from_grid([r.replace(".", " ") for r in game.rows], params)
    autostart.__class__ = AutoStart  # from_grid is a staticmethod that always builds the base class
    seed = 0
    game.reset(seed)
    for _ in range(steps):
        if game.done or (starts == "random states" and game.t == 0):
            seed += game.t > 0
            game.reset(seed)
            if starts == "random states":
                random_state(game, rng)
        acts = [int(a) for a in rng.integers(6, size=game.n_agents)]
        faced = [game.cells[p + game.delta[f]] for p, f in zip(game.pos, game.facing)]
        before, served = to_oai(game), game.served
        counter_dish = any(name == "dish" for name, _ in game.on_counter.values())  # as the step begins
        at_pot = [[a == 5 and h == held and p + game.delta[f] == c
                   for a, h, p, f in zip(acts, game.held, game.pos, game.facing)] for held in ("onion", None)
                  for c in game.pots]
        filled = [k for k in range(len(game.pots)) if game.pot_onions[k] == 2 and any(at_pot[k])]
        started_by_hand = [k for k in range(len(game.pots))
                           if 0 < game.pot_onions[k] < 3 and any(at_pot[len(game.pots) + k])]
        claims = [p + game.delta[a] if 1 <= a <= 4 and game.floor[p + game.delta[a]] else p
                  for p, a in zip(game.pos, acts)]
        extra["collision steps"] += claims[0] == claims[1] or claims == game.pos[::-1] != game.pos
        dish_pickups = sum(a == 5 and h is None and ch == "D" for a, h, ch in zip(acts, game.held, faced))
        results = []
        for mdp, joint in ((released, [ACTIONS[a] for a in acts]),
                           (autostart, [Action.STAY if a == 5 and h is None and ch == "P" else ACTIONS[a]
                                        for a, h, ch in zip(acts, game.held, faced)])):
            new, info = mdp.get_state_transition(before, joint)
            ev = info["event_infos"]
            potted = sum(ev["potting_onion"])
            dish = sum(3 * (a == 5 and h is None and ch == "D" and useful)  # a dish from a counter is never shaped
                       for a, h, ch, useful in zip(acts, game.held, faced, ev["useful_dish_pickup"]))
            plated = (sum(info["shaped_reward_by_agent"]) - 3 * potted - dish) // 5
            results.append((oai_view(game, new), sum(info["sparse_reward_by_agent"]), potted, dish, plated))
        reward, _, _, events = game.step(acts)
        mine = kitchen_view(game)
        potted = sum(e[0] == "onion_in_pot" for e in events)
        plated = sum(e[0] == "soup_plated" for e in events)
        dish = game.shaping - 3 * potted - 5 * plated
        special = set(filled) | set(started_by_hand)
        for col, (view, sparse, o_potted, o_dish, o_plated) in enumerate(results, start=1):
            checks = [(ROWS[0], True, view["positions"] == mine["positions"]),
                      (ROWS[1], True, view["facing"] == mine["facing"]),
                      (ROWS[2], True, view["held"] == mine["held"]),
                      (ROWS[3], True, view["counters"] == mine["counters"]),
                      (ROWS[4], True, view["pot onions"] == mine["pot onions"]),
                      (ROWS[5], not special, view["pot ticks"] == mine["pot ticks"])]
            checks += [(ROWS[6], True, view["pot ticks"][k] == mine["pot ticks"][k]) for k in filled]
            checks += [(ROWS[7], True, view["pot ticks"][k] == mine["pot ticks"][k]) for k in started_by_hand]
            checks += [(ROWS[8], sparse > 0 or reward > 0, sparse == reward),
                       (ROWS[9], o_potted > 0 or potted > 0, o_potted == potted),
                       (ROWS[10], o_plated > 0 or plated > 0, o_plated == plated),
                       (ROWS[11], dish_pickups > 0, o_dish == dish)]
            for row, applies, agree in checks:
                if applies:
                    counts[row][0] += col == 1
                    counts[row][col] += agree
        extra["dish pickups"] += dish_pickups
        differ = int(abs(results[0][3] - dish)) // 3
        extra["dish pickups shaped differently"] += differ
        extra["... of them with a dish on a counter"] += differ * counter_dish
        extra["deliveries past the last order"] += results[0][1] != reward and served < game.orders == game.served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40_000, help="one-step comparisons per layout and start kind")
    cli = parser.parse_args()
    rng = np.random.default_rng(0)
    layouts = ("cramped_room", "asymmetric_advantages", "forced_coordination")
    for layout in layouts:
        game = envs.make_game("kitchen", layout)
        ours = OvercookedGridworld.from_grid([r.replace(".", " ") for r in game.rows])
        theirs = OvercookedGridworld.from_layout_name(layout)  # its own layout file, its own numbering
        assert ours.terrain_mtx == theirs.terrain_mtx, layout
        order = [theirs.start_player_positions.index(xy) + 1 for xy in ours.start_player_positions]
        print(f"{layout}: the terrain of Overcooked-AI's layout file; kitchen's agents 1, 2 start where its "
              f"players {order[0]}, {order[1]} do")
    for starts in ("kitchen's resets", "random states"):
        counts = {row: [0, 0, 0] for row in ROWS}  # cases, agree with 1.1.0, agree with 1.1.0 + automatic start
        extra = dict.fromkeys(("collision steps", "dish pickups", "dish pickups shaped differently",
                               "... of them with a dish on a counter", "deliveries past the last order"), 0)
        for layout in layouts:
            compare(layout, starts, cli.steps, rng, counts, extra)
        print(f"\n{len(layouts) * cli.steps} one-step comparisons ({cli.steps} per layout), random joint actions, "
              f"episodes from {starts}\n")
        print("| rule | cases | agree with 1.1.0 | agree with 1.1.0 + automatic start |\n| --- | --- | --- | --- |")
        for row in ROWS:
            print(f"| {row} | " + " | ".join(str(n) for n in counts[row]) + " |")
        print("\n" + "; ".join(f"{k}: {v}" for k, v in extra.items()))


if __name__ == "__main__":
    main()
