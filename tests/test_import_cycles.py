"""No import cycles inside the package: every `import` counts, function-level and `if
TYPE_CHECKING:` ones included (a type-only cycle is still two modules that cannot be read
apart). Shared helpers and types live in modules both sides import."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "topas_bench"

# Cycles tolerated, each a strongly connected component (module names without the
# `topas_bench.` prefix). None: the test fails on a new cycle, and on a stale entry here.
ALLOWED: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    found = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = f
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of the package that `name` imports anywhere in its file."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets += [
                f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names
            ]
    deps = set()
    for t in targets:
        while t and t not in known:
            t = t.rpartition(".")[0]
        # a module importing its own package (`__init__`) is not a cycle worth reporting
        if t and t != name and not name.startswith(t + "."):
            deps.add(t)
    return deps


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def package_cycles() -> list[frozenset[str]]:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    prefix = "topas_bench."
    return [frozenset(m.removeprefix(prefix) for m in c) for c in cycles(graph)]


def test_no_import_cycles() -> None:
    found = package_cycles()
    new = [sorted(c) for c in found if c not in ALLOWED]
    assert not new, f"import cycles: {new}; move what both sides share into a module they import"


def test_allowed_cycles_still_exist() -> None:
    found = set(package_cycles())
    stale = [sorted(c) for c in ALLOWED if c not in found]
    assert not stale, f"these cycles are gone or changed; update ALLOWED: {stale}"


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
