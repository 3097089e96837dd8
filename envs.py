"""The spatial cooperative games: layouts, state, `step`, attributed events, text views.

Three grid games share one shape (the `Game` base class): an ASCII layout is parsed and validated, `reset(seed)`
places agents (and, in `forage`, food) with a `numpy.random.Generator`, and `step(actions)` applies one joint
primitive action and returns `(reward, terminated, truncated, events)`, each event being `(kind, agents, obj)`:
what moved the task forward, which agent(s) caused it, on which object (the audits in audit.py are built on them).
`score` is the fraction of the layout's achievable reward earned, in [0, 1]. Primitive actions (every game): 0 stay,
1 north, 2 south, 3 west, 4 east, 5 interact (`load` in forage; a no-op in coop_push). Movement is one helper,
`Game.resolve_moves`, with one rule per game.

Layout files: the map (one character a cell; agents are the digits 1..9), then optional `key: value` lines:

    #######
    #ggggg#
    #.b.HH#
    #1...2#
    #######
    max_steps: 60

A malformed layout raises `LayoutError` naming the line and column and what was expected. `python envs.py --layout
my_map.txt` checks a layout and shows a start state; `python options.py --game kitchen --show` watches the scripted
team play. The games import nothing above them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re

import numpy as np

import plumbing
from plumbing import LayoutError, option_bool, option_int, option_ints, parse_layout

ACTIONS = ("stay", "north", "south", "west", "east", "interact")
DIRECTIONS = ("north", "south", "west", "east")  # action index = DIRECTIONS.index(d) + 1


# ----------------------------------------------------------------------------- the shared game shape
class Game:
    """Base class: a grid, agents, a step counter, a team return; subclasses implement the rules.
    Cells are flat integers `r * width + c`; `delta[a]` moves a cell by action `a`.

    A game sets the class attributes below and implements `step(actions)` (the rules, in phases), `view(agent)` (the
    state in words for the agent's prompt), `render()` (a text frame), `labels()` (object names by cell, numbered as
    in the options' texts, for audit.replay_gif), `max_reward` (the layout's achievable reward), `setup()` (parse
    the layout's static parts, once), `reset_objects(rng)` (place the dynamic objects), `objects_key()` (their part
    of start_key), `task_cells()` (the cells agents act on from a neighbouring cell) and `unsolvable()` (why the full
    reward can never be earned, by a static reachability test, or None); optionally `walkable` and `occupied_cells`."""

    name = "game"
    rules = ""  # one or two sentences for the LLM's system prompt
    legend: dict[str, str] = {}
    keys: dict[str, str] = {}
    layouts: dict[str, str] = {}
    default_layout = ""
    solo_layouts: tuple[str, ...] = ()  # built-in layouts where one agent can earn the maximum reward
    default_max_steps = 100  # for a layout without `max_steps`
    movement = "blocking"  # the movement rule of resolve_moves: "lb-foraging", "overcooked" or "blocking"
    players = 2  # agents a layout of the game must have (prompts, options and audits are written for two)
    shaped = False  # whether step() sets `shaping`, a training-only reward (train.py --shaping; kitchen)
    shaping = 0.0  # the last step's shaped reward, in reward units; never part of the reward or the score

    def __init__(self, layout: str | None = None, seed: int = 0):
        layout = layout or self.default_layout
        if layout in self.layouts:
            self.layout_name, text = layout, self.layouts[layout]
        elif "\n" in layout:
            self.layout_name, text = "custom", layout
        else:
            if not os.path.isfile(layout):
                raise LayoutError(f"unknown layout '{layout}' for game '{self.name}'; expected one of "
                                  f"{', '.join(self.layouts)} or a layout file path")
            try:
                self.layout_name, text = layout, plumbing.read_text(layout, f"a {self.name} layout file (see envs.py)")
            except plumbing.InputError as error:
                raise LayoutError(f"layout {error}") from None
        self.rows, self.options = parse_layout(text, self.legend, self.keys, self.layout_name)
        self.height, self.width = h, w = len(self.rows), len(self.rows[0])
        self.delta = (0, -w, w, -1, 1, 0)
        self.cells = "".join(self.rows)
        # the cells next to each cell inside the grid (no wrap-around), north, south, west, east (lb-foraging's order)
        self.neighbours = [tuple(n for n, ok in ((c - w, c >= w), (c + w, c < w * (h - 1)), (c - 1, c % w > 0),
                                                 (c + 1, c % w < w - 1)) if ok) for c in range(w * h)]
        self.agent_starts = [self.cells.index(str(k + 1)) for k in range(sum(ch.isdigit() for ch in self.cells))]
        self.n_agents = len(self.agent_starts)
        self.max_steps = option_int(self.options, "max_steps", self.default_max_steps, self.layout_name)
        self.random_starts = option_bool(self.options, "random_starts", False, self.layout_name)
        self.setup()
        self.regions = [self.start_region(start) for start in self.agent_starts]
        self.region_sets = [set(region) for region in self.regions]  # for membership tests
        self.reset(seed)

    # -- defaults a game may override
    def walkable(self, cell: int) -> bool:
        """Static walkability (ignoring agents and movable objects), used for start regions."""
        return self.cells[cell] != "#"

    def occupied_cells(self) -> set[int]:
        """Cells no agent may start on (boxes, food)."""
        return set()

    # -- shared
    def reset(self, seed: int | None = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.total_reward = self.shaping = 0.0
        self.done = False
        self.reset_objects(self.rng)
        self.pos = list(self.agent_starts)
        if self.random_starts:
            # a random free cell of the agent's start region, so a layout split into rooms keeps one agent per room
            taken = self.occupied_cells()
            for i, region in enumerate(self.regions):
                free = [c for c in region if c not in taken]
                self.pos[i] = free[int(self.rng.integers(len(free)))]
                taken.add(self.pos[i])

    def start_key(self) -> tuple:
        """What the current state is made of (agents' cells and the game's dynamic objects), as plain
        integers and strings: right after reset, two seeds with equal keys start the same episode."""
        return (tuple(self.pos), self.objects_key())

    def start_region(self, start: int) -> list[int]:
        """The cells reachable from an agent's marked start by static walkability, sorted."""
        seen, frontier = {start}, [start]
        while frontier:
            for n in self.neighbours[frontier.pop()]:
                if n not in seen and self.walkable(n):
                    seen.add(n)
                    frontier.append(n)
        return sorted(seen)

    def reachers(self, cell: int) -> set[int]:
        """The agents whose start region holds a cell next to `cell` (who can act on it)."""
        return {i for i, region in enumerate(self.region_sets) if not region.isdisjoint(self.neighbours[cell])}

    def stranded(self) -> str | None:
        """An agent walled into a pocket with no task cell next to any cell it can walk to, or None: a team
        whose reward is reachable may still have a member who can never act."""
        for i, region in enumerate(self.regions):
            if not {n for c in region for n in (c, *self.neighbours[c])} & self.task_cells():
                return f"agent {i + 1} (at {self.where(self.agent_starts[i])}) can reach nothing to act on"
        return None

    def where(self, cell: int) -> str:
        r, c = self.rc(cell)
        return f"line {r + 1} column {c + 1}"

    def layout_error(self, cell: int, expected: str) -> LayoutError:
        return LayoutError(f"layout '{self.layout_name}': {self.where(cell)}: expected {expected}")

    def on_edge(self, cell: int) -> bool:
        r, c = self.rc(cell)
        return r in (0, self.height - 1) or c in (0, self.width - 1)

    @property
    def score(self) -> float:
        """Normalized return in [0, 1]: the fraction of the layout's achievable reward earned so far."""
        return self.total_reward / self.max_reward

    def rc(self, cell: int) -> tuple[int, int]:
        return divmod(cell, self.width)

    def relation(self, agent: int, cell: int) -> str:
        """Where `cell` is from `agent` in words: '2 north 1 east' ('here' on it)."""
        (r0, c0), (r1, c1) = self.rc(self.pos[agent]), self.rc(cell)
        dr, dc = r1 - r0, c1 - c0
        parts = [f"{abs(dr)} {'north' if dr < 0 else 'south'}"] if dr else []
        parts += [f"{abs(dc)} {'west' if dc < 0 else 'east'}"] if dc else []
        return " ".join(parts) or "here"

    def side_of(self, agent: int, cell: int) -> str | None:
        """'south' if the agent stands directly south of `cell`, etc.; None if not adjacent."""
        (r0, c0), (r1, c1) = self.rc(self.pos[agent]), self.rc(cell)
        return {(1, 0): "south", (-1, 0): "north", (0, 1): "east", (0, -1): "west"}.get((r0 - r1, c0 - c1))

    def manhattan(self, a: int, b: int) -> int:
        (r0, c0), (r1, c1) = self.rc(a), self.rc(b)
        return abs(r0 - r1) + abs(c0 - c1)

    def nearest(self, agent: int, cells) -> int:
        """The cell of `cells` nearest the agent (Manhattan distance; ties: the lowest cell)."""
        return min(cells, key=lambda c: (self.manhattan(self.pos[agent], c), c))

    def partner_word(self, agent: int, other: int) -> str:
        return "partner" if self.n_agents == 2 else f"agent {other + 1}"

    def others(self, agent: int) -> list[int]:
        return [j for j in range(self.n_agents) if j != agent]

    def resolve_moves(self, actions: list[int], free) -> list[int]:
        """The agents' cells after one joint action. Each agent claims the cell its move enters if it is inside
        the grid and `free(cell)` (walkable now, agents aside), else its own cell (no move, a blocked move,
        interact); the game's `movement` rule settles the conflicts:
        - "lb-foraging" (forage): agents claiming one cell all stay, so following and swapping are allowed.
        - "overcooked" (kitchen, Overcooked-AI's `_handle_collisions`): if any two agents would end in one cell
          or swap cells, nobody moves; otherwise everyone moves (following is allowed).
        - "blocking" (coop_push, this project's own rule): a cell an agent occupied at the start of the step
          cannot be entered; agents claiming one cell all stay."""
        pos, n = self.pos, self.n_agents
        claims = []
        for i, a in enumerate(actions):
            cell = pos[i] + self.delta[a] if 1 <= a <= 4 else pos[i]
            ok = cell in self.neighbours[pos[i]] and free(cell) and not (self.movement == "blocking" and cell in pos)
            claims.append(cell if ok else pos[i])
        if self.movement == "overcooked":
            swap = any(claims[i] == pos[j] and claims[j] == pos[i] for i in range(n) for j in range(i + 1, n))
            return list(pos) if swap or len(set(claims)) < n else claims
        targets = [pos[i] if claims.count(claims[i]) > 1 else claims[i] for i in range(n)]
        # with 3+ agents a mover can enter the cell of an agent whose move failed (lb-foraging stacks the two):
        while len(set(targets)) < n:  # here it stays too, until no cell holds two agents
            for i in range(n):
                if targets[i] != pos[i] and targets.count(targets[i]) > 1:
                    targets[i] = pos[i]
        return targets

    def frame(self, chars: list[str], status: str) -> str:
        """The map drawn from `chars` (one per cell, objects drawn), the agents on top, a status line below."""
        for i, p in enumerate(self.pos):
            chars[p] = str(i + 1)
        w = self.width
        return "\n".join(["".join(chars[r * w:(r + 1) * w]) for r in range(self.height)] + [status])

    def finish_step(self, reward: float, all_done: bool, events: list) -> tuple[float, bool, bool, list]:
        """Count the step and the reward; terminated when `all_done`, else truncated at max_steps."""
        self.t += 1
        self.total_reward += reward
        truncated = not all_done and self.t >= self.max_steps
        self.done = all_done or truncated
        return reward, all_done, truncated, events


def in_words(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# ----------------------------------------------------------------------------- start states: train / validation / test
# A start state's split is a hash of its key (Game.start_key), not of its seed, so training, validation
# (checkpoint selection) and test (every reported score) never share a start state, whatever the seeds.
SPLITS = {"test": 0.2, "validation": 0.1, "train": 0.7}  # shares of the start-state space
SPLIT_FIRST_SEED = {"test": 1_000_000, "validation": 2_000_000}  # where the fixed test/validation scans start


def split_of(key: tuple) -> str:
    """The split of a start state: a stable hash of its key mapped onto the SPLITS shares."""
    u = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "big") / 2.0 ** 64
    for split, share in SPLITS.items():
        if u < share:
            return split
        u -= share
    return "train"


def split_seeds(game: Game, split: str, count: int, first: int | None = None, distinct: bool = True) -> list[int]:
    """Up to `count` seeds whose start states lie in `split`, scanning first, first + 1, ... (default: the split's
    fixed start, so every run and audit sees the same test states); distinct: no two start the same episode
    (a layout with fewer returns all it has; callers say so). Resets `game`."""
    first = SPLIT_FIRST_SEED[split] if first is None else first
    seeds, seen = [], set()
    for seed in range(first, first + 200 * count + 2000):  # a scan for N start states tries 200 N + 2000 seeds
        game.reset(seed)
        key = game.start_key()
        if split_of(key) == split and not (distinct and key in seen):
            seeds.append(seed)
            seen.add(key)
            if len(seeds) == count:
                break
    return seeds


# ----------------------------------------------------------------------------- coop_push
class CoopPush(Game):
    """Cooperative box pushing (Seuken & Zilberstein 2007; macro-action version of Amato et al.).

    Map: '#' wall, '.' floor, 'g' goal cell, 'b' small box, 'HH' heavy box (1x2, horizontal), digits agents.
    Actions: stay, north, south, west, east (interact = stay).
    Rules: an agent moving into a box pushes it one cell if the cells beyond are free (floor or goal, no box, no
    agent). A small box moves when its pushers agree on one direction; the heavy box only when at least two agents
    push it the same way in the same step (and nobody pushes it another way). Pushers of a moved box step into the
    cell it left; otherwise they stay. Movement ("blocking" in Game.resolve_moves): no agent enters a cell another
    agent stood on at the start of the step; two agents moving into one cell both stay.
    Reward: a box whose cells all lie on goal cells is delivered and removed: small 10, heavy 100 (the classic
    benchmark's values). Terminated when every box is delivered; truncated at max_steps. Events: ('box_toward_goal',
    pushers, box) when a push brings the box closer to the goal, ('box_delivered', pushers, box), and ('joint_push',
    pushers, box) when the heavy box moves.
    """

    name = "coop_push"
    movement = "blocking"
    rules = "Push boxes north onto the goal row. A heavy box moves only if both agents push it together."
    legend = {"#": "wall", ".": "floor", "g": "goal", "b": "small box", "H": "heavy box half",
              **{str(k): f"agent {k}" for k in range(1, 10)}}
    keys = {"max_steps": "an integer in [1, 10000]", "random_starts": "yes or no"}
    SMALL, HEAVY = 10.0, 100.0
    layouts = {
        # the classic benchmark: two small boxes and one heavy box; the maximum needs both agents
        "classic": "#########\n#ggggggg#\n#.......#\n#.b.HH.b#\n#.......#\n#.......#\n#1.....2#\n#########\n"
                   "max_steps: 60\nrandom_starts: yes\n",
        # small boxes only: one agent can earn the maximum alone
        "small_boxes": "#######\n#ggggg#\n#.....#\n#.b.b.#\n#.....#\n#1...2#\n#######\n"
                       "max_steps: 50\nrandom_starts: yes\n",
        # the heavy box only: no single agent can earn anything
        "heavy_only": "#######\n#ggggg#\n#.....#\n#..HH.#\n#.....#\n#1...2#\n#######\n"
                      "max_steps: 50\nrandom_starts: yes\n",
    }
    default_layout = "classic"
    solo_layouts = ("small_boxes",)
    default_max_steps = 60

    def setup(self) -> None:
        cells = self.cells
        self.wall = [ch == "#" for ch in cells]
        self.goal = [ch == "g" for ch in cells]
        self.box_starts: list[tuple[int, ...]] = []
        for r, row in enumerate(self.rows):
            for box in re.finditer("b|HH|H", row):  # left to right, so 'HHHH' is two heavy boxes
                start = r * self.width + box.start()
                if box.group() == "H":
                    raise self.layout_error(start, "'HH' (a heavy box is two cells wide)")
                self.box_starts.append(tuple(range(start, start + len(box.group()))))
        self.box_heavy = [len(box) == 2 for box in self.box_starts]
        if not self.box_starts:
            raise self.layout_error(0, "at least one box ('b' or 'HH')")
        if not any(self.goal):
            raise self.layout_error(0, "at least one goal cell 'g'")
        for cell, ch in enumerate(cells):
            if self.on_edge(cell) and ch != "#":
                raise self.layout_error(cell, "'#' (the map must be enclosed by walls)")
        # Manhattan distance of each cell to the nearest goal cell: "toward the goal" means it shrinks
        goals = [g for g in range(len(cells)) if self.goal[g]]
        self.goal_dist = [min(self.manhattan(c, g) for g in goals) for c in range(len(cells))]
        self.box_value = [self.HEAVY if h else self.SMALL for h in self.box_heavy]

    def unsolvable(self) -> str | None:
        """Each box must reach cells that are all goal cells by pushes whose pusher cells agents can walk to
        (other boxes ignored: they can be moved); a heavy box moves only north or south (two pushers side by
        side; a row holds one pusher behind it)."""
        regions = self.region_sets
        reach = set().union(*regions)
        for box, heavy in zip(self.box_starts, self.box_heavy):
            seen, frontier, delivered = {box}, [box], False
            while frontier and not delivered:
                cells = frontier.pop()
                delivered = all(self.goal[c] for c in cells)
                for a in (1, 2) if heavy else (1, 2, 3, 4):
                    new = tuple(c + self.delta[a] for c in cells)
                    pushers = [c - self.delta[a] for c in cells] if heavy else [cells[0] - self.delta[a]]
                    # a heavy box's two pushers are two agents: each pusher cell in a different agent's reach
                    pushed = any(pushers[0] in a and pushers[1] in b for a in regions for b in regions if a is not b) \
                        if heavy else pushers[0] in reach
                    if new not in seen and not any(self.wall[c] for c in new) and pushed:
                        seen.add(new)
                        frontier.append(new)
            if not delivered:
                return (f"the {'heavy' if heavy else 'small'} box at {self.where(box[0])} can never be pushed onto "
                        "goal cells from cells the agents can reach" + (" (two agents, side by side)" if heavy else ""))
        return None

    def task_cells(self) -> set[int]:
        return {c for box in self.box_starts for c in box}

    def reset_objects(self, rng: np.random.Generator) -> None:
        self.boxes = [tuple(b) for b in self.box_starts]  # cells of each box
        self.delivered = [False] * len(self.boxes)
        self.box_at = {c: k for k, b in enumerate(self.boxes) for c in b}

    def occupied_cells(self) -> set[int]:
        return set(self.box_at) | {c for c in range(len(self.cells)) if self.goal[c]}

    def objects_key(self) -> tuple:
        return tuple(self.boxes)

    @property
    def max_reward(self) -> float:
        return sum(self.box_value)

    def box_distance(self, k: int) -> int:
        return min(self.goal_dist[c] for c in self.boxes[k])

    def step(self, actions: list[int]) -> tuple[float, bool, bool, list]:
        pos, delta, box_at, wall = self.pos, self.delta, self.box_at, self.wall
        events: list = []
        reward = 0.0
        # phase 1: who pushes which box in which direction
        pushes: dict[int, list[tuple[int, int]]] = {}
        for i, a in enumerate(actions):
            if 1 <= a <= 4 and (k := box_at.get(pos[i] + delta[a])) is not None:
                pushes.setdefault(k, []).append((i, a))
        # phase 2: boxes move when their pushers agree and the cells beyond are free
        moved_pushers: set[int] = set()
        for k, pushers in pushes.items():
            a = pushers[0][1]
            if any(p[1] != a for p in pushers) or (self.box_heavy[k] and len(pushers) < 2):
                continue
            old = self.boxes[k]
            new = tuple(c + delta[a] for c in old)
            if any(wall[c] or (c in box_at and box_at[c] != k) or c in pos for c in new):
                continue
            before = self.box_distance(k)
            for c in old:
                del box_at[c]
            self.boxes[k] = new
            self.delivered[k] = all(self.goal[c] for c in new)
            if not self.delivered[k]:
                box_at.update({c: k for c in new})
            agents = tuple(sorted(p[0] for p in pushers))
            moved_pushers.update(agents)
            if self.box_heavy[k]:
                events.append(("joint_push", agents, k))
            if self.box_distance(k) < before:
                events.append(("box_toward_goal", agents, k))
            if self.delivered[k]:
                reward += self.box_value[k]
                events.append(("box_delivered", agents, k))
        # phase 3: movement; an agent walking into an unmoved box or a cell a box or pusher just entered stays
        pusher_cells = {pos[i] + delta[actions[i]] for i in moved_pushers}
        moves = [0 if i in moved_pushers else a for i, a in enumerate(actions)]
        targets = self.resolve_moves(moves, lambda c: not wall[c] and c not in box_at and c not in pusher_cells)
        pos[:] = [pos[i] + delta[actions[i]] if i in moved_pushers else targets[i] for i in range(self.n_agents)]
        return self.finish_step(reward, all(self.delivered), events)

    def view(self, agent: int) -> str:
        """Relations in words, one line per object (what a small LLM can use)."""
        lines = [f"{self.partner_word(agent, j).capitalize()}: {self.relation(agent, self.pos[j])}."
                 for j in self.others(agent)]
        for k, cells in enumerate(self.boxes):
            kind = "heavy, needs 2 pushers" if self.box_heavy[k] else "small"
            if self.delivered[k]:
                lines.append(f"Box {k + 1} ({kind}): delivered.")
                continue
            rel = self.relation(agent, self.nearest(agent, cells))
            side = next((self.side_of(agent, c) for c in cells if self.side_of(agent, c)), None)
            where = f"; you are directly {side} of it" if side else ""
            lines.append(f"Box {k + 1} ({kind}): {rel}, {in_words(self.box_distance(k), 'row')} from goal{where}.")
        return "\n".join(lines)

    def render(self) -> str:
        chars = ["." if ch in "bH123456789" else ch for ch in self.cells]
        for c, k in self.box_at.items():  # the boxes not yet delivered
            chars[c] = "H" if self.box_heavy[k] else "b"
        return self.frame(chars, f"t={self.t} reward={self.total_reward:g} score={self.score:.2f}")

    def labels(self) -> dict[int, str]:
        return {c: f"{'heavy box' if self.box_heavy[k] else 'box'} {k + 1}" for k, cells in enumerate(self.boxes)
                if not self.delivered[k] for c in cells}


# ----------------------------------------------------------------------------- forage
class Forage(Game):
    """Level-based foraging (Albrecht & Ramamoorthy 2013), following lb-foraging 2.0.0's `step` and `spawn_food`.

    Map: '.' floor, '#' wall, 'f' food, digits agents. Options: `agent_levels`, `food_levels` (one per 'f', in reading
    order), `random_food` (spawn as lb-foraging does: off the border, at Manhattan distance > 2 from every other
    food), `random_starts`, `max_steps`. Actions: none, north, south, west, east, load.
    Rules, in lb-foraging's phases: (1) validate: a move is valid if its target is inside the grid, not a wall and
    holds no food (agents do not make it invalid); an invalid move stays. (2) collisions: every agent claims the cell
    it moves into (or its own); agents claiming one cell all stay, so following and swapping are allowed. (3) loads,
    in agent order: a loader takes the first food adjacent to it, looking north, south, west, east (one food, as
    lb-foraging's `adjacent_food_location`); every loader adjacent to that food joins the attempt and is done for
    this step; the food is collected if their levels sum to at least its level.
    Reward (team): a collected food is worth its level / the sum of all food levels (all food: 1.0). Terminated when
    all food is collected; truncated at max_steps (lb-foraging's 50). Events: ('food_loaded', loaders, food), plus
    ('joint_load', loaders, food) when two or more loaded it.
    Departures from lb-foraging: one team reward, not per-agent rewards; terminated vs truncated told apart; fixed
    levels per layout (lb-foraging draws them); walls ('#') for custom maps; loads resolve in agent order
    (lb-foraging pops a set: it matters only for food closer than its spawn spacing allows); with 3+ agents no two
    agents ever share a cell (Game.resolve_moves); with random_food and random_starts the food is placed first and
    the agents on free cells (lb-foraging places the agents first, the food on free cells), so an agent starts on
    the border a little more often (8x8 with 2 food: 28 of 62 free cells, 45% of resets, against 28 of 64, 44%).
    """

    name = "forage"
    movement = "lb-foraging"
    rules = "Collect all food. Agents next to a food that load together collect it if their levels sum to its level."
    legend = {".": "floor", "#": "wall", "f": "food", **{str(k): f"agent {k}" for k in range(1, 10)}}
    keys = {"max_steps": "an integer in [1, 10000]", "random_starts": "yes or no", "random_food": "yes or no",
            "agent_levels": "one integer in [1, 1000] per agent", "food_levels": "one integer in [1, 1000] per 'f'"}
    layouts = {
        # lb-foraging 8x8, 2 agents, 2 food; the level-3 food needs both agents
        "8x8_2p_2f": "........\n..f.....\n........\n........\n.....f..\n........\n.1......\n......2.\n"
                     "agent_levels: 1 2\nfood_levels: 2 3\nrandom_food: yes\nrandom_starts: yes\nmax_steps: 50\n",
        # one agent (level 2) can collect every food alone
        "8x8_solo": "........\n..f.....\n........\n......f.\n........\n...f....\n.1......\n......2.\n"
                    "agent_levels: 2 1\nfood_levels: 1 2 2\nrandom_food: yes\nrandom_starts: yes\nmax_steps: 50\n",
        # every food is above each agent's level (lb-foraging's -coop): only joint loads collect anything
        "8x8_coop": "........\n..f.....\n........\n........\n.....f..\n........\n.1......\n......2.\n"
                    "agent_levels: 1 1\nfood_levels: 2 2\nrandom_food: yes\nrandom_starts: yes\nmax_steps: 50\n",
    }
    default_layout = "8x8_2p_2f"
    solo_layouts = ("8x8_solo",)
    default_max_steps = 50
    max_reward = 1.0  # every food collected

    def task_cells(self) -> set[int]:
        """The food, or with random_food every cell food may spawn on."""
        return set(self.spawn_cells if self.random_food else self.food_starts)

    def unsolvable(self) -> str | None:
        """Every food (with random_food: every cell food may spawn on) must be next to cells that agents whose
        levels sum to the food's level can walk to."""
        for k, cell in enumerate(sorted(self.task_cells())):
            level = sum(self.agent_levels[i] for i in self.reachers(cell))
            food_level = max(self.food_levels) if self.random_food else self.food_levels[k]
            if level < food_level:
                return (f"{'food may spawn' if self.random_food else 'the food is'} at {self.where(cell)} with level "
                        f"{food_level}, but the agents that can reach it sum to level {level}")
        return None

    def setup(self) -> None:
        self.wall = [ch == "#" for ch in self.cells]
        self.food_starts = [c for c, ch in enumerate(self.cells) if ch == "f"]
        if not self.food_starts:
            raise self.layout_error(0, "at least one food 'f'")
        self.agent_levels = option_ints(self.options, "agent_levels", self.n_agents, 1, self.layout_name)
        self.food_levels = option_ints(self.options, "food_levels", len(self.food_starts), 1, self.layout_name)
        self.random_food = option_bool(self.options, "random_food", False, self.layout_name)
        # where lb-foraging's spawn_food may put food: off the border, no wall
        self.spawn_cells = [c for c in range(len(self.cells)) if not self.wall[c] and not self.on_edge(c)]

    def reset_objects(self, rng: np.random.Generator) -> None:
        self.food = list(self.food_starts)
        if self.random_food:
            self.food = []  # lb-foraging's spawn_food: off the border, at Manhattan distance > 2 from every other food
            for _ in self.food_starts:
                ok = [c for c in self.spawn_cells if all(self.manhattan(c, f) > 2 for f in self.food)]
                if not ok:
                    raise LayoutError(f"layout '{self.layout_name}': random_food: no room for {len(self.food_starts)}"
                                      " food at Manhattan distance > 2 from each other off the border; expected "
                                      "fewer 'f' or a larger map")
                self.food.append(ok[int(rng.integers(len(ok)))])
        self.collected = [False] * len(self.food)
        self.food_at = {c: k for k, c in enumerate(self.food)}

    def occupied_cells(self) -> set[int]:
        return set(self.food_at)

    def objects_key(self) -> tuple:
        return tuple(self.food)

    def step(self, actions: list[int]) -> tuple[float, bool, bool, list]:
        events: list = []
        # phases 1 and 2: validate moves (inside the grid, onto free cells), collisions and movement
        self.pos = self.resolve_moves(actions, lambda c: not self.wall[c] and c not in self.food_at)
        # phase 3: loads (loaders did not move), each on the first food next to a loader, with every loader beside it
        reward = 0.0
        waiting = [i for i, a in enumerate(actions) if a == 5]
        while waiting:
            k = next((self.food_at[n] for n in self.neighbours[self.pos[waiting[0]]] if n in self.food_at), None)
            if k is None:  # no food next to it: lb-foraging turns the load into a no-op
                waiting.pop(0)
                continue
            team = tuple(i for i in waiting if self.food[k] in self.neighbours[self.pos[i]])
            waiting = [i for i in waiting if i not in team]
            if sum(self.agent_levels[i] for i in team) >= self.food_levels[k]:
                self.collected[k] = True
                del self.food_at[self.food[k]]
                reward += self.food_levels[k] / sum(self.food_levels)
                events.append(("food_loaded", team, k))
                if len(team) > 1:
                    events.append(("joint_load", team, k))
        return self.finish_step(reward, all(self.collected), events)

    def view(self, agent: int) -> str:
        lines = [f"You: level {self.agent_levels[agent]}."]
        lines += [f"{self.partner_word(agent, j).capitalize()} (level {self.agent_levels[j]}): "
                  f"{self.relation(agent, self.pos[j])}." for j in self.others(agent)]
        for k, cell in enumerate(self.food):
            if self.collected[k]:
                lines.append(f"Food {k + 1} (level {self.food_levels[k]}): collected.")
                continue
            side = self.side_of(agent, cell)
            near = [f"you are directly {side} of it"] if side else []
            near += [f"{self.partner_word(agent, j)} is next to it" for j in self.others(agent)
                     if cell in self.neighbours[self.pos[j]]]
            lines.append(f"Food {k + 1} (level {self.food_levels[k]}): {self.relation(agent, cell)}"
                         + ("; " + "; ".join(near) if near else "") + ".")
        return "\n".join(lines)

    def render(self) -> str:
        chars = ["." if ch == "f" or ch.isdigit() else ch for ch in self.cells]
        for cell in self.food_at:  # the food not yet collected
            chars[cell] = "f"
        food = " ".join(f"f{k + 1}=L{lv}" for k, lv in enumerate(self.food_levels))
        agents = " ".join(f"{i + 1}=L{lv}" for i, lv in enumerate(self.agent_levels))
        return self.frame(chars, f"t={self.t} score={self.score:.2f} agents {agents} food {food}")

    def labels(self) -> dict[int, str]:
        return {c: f"food {k + 1}\nlevel {self.food_levels[k]}" for k, c in enumerate(self.food)
                if not self.collected[k]}


# ----------------------------------------------------------------------------- kitchen
class Kitchen(Game):
    """Overcooked-style onion soup (Carroll et al. 2019), after Overcooked-AI's layouts and step.

    Map: ' ' floor, 'X' counter, 'O' onion dispenser, 'D' dish dispenser, 'P' pot, 'S' serving window, digits
    agents. Options: `orders` (soups to serve), `cook_time`, `max_steps`, `random_starts`, and `random_contents`
    (each pot starts with 0-2 onions, and an onion or a dish may lie on a counter every agent can reach: more
    distinct start states, the same maximum reward).
    Actions: stay, north, south, west, east, interact. A move turns the agent that way and steps if the target is
    free floor (otherwise it only turns); interact acts on the faced cell. Movement (Overcooked-AI's): if two agents
    would end in one cell or swap cells, nobody moves; following is allowed.
    Rules: agents carry one item. Interact: at a dispenser with empty hands, take an onion or a dish; at a pot
    holding an onion, add it (the 3rd onion starts cooking by itself, done after cook_time steps); at a pot with a
    dish when the soup is done, take the soup; at the window with soup, serve it; at a counter, put the held item
    down or pick its item up; anything else does nothing. Agents interact in index order.
    Reward: 20 per served soup (as in Overcooked-AI), up to `orders` soups (a soup brought to a window once the last
    order is filled, even in the same step, stays in hand and earns nothing). Terminated when `orders` soups are
    served; truncated at max_steps. Events: ('onion_in_pot', (i,), pot), ('soup_plated', (i,), pot),
    ('soup_served', (i,), 0), ('counter_place', (i,), cell), ('counter_take', (i,), cell), and
    ('handoff', (placer, taker), cell) when an agent takes an item another agent put down.
    Shaped reward (`shaping`, for training only: train.py --shaping; never part of the reward or the score): 3 per
    onion put in a pot and 5 per soup plated (as in Overcooked-AI), and 3 per dish taken from a dispenser while
    fewer dishes are held or lie on counters than pots hold onions (this project's rule, below).
    Departures from Overcooked-AI 1.1.0, the only rules that differ (checked against the package step by step in
    results/kitchen-oai-differential/, and against a reading of its step in the suite: `-k oai_differential`):
    - The 3rd onion starts the pot: the rule of Carroll et al. 2019 (later Overcooked-AI's `old_dynamics=True`).
      In 1.1.0 an agent with empty hands starts a pot by interacting with it, at any onion count (a soup of 1 or 2
      onions is worth 0); here that interact does nothing. Kept because every kitchen result was trained on it.
    - cook_time is 5 steps by default (Overcooked-AI: 20): shorter episodes (100-150 steps) for the CPU budget.
    - The useful-dish shaping is not 1.1.0's `is_dish_pickup_useful`, which gives nothing while any dish lies on a
      counter and counts the pots as the step began (here: counter dishes count with held ones, pots as they are at
      the interact): 8% of dish pickups on random play are shaped differently.
    - `orders`: no soup scores past the last one (Overcooked-AI has no such count; its episodes end at a horizon).
    - In asymmetric_advantages and forced_coordination the agents are numbered the other way round from
      Overcooked-AI's layout files (same terrain): agent 1 is its player 2, the west cook (in forced_coordination:
      onions and dishes), agent 2 its player 1, the east cook (pots and window).
    """

    name = "kitchen"
    movement = "overcooked"
    rules = "Put 3 onions in a pot, let it cook, plate the soup with a dish, serve it. Counters pass items."
    legend = {" ": "floor", ".": "floor", "X": "counter", "O": "onion dispenser", "D": "dish dispenser",
              "P": "pot", "S": "serving window", **{str(k): f"agent {k}" for k in range(1, 10)}}
    keys = {"max_steps": "an integer in [1, 10000]", "random_starts": "yes or no", "orders": "an integer in [1, 10000]",
            "cook_time": "an integer in [1, 10000]", "random_contents": "yes or no"}
    SOUP = 20.0
    shaped = True
    ONION_IN_POT, USEFUL_DISH, SOUP_PLATED = 3.0, 3.0, 5.0  # Overcooked-AI's values (units of SOUP); dish rule: ours
    layouts = {
        # after Overcooked-AI's cramped_room: one agent can do everything alone
        "cramped_room": "XXPXX\nO  2O\nX1  X\nXDXSX\norders: 2\ncook_time: 5\nmax_steps: 100\nrandom_starts: yes\n"
                        "random_contents: yes\n",
        # after asymmetric_advantages: each side has its own dispensers and window, the pots are shared
        "asymmetric_advantages": "XXXXXXXXX\nO XSXOX S\nX   P 2 X\nX1  P   X\nXXXDXDXXX\n"
                                 "orders: 2\ncook_time: 5\nmax_steps: 100\nrandom_starts: yes\nrandom_contents: yes\n",
        # after forced_coordination: onions and dishes left, pots and window right: no single agent can serve a soup
        "forced_coordination": "XXXPX\nO X2P\nO1X X\nD X X\nXXXSX\norders: 2\ncook_time: 5\nmax_steps: 150\n"
                               "random_starts: yes\nrandom_contents: yes\n",
    }
    default_layout = "cramped_room"
    solo_layouts = ("cramped_room", "asymmetric_advantages")
    ITEMS = ("onion", "dish", "soup")

    def unsolvable(self) -> str | None:
        """Some pot must get onions from an onion dispenser and a dish from a dish dispenser, and its soup must
        get to a serving window: each carried by an agent that reaches both ends, or handed between agents over
        counters both reach."""
        passes = {i: {i} for i in range(self.n_agents)}  # passes[i]: agents an item held by i can end up with
        for c in self.counters:
            for i in self.reachers(c):
                passes[i] |= self.reachers(c)
        for _ in self.regions:  # transitive closure over counters
            passes = {i: set().union(*(passes[j] for j in js)) for i, js in passes.items()}

        def carried(sources: list[int], target: int) -> bool:
            return any(j in passes[i] for s in sources for i in self.reachers(s) for j in self.reachers(target))

        for kind, cells in self.stations.items():
            if not any(self.reachers(c) for c in cells):
                return f"every {self.legend[kind]} (e.g. at {self.where(cells[0])}) is out of every agent's reach"
        for pot in self.pots:
            if carried(self.onion_dispensers, pot) and carried(self.dish_dispensers, pot) and \
                    any(carried([pot], s) for s in self.windows):
                return None
        return ("no pot can get onions and a dish and send its soup to a serving window through the agents' "
                "reach and shared counters")

    def task_cells(self) -> set[int]:
        return set().union(*self.stations.values())

    def setup(self) -> None:
        self.floor = [ch in " .123456789" for ch in self.cells]
        self.counters = [c for c, ch in enumerate(self.cells) if ch == "X"]
        self.stations = {kind: [c for c, ch in enumerate(self.cells) if ch == kind] for kind in "ODPS"}
        self.onion_dispensers, self.dish_dispensers, self.pots, self.windows = self.stations.values()
        for kind in "PODS":
            if not self.stations[kind]:
                raise self.layout_error(0, f"at least one {self.legend[kind]} '{kind}'")
        for cell in range(len(self.cells)):
            if self.floor[cell] and self.on_edge(cell):
                raise self.layout_error(cell, "a counter or station (floor may not touch the edge of the map)")
        self.orders = option_int(self.options, "orders", 1, self.layout_name)
        self.cook_time = option_int(self.options, "cook_time", 5, self.layout_name)
        self.random_contents = option_bool(self.options, "random_contents", False, self.layout_name)

    @functools.cached_property
    def shared_counters(self) -> list[int]:
        """Counters next to a floor cell of every agent's start region (where random contents may lie)."""
        return [c for c in self.counters if len(self.reachers(c)) == self.n_agents]

    def reset_objects(self, rng: np.random.Generator) -> None:
        self.held: list[str | None] = [None] * self.n_agents
        self.facing = [1] * self.n_agents  # action index of the faced direction
        self.on_counter: dict[int, tuple[str, int]] = {}  # counter cell -> (item, who put it there; -1: nobody)
        self.pot_onions = [int(rng.integers(3)) if self.random_contents else 0 for _ in self.pots]
        self.pot_timer = [0] * len(self.pots)  # steps left while cooking
        self.served = 0
        if self.random_contents:
            for _ in range(min(int(rng.integers(2)), len(self.shared_counters))):
                free = [c for c in self.shared_counters if c not in self.on_counter]
                self.on_counter[free[int(rng.integers(len(free)))]] = (("onion", "dish")[int(rng.integers(2))], -1)

    def objects_key(self) -> tuple:
        return (tuple(self.held), tuple(self.facing), tuple(sorted(self.on_counter.items())),
                tuple(self.pot_onions), tuple(self.pot_timer), self.served)

    def walkable(self, cell: int) -> bool:
        return self.floor[cell]

    @property
    def max_reward(self) -> float:
        return self.SOUP * self.orders

    def pot_state(self, k: int) -> str:
        """'empty', '2 onions', 'cooking', 'ready'."""
        n = self.pot_onions[k]
        if n < 3:
            return "empty" if n == 0 else in_words(n, "onion")
        return "cooking" if self.pot_timer[k] > 0 else "ready"

    def step(self, actions: list[int]) -> tuple[float, bool, bool, list]:
        events: list = []
        reward = shaping = 0.0
        # phase 1: cooking advances
        self.pot_timer = [t - 1 if n == 3 and t > 0 else t for n, t in zip(self.pot_onions, self.pot_timer)]
        # phase 2: movement (a move always turns the agent)
        for i, a in enumerate(actions):
            if 1 <= a <= 4:
                self.facing[i] = a
        self.pos = self.resolve_moves(actions, lambda c: self.floor[c])
        # phase 3: interactions, in agent order
        for i, a in enumerate(actions):
            if a != 5:
                continue
            cell = self.pos[i] + self.delta[self.facing[i]]
            ch, held = self.cells[cell], self.held[i]
            if ch == "O" and held is None:
                self.held[i] = "onion"
            elif ch == "D" and held is None:
                dishes = sum(h == "dish" for h in self.held) + sum(it == "dish" for it, _ in self.on_counter.values())
                if dishes < sum(n > 0 for n in self.pot_onions):
                    shaping += self.USEFUL_DISH
                self.held[i] = "dish"
            elif ch == "P":
                k = self.pots.index(cell)
                if held == "onion" and self.pot_onions[k] < 3:
                    self.held[i] = None
                    self.pot_onions[k] += 1
                    if self.pot_onions[k] == 3:
                        self.pot_timer[k] = self.cook_time
                    shaping += self.ONION_IN_POT
                    events.append(("onion_in_pot", (i,), k))
                elif held == "dish" and self.pot_onions[k] == 3 and self.pot_timer[k] == 0:
                    self.held[i] = "soup"
                    self.pot_onions[k] = 0
                    shaping += self.SOUP_PLATED
                    events.append(("soup_plated", (i,), k))
            elif ch == "S" and held == "soup" and self.served < self.orders:  # no soup past the last order
                self.held[i] = None
                self.served += 1
                reward += self.SOUP
                events.append(("soup_served", (i,), 0))
            elif ch == "X":
                if held is not None and cell not in self.on_counter:
                    self.on_counter[cell] = (held, i)
                    self.held[i] = None
                    events.append(("counter_place", (i,), cell))
                elif held is None and cell in self.on_counter:
                    self.held[i], placer = self.on_counter.pop(cell)
                    events.append(("counter_take", (i,), cell))
                    if placer not in (i, -1):
                        events.append(("handoff", (placer, i), cell))
        self.shaping = shaping
        return self.finish_step(reward, self.served >= self.orders, events)

    def view(self, agent: int) -> str:
        hold = [f"holding {item}" if item else "empty-handed" for item in self.held]
        lines = [f"You: {hold[agent]}. Served {self.served}/{self.orders}."]
        lines += [f"{self.partner_word(agent, j).capitalize()}: {self.relation(agent, self.pos[j])}, {hold[j]}."
                  for j in self.others(agent)]
        # the nearest station of each kind, on one line to keep the prompt short
        stations = (("Onions", self.onion_dispensers), ("dishes", self.dish_dispensers), ("window", self.windows))
        lines.append(", ".join(f"{label} {self.relation(agent, self.nearest(agent, cells))}"
                               for label, cells in stations) + ".")
        for k, c in enumerate(self.pots):
            state = self.pot_state(k)
            if state == "cooking":
                state = f"cooking, {in_words(self.pot_timer[k], 'step')} left"
            lines.append(f"Pot {k + 1}: {state}, {self.relation(agent, c)}.")
        # items on counters, the nearest of each kind, on one line: a crowded counter row would dominate the prompt
        found = []
        for item in sorted({item for item, _ in self.on_counter.values()}):
            cells = [c for c, (it, _) in self.on_counter.items() if it == item]
            more = f" (+{len(cells) - 1})" if len(cells) > 1 else ""
            plural = item + ("es" if item.endswith("sh") else "s")
            found.append(f"{plural} {self.relation(agent, self.nearest(agent, cells))}{more}")
        if found:
            lines.append("On counters: " + "; ".join(found) + ".")
        return "\n".join(lines)

    def render(self) -> str:
        chars = [" " if ch.isdigit() or ch == "." else ch for ch in self.cells]
        for c, (item, _) in self.on_counter.items():
            chars[c] = item[0]
        for k, c in enumerate(self.pots):  # filling, ready, cooking
            chars[c] = "P" if self.pot_onions[k] < 3 else ("R" if self.pot_timer[k] == 0 else "C")
        held = " ".join(f"{i + 1}:{h or '-'}" for i, h in enumerate(self.held))
        pots = " ".join(f"pot{k + 1}:{self.pot_state(k)}" for k in range(len(self.pots)))
        return self.frame(chars, f"t={self.t} served={self.served}/{self.orders} score={self.score:.2f} "
                                 f"held {held} {pots}")

    def labels(self) -> dict[int, str]:
        return {c: f"pot {k + 1}\n{self.pot_state(k).replace(' onion', '/3')}" for k, c in enumerate(self.pots)}


GAMES: dict[str, type[Game]] = {"coop_push": CoopPush, "forage": Forage, "kitchen": Kitchen}


# ----------------------------------------------------------------------------- PLUMBING: checked games and the CLI
CHECKED_LAYOUTS: set[tuple] = set()  # layouts make_game has checked (once per layout and process)


def make_game(name: str, layout: str | None = None, seed: int = 0) -> Game:
    """Build a game by name (an unknown name raises InputError listing the accepted ones) on a layout its rules are
    defined for: its number of agents (the classes alone accept any), every reward reachable (Game.unsolvable), so
    no run is scored against reward it can never earn, and every agent able to act (Game.stranded)."""
    if name not in GAMES:
        raise plumbing.InputError(f"unknown game '{name}'; expected one of {', '.join(GAMES)}")
    game = GAMES[name](layout, seed)
    key = (game.name, game.rows, tuple(sorted(game.options.items())))
    if key in CHECKED_LAYOUTS:
        return game
    if game.n_agents != game.players:
        raise LayoutError(f"layout '{game.layout_name}': {in_words(game.n_agents, 'agent')}; {game.name} is "
                          f"defined for {game.players}; expected the digits 1 to {game.players}, each once")
    if reason := game.unsolvable():
        raise LayoutError(f"layout '{game.layout_name}': cannot be solved: {reason}")
    if reason := game.stranded():
        raise LayoutError(f"layout '{game.layout_name}': {reason} (walled in, away from every task cell); expected "
                          "every agent to reach part of the task")
    CHECKED_LAYOUTS.add(key)
    return game


def main(argv: list[str] | None = None) -> None:
    parser = plumbing.ArgumentParser(description="Check a layout and show one of its start states, or count its start "
                                     "states per split (train / validation / test).")
    parser.add_argument("--game", default="coop_push", choices=list(GAMES))
    parser.add_argument("--layout", default=None, help="a built-in layout name or a layout file")
    parser.add_argument("--seed", type=plumbing.number(0, integer=True), default=0,
                        help="the start state reset(seed) places")
    parser.add_argument("--start-states", type=plumbing.number(0, 10_000_000, integer=True), default=0, metavar="N",
                        help="count the distinct start states of seeds 0..N-1 per split instead")
    cli = parser.parse_args(argv)
    game = make_game(cli.game, cli.layout, cli.seed)
    if cli.start_states:
        keys = set()
        for seed in range(cli.start_states):
            game.reset(seed)
            keys.add(game.start_key())
        counts = ", ".join(f"{split} {sum(split_of(k) == split for k in keys)}" for split in SPLITS)
        print(f"{cli.game}/{game.layout_name}: {len(keys)} distinct start states over seeds "
              f"0..{cli.start_states - 1} ({counts})")
        return
    print(f"{cli.game}/{game.layout_name}: {game.n_agents} agents, solvable, max reward {game.max_reward:g}, "
          f"{game.max_steps} steps; start state of seed {cli.seed} ({split_of(game.start_key())} split):")
    print(game.render())


if __name__ == "__main__":
    plumbing.run_cli(main)
