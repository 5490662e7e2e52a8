"""`topas-bench site`: a static site of a RESULTS directory, to read before the tables.

No server and no network: every page, script, style sheet and data file is local and linked
relatively, so the directory opens from disk, as a CI artifact or on GitHub Pages. The
charts are drawn in the browser by plotly.js, copied at build time from the pinned `plotly`
package (the `figures` extra) with its license beside it (`vendor/`); the pages work as
tables without it. Pages (`pages`): the leaderboard (index), one page per workload, one per
source, every source listed, levers, fidelity and, with `--history`, the nightly history.

The site is a pure function of RESULTS: it reads the committed report directories (rows,
per-run table, verdicts, levers, compact CDF and timeline tables: `compact`) and run trees,
draws no matplotlib figure but the nightly history's, and writes the same bytes for the same
files, so `make figures` on a clean clone rebuilds the committed site exactly.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from topas_bench.analysis.site.sources import Options, Source, discover
from topas_bench.errors import TopasError

MARKER = ".topas-bench-site"


@dataclass(frozen=True)
class SiteResult:
    out: Path
    pages: list[str]
    files: int
    sources: list[str]


def _environment() -> Any:
    try:
        import jinja2
    except ImportError:
        raise TopasError(
            "the site needs Jinja2: make figures, or .venv/bin/pip install -e '.[figures]'"
        ) from None
    return jinja2.Environment(
        loader=jinja2.PackageLoader("topas_bench.analysis.site", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def prepare(out: Path) -> None:
    """An empty `out`: a previous site there is replaced; anything else there is an error
    (never delete a directory this command did not write)."""
    if out.exists() and not out.is_dir():
        raise TopasError(f"--out {out}: not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise TopasError(
                f"--out {out}: not empty and not a site written by `topas-bench site`; "
                "choose an empty or new directory"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `topas-bench site`; replaced on the next run\n")


def build_site(
    results: Path,
    out: Path,
    command: str,
    *,
    runs: dict[str, Path] | None = None,
    history: Path | None = None,
    opts: Options | None = None,
) -> SiteResult:
    """Write the site of `results` into `out`; `command` is the one that regenerates it (shown
    on every page)."""
    from topas_bench.analysis.site.pages import Pages

    env = _environment()
    vendor = plotly_js()
    sources = discover(results, runs or {}, opts or Options())
    hist = _history(history)
    prepare(out)
    pages = Pages(sources, command, _fidelity(results), hist, out)
    written_pages = pages.write(env)
    static = resources.files("topas_bench.analysis.site").joinpath("templates")
    for name in STATIC:
        (out / name).write_text(static.joinpath(name).read_text())
    (out / "vendor").mkdir()
    for src, name in vendor:
        shutil.copyfile(src, out / "vendor" / name)
    files = sum(1 for f in out.rglob("*") if f.is_file())
    return SiteResult(out, written_pages, files, [s.name for s in sources])


#: Files copied as they are from `templates/`.
STATIC = ("style.css", "site.js")
PLOTLY_JS = "plotly.min.js"


def plotly_js() -> list[tuple[Path, str]]:
    """plotly.js and its license from the installed `plotly` package (read as files, never
    imported): [(path, name in vendor/)]."""
    from importlib import metadata

    try:
        dist = metadata.distribution("plotly")
    except metadata.PackageNotFoundError:
        raise TopasError(
            "the site needs plotly.js: make figures, or .venv/bin/pip install -e '.[figures]'"
        ) from None
    js = Path(str(dist.locate_file("plotly/package_data/plotly.min.js")))
    lic = next((Path(str(dist.locate_file(f))) for f in dist.files or []
                if f.name.startswith("LICENSE")), None)  # fmt: skip
    if not js.is_file() or lic is None or not lic.is_file():
        raise TopasError(f"plotly {dist.version}: no plotly.min.js or license in the package")
    return [(js, PLOTLY_JS), (lic, "plotly-LICENSE.txt")]


def _history(directory: Path | None) -> Any:
    if directory is None:
        return None
    from topas_bench.analysis.history import check, load

    h = load(directory)
    return h, check(h)


def _fidelity(results: Path) -> dict[str, Any]:
    """What RESULTS holds about the simulator's fidelity: `fidelity/fidelity.json` (`topas-bench
    fidelity --out RESULTS/fidelity`) and `bench/reference.json` (benchmarks/bench_reference.py)."""
    found: dict[str, Any] = {}
    for key, path in (("fidelity", results / "fidelity" / "fidelity.json"),
                      ("bench", results / "bench" / "reference.json")):  # fmt: skip
        if path.is_file():
            try:
                found[key] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise TopasError(f"{path}: unreadable ({e})") from None
            found[f"{key}_path"] = str(path.relative_to(results.parent))
    return found


__all__ = ["Options", "SiteResult", "Source", "build_site"]
