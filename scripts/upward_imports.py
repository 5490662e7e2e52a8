"""Upward import arrows in src/topas_bench: a module importing one on a higher floor.

The floors follow docs/design.md section 1 and "The seams", bottom to top (a module's floor is
its first match in `FLOORS`, by dotted-name prefix); arrows within a floor are not counted.
Issue 22's narrower count (runners/, schedulers/, workloads/ importing analysis/, invariants,
unloaded, the experiment or CLI layer) is a subset of these. Every `import` counts, also inside
functions; `if TYPE_CHECKING:` blocks do not (they run no code).

    python scripts/upward_imports.py [src]   # one arrow a line, then the count
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: what runs and stores cells (issue 22's "experiment layer", with invariants and unloaded)
RUN = ("cell", "invariants", "unloaded", "horizon", "sizing", "units", "tuned", "recorder")
EXPERIMENT = ("harness", "experiment", "fidelity")
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("topas_bench", "errors", "registry", "progress")),
    ("workloads", ("workloads",)),
    ("schedulers", ("schedulers",)),
    # the engines, and the types below them that name the engines' configuration modules
    ("engines", ("runners", "spec", "plan", "results")),
    ("run", RUN + EXPERIMENT),
    ("analysis", ("analysis",)),
    ("sweep", ("sweep", "tune")),
    ("cli", ("cli",)),
)


def floor(module: str) -> int:
    """`module`'s floor (an index into `FLOORS`): its longest matching prefix's."""
    parts = module.split(".")[1:]
    if not parts:
        return 0
    head = parts[0]
    for i, (_, prefixes) in enumerate(FLOORS):
        if head in prefixes or (head.startswith("cli") and "cli" in prefixes):
            return i
    raise SystemExit(f"{module}: no floor; add it to FLOORS")


def imports(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            skip.update(id(x) for b in n.body for x in ast.walk(b))
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            found.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                found.add(".".join([*base[: len(base) - n.level + 1], n.module or ""]))
            elif n.module:
                found.add(n.module)
    return {m.rstrip(".") for m in found if m.split(".")[0] == "topas_bench"}


def main(src: Path) -> int:
    arrows = []
    for path in sorted((src / "topas_bench").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for target in sorted(imports(path, name)):
            if floor(target) > floor(name):
                up = f"{FLOORS[floor(name)][0]} -> {FLOORS[floor(target)][0]}"
                arrows.append(f"{name} -> {target} ({up})")
    print("\n".join(arrows))
    print(f"{len(arrows)} upward arrows")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "src")))
