"""`topas-bench site`: a static site of a RESULTS directory, to browse before reading.

No server and no network: every page, image and style sheet is a local file, linked
relatively, so the directory opens from disk, as a CI artifact or on GitHub Pages. Pages:

- `index.html`: the headline (the first source's TOPAS against the best of all schedulers
  per workload and metric, with intervals, seeds, engine, settings, code revision) and its
  figure, then every other source's summary;
- `workload-<name>.html`: per source, every setting's JCT table of every scheduler, calls and
  stage latencies, then the figures (relative JCT, CDF, load curve, stage latency, the
  mechanism timeline) and, when the results hold a load x KV-budget grid, the regime map;
- `ablations.html`, `fidelity.html` (when RESULTS has `fidelity/fidelity.json` or
  `bench/reference.json`), `history.html` (with `--history`).

Every page names the command that regenerates it; every figure says its setting. Pages are
Jinja2 templates (`templates/`), tables are pandas' HTML; Jinja2 is imported only here (the
`figures` extra).
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
        raise TopasError("the site needs Jinja2: pip install 'topas-bench[figures]'") from None
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
    from topas_bench.analysis.plotting import pyplot
    from topas_bench.analysis.site.draw import draw_source
    from topas_bench.analysis.site.pages import Pages

    env = _environment()
    sources = discover(results, runs or {}, opts or Options())
    hist = _history(history)
    prepare(out)
    plt = pyplot()
    drawn: dict[str, Any] = {}
    files = 0
    for src in sources:
        drawn[src.name], written = draw_source(plt, out, src)
        files += len(written)
    pages = Pages(sources, drawn, command, _fidelity(results), hist, out, plt)
    written_pages = pages.write(env)
    style = resources.files("topas_bench.analysis.site").joinpath("templates/style.css")
    (out / "style.css").write_text(style.read_text())
    return SiteResult(out, written_pages, files + len(pages.extra_files) + len(written_pages) + 1,
                      [s.name for s in sources])  # fmt: skip


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
