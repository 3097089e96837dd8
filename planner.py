"""Grid search for the option executor: BFS shortest paths with deterministic tie-breaking.

Cells are flat integers `r * width + c` (as in envs.py), expanded in the fixed order north, south, west,
east, so the same state always yields the same path. Options (options.py) call `step_toward` every primitive
step to move an agent toward a target cell or next to a target object, optionally around the partner.

Test: `pytest test_all.py -k planner` (paths are checked against a brute-force search).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

# action indices as in envs.ACTIONS: 1 north, 2 south, 3 west, 4 east
MOVES = (1, 2, 3, 4)


def neighbours(cell: int, width: int, height: int) -> list[tuple[int, int]]:
    """(action, neighbour cell) pairs inside the grid, in the fixed order north, south, west, east."""
    r, c = divmod(cell, width)
    out = []
    if r > 0:
        out.append((1, cell - width))
    if r < height - 1:
        out.append((2, cell + width))
    if c > 0:
        out.append((3, cell - 1))
    if c < width - 1:
        out.append((4, cell + 1))
    return out


def distances(start: int, passable: Callable[[int], bool], width: int, height: int) -> dict[int, int]:
    """BFS step distance from `start` to every cell reachable through passable cells (start included)."""
    dist = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for _, n in neighbours(cell, width, height):
            if n not in dist and passable(n):
                dist[n] = dist[cell] + 1
                queue.append(n)
    return dist


def shortest_path(start: int, targets: Iterable[int], passable: Callable[[int], bool], width: int,
                  height: int) -> list[int] | None:
    """Cells of a shortest path from `start` to the nearest target (start excluded); None if unreachable.
    Ties follow the expansion order; a target other than `start` must itself be passable."""
    goal = set(targets)
    if start in goal:
        return []
    parent = {start: -1}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for _, n in neighbours(cell, width, height):
            if n in parent or not passable(n):
                continue
            parent[n] = cell
            if n in goal:
                path = [n]
                while parent[path[-1]] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            queue.append(n)
    return None


def step_toward(start: int, targets: Iterable[int], passable: Callable[[int], bool], width: int,
                height: int, avoid: Iterable[int] = ()) -> int | None:
    """The first action of a shortest path to the nearest target: 0 (stay) when already on one, None when none
    is reachable. `avoid` cells (e.g. the partner's position) are obstacles."""
    blocked = set(avoid)
    path = shortest_path(start, targets, lambda c: c not in blocked and passable(c), width, height)
    if path is None:
        return None
    if not path:
        return 0
    first = path[0]
    return next(a for a, n in neighbours(start, width, height) if n == first)


def adjacent_cells(cell: int, width: int, height: int) -> list[int]:
    """The 4-neighbourhood of a cell inside the grid."""
    return [n for _, n in neighbours(cell, width, height)]
