"""Graph checks of a task's stages, linear in the task's size (issue 13: a 100,000-stage task
validates in seconds): dependency cycles, and whether one stage is an ancestor of another."""

from __future__ import annotations


def cycles(deps: dict[str, list[str]]) -> list[list[str]]:
    """Dependency cycles (each as ``[a, b, ...]``: a needs b needs ... needs a), deterministic.
    Linear in the graph: stages that need nothing left are peeled off (Kahn) as they free up;
    every stage left needs another one left, so following needs from one finds a cycle."""
    left = {n: sum(d in deps for d in ds) for n, ds in deps.items()}  # needs still left
    needed_by: dict[str, list[str]] = {n: [] for n in deps}
    for n, ds in deps.items():
        for d in ds:
            if d in needed_by:
                needed_by[d].append(n)

    def peel(todo: list[str]) -> None:
        while todo:
            n = todo.pop()
            del left[n]
            for m in needed_by[n]:
                if m in left:
                    left[m] -= 1
                    if left[m] == 0:
                        todo.append(m)

    peel([n for n, k in left.items() if k == 0])
    cycles: list[list[str]] = []
    while left:
        path: list[str] = []
        on_path: set[str] = set()
        n = next(iter(left))
        while n not in on_path:
            path.append(n)
            on_path.add(n)
            n = next(d for d in deps[n] if d in left)
        cycles.append(path[path.index(n) :])
        freed = []
        for c in cycles[-1]:
            left[c] = 0
        for c in cycles[-1]:
            for m in needed_by[c]:
                if m in left and left[m] > 0:
                    left[m] -= 1
                    if left[m] == 0:
                        freed.append(m)
        for c in cycles[-1]:
            del left[c]
            needed_by[c] = []
        peel(freed)
    return cycles


def is_ancestor(
    target: str, sid: str, deps: dict[str, list[str]], order: dict[str, int] | None
) -> bool:
    """Whether `sid` (transitively) needs `target`: a search up from `sid` that stops when it
    finds it and, given a topological `order`, never climbs above `target`'s position (a
    stage's ancestors all come before it). The common case, a direct dependency, is O(1)."""
    if target in deps[sid]:
        return True
    floor = order[target] if order is not None else -1
    if order is not None and order[sid] <= floor:
        return False
    seen = {sid}
    todo = [sid]
    while todo:
        for d in deps[todo.pop()]:
            if d == target:
                return True
            if d not in seen and (order is None or order[d] > floor):
                seen.add(d)
                todo.append(d)
    return False
