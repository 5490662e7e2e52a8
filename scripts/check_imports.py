"""Import every module of topas_bench in the running interpreter, and fail on a missing package
that the base install should have brought.

    python scripts/check_imports.py [--base]

A module may fail to import only for a package that an optional extra of pyproject.toml
declares (matplotlib for `figures`, sglang for `sglang`, ...): that module belongs to the extra.
Any other failure (an undeclared package such as the `click` that typer 0.29 stopped pulling
in, a package declared in no extra, or any other error) is reported and the exit code is 1.
With `--base` the interpreter is expected to hold the base install only (`.ci/run` builds such
a venv), and the console entry point `topas_bench.cli` must import.

    python scripts/check_imports.py --block-extras

simulates a base install inside a full one (the tests run it): every package that only an extra
declares is made unimportable first, so a base dependency that needs an extra's package at
import (pandas' Styler needs Jinja2) shows up too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "topas_bench"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(base distributions, extra -> distributions), normalised names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {_norm(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in reqs}

    extras = {k: names(v) for k, v in project.get("optional-dependencies", {}).items()}
    return names(project.get("dependencies", [])), extras


def modules() -> list[str]:
    out = []
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] != "__main__":
            out.append(".".join(parts))
    return out


class _Blocked(importlib.abc.MetaPathFinder):
    """Makes the given top-level packages unimportable, as in an install without them."""

    def __init__(self, tops: set[str]) -> None:
        self.tops = tops

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.split(".")[0] in self.tops:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


def extra_only_modules(base: set[str], extras: dict[str, set[str]]) -> set[str]:
    """Top-level import names of installed packages that only extras declare."""
    only = set().union(*extras.values()) - base
    return {top for top, ds in packages_distributions().items() if {_norm(d) for d in ds} & only}


def main(argv: list[str]) -> int:
    base_only = "--base" in argv or "--block-extras" in argv
    base, extras = declared()
    dists = packages_distributions()
    if "--block-extras" in argv:
        blocked = extra_only_modules(base, extras)
        for mod in [m for m in sys.modules if m.split(".")[0] in blocked]:
            del sys.modules[mod]
        sys.meta_path.insert(0, _Blocked(blocked))
    optional: dict[str, int] = {}
    problems: list[str] = []
    for name in modules():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if top == "topas_bench" or not top:
                problems.append(f"{name}: {exc}")
                continue
            dist = {_norm(d) for d in dists.get(top, [])} or {_norm(top)}
            owners = sorted(k for k, v in extras.items() if v & dist)
            if dist & base:
                problems.append(f"{name}: needs {top}, a base dependency that is not installed")
            elif not owners:
                problems.append(f"{name}: imports {top}, which pyproject.toml declares nowhere")
            else:
                optional[top] = optional.get(top, 0) + 1
        except Exception as exc:  # an import that breaks for another reason is a bug
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    if base_only and "topas_bench.cli" not in sys.modules:
        problems.append("topas_bench.cli (the console entry point) did not import")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    skipped = ", ".join(f"{k} ({n})" for k, n in sorted(optional.items())) or "none"
    print(
        f"{len(modules())} modules: {len(problems)} problems; "
        f"left to their extras (modules per missing package): {skipped}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
