"""Grid search for the option executor: BFS shortest paths with deterministic tie-breaking.

Cells are flat integers `r * width + c` (as in envs.py), expanded in the fixed order north, south, west,
east, so the same state always yields the same path. Options (options.py) call `step_toward` every primitive
step to move an agent toward a target cell or next to a target object, optionally around the partner.

Test: `pytest test_all.py -k planner` (paths are checked against a brute-force search).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator


def neighbours(cell: int, width: int, height: int) -> list[tuple[int, int]]:
    """(action, neighbour cell) pairs inside the grid, in the fixed order north (1), south (2), west (3), east (4)."""
    r, c = divmod(cell, width)
    moves = ((1, cell - width, r > 0), (2, cell + width, r < height - 1), (3, cell - 1, c > 0),
             (4, cell + 1, c < width - 1))
    return [(a, n) for a, n, inside in moves if inside]


def adjacent_cells(cell: int, width: int, height: int) -> list[int]:
    """The 4-neighbourhood of a cell inside the grid."""
    return [n for _, n in neighbours(cell, width, height)]


def search(start: int, passable: Callable[[int], bool], width: int, height: int) -> Iterator[tuple[int, int]]:
    """(cell, parent) for every cell reachable from `start` through passable cells, in BFS discovery order."""
    seen, queue = {start}, deque([start])
    while queue:
        cell = queue.popleft()
        for _, n in neighbours(cell, width, height):
            if n not in seen and passable(n):
                seen.add(n)
                queue.append(n)
                yield n, cell


def distances(start: int, passable: Callable[[int], bool], width: int, height: int) -> dict[int, int]:
    """BFS step distance from `start` to every cell reachable through passable cells (start included)."""
    dist = {start: 0}
    for cell, parent in search(start, passable, width, height):
        dist[cell] = dist[parent] + 1
    return dist


def shortest_path(start: int, targets: Iterable[int], passable: Callable[[int], bool], width: int,
                  height: int) -> list[int] | None:
    """Cells of a shortest path from `start` to the nearest target (start excluded); None if unreachable.
    Ties follow the expansion order; a target other than `start` must itself be passable."""
    goal = set(targets)
    if start in goal:
        return []
    parents = {}
    for cell, parent in search(start, passable, width, height):
        parents[cell] = parent
        if cell in goal:
            path = [cell]
            while parents[path[-1]] != start:
                path.append(parents[path[-1]])
            return path[::-1]
    return None


def step_toward(start: int, targets: Iterable[int], passable: Callable[[int], bool], width: int,
                height: int, avoid: Iterable[int] = ()) -> int | None:
    """The first action of a shortest path to the nearest target: 0 (stay) when already on one, None when none
    is reachable. `avoid` cells (e.g. the partner's position) are obstacles."""
    blocked = set(avoid)
    path = shortest_path(start, targets, lambda c: c not in blocked and passable(c), width, height)
    if path is None:
        return None
    return next(a for a, n in neighbours(start, width, height) if n == path[0]) if path else 0
