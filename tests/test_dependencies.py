"""Every package the code imports is declared in pyproject.toml, where it is used.

Read statically (so it holds whatever this venv happens to contain; `make test` installs every
extra, and Ray once pulled in the `click` that the CLI imports but nobody declared):
- every module-level import of a third-party package is declared in the base dependencies or
  in an extra;
- the console entry point's module-level import closure (`topas_bench.cli` and every package
  module it imports at module level) needs only base dependencies: `make run` installs nothing
  else.
`.ci/run` checks the same from a real base-only venv (`scripts/check_imports.py --base`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "topas_bench"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {_norm(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in reqs}

    extras: set[str] = set()
    for reqs in project.get("optional-dependencies", {}).values():
        extras |= names(reqs)
    return names(project["dependencies"]), extras


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _module_level_imports(name: str, path: Path) -> set[str]:
    """Absolute names imported when the module runs: its top-level statements, and `if` bodies
    other than `if TYPE_CHECKING:` (`try` bodies are optional imports by construction)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                    found.add(mod)
                    found.update(f"{mod}.{a.name}" for a in node.names)
                elif node.module:
                    found.add(node.module)
                    found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)

    visit(ast.parse(path.read_text()).body)
    return found


def _third_party(names: set[str]) -> set[str]:
    tops = {n.split(".")[0] for n in names}
    return {t for t in tops if t not in sys.stdlib_module_names and t not in ("topas_bench",)}


@cache
def _distributions() -> dict[str, list[str]]:
    return dict(packages_distributions())


def _dist(top: str) -> set[str]:
    return {_norm(d) for d in _distributions().get(top, [])} or {_norm(top)}


def test_every_imported_package_is_declared() -> None:
    base, extras = _declared()
    missing = {
        f"{name}: {top}"
        for name, path in _modules().items()
        for top in _third_party(_module_level_imports(name, path))
        if not _dist(top) & (base | extras)
    }
    assert not missing, f"imported but declared in no dependency list: {sorted(missing)}"


def test_the_console_entry_point_needs_only_base_dependencies() -> None:
    base, _ = _declared()
    known = _modules()
    seen: set[str] = set()
    todo = ["topas_bench.cli"]
    needs: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in seen or name not in known:
            continue
        seen.add(name)
        found = _module_level_imports(name, known[name])
        todo += [n for n in found if n in known]
        todo += [n.rsplit(".", 1)[0] for n in found if n.rsplit(".", 1)[0] in known]
        for top in _third_party(found):
            needs.setdefault(top, name)
    assert len(seen) > 10, seen  # the walk really followed the package
    outside = {top: by for top, by in needs.items() if not _dist(top) & base}
    assert not outside, f"the CLI imports packages outside the base install: {outside}"


def test_the_check_sees_an_undeclared_import(tmp_path: Path) -> None:
    """The walk recognises a module-level third-party import (guards the test itself)."""
    f = tmp_path / "m.py"
    f.write_text(
        "import click\nif TYPE_CHECKING:\n    import yaml\n"
        "try:\n    import ray\nexcept ImportError:\n    pass\n"
    )
    assert _third_party(_module_level_imports("topas_bench.m", f)) == {"click"}


def test_every_module_imports_with_the_extras_blocked() -> None:
    """The run-time twin of the static walk: in this full venv, every package only an extra
    declares is made unimportable, then every module is imported (scripts/check_imports.py
    --block-extras). Catches a base dependency that needs an extra at import, which no static
    walk sees (pandas' Styler imported at module level needs Jinja2)."""
    script = ROOT / "scripts" / "check_imports.py"
    done = subprocess.run(
        [sys.executable, str(script), "--block-extras"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "0 problems" in done.stdout
