"""`topas-bench site`: a static site of a results directory (`topas_bench.analysis.site`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from topas_bench.cli_common import check_out_dir, handles_errors, out, parse_assignments
from topas_bench.cli_options import AllowMixed, SkipBad
from topas_bench.errors import TopasError


@handles_errors
def site(
    results: Annotated[
        Path,
        typer.Argument(
            help="A run tree, or a directory of them and of report directories.", readable=False
        ),
    ],
    out_dir: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", metavar="<path>", help="Site directory (default: RESULTS/site)."
        ),
    ] = None,
    runs: Annotated[
        list[str] | None,
        typer.Option(
            "--runs", help="NAME=DIR: the run tree behind RESULTS/NAME's report (repeatable)."
        ),
    ] = None,
    history: Annotated[
        Path | None,
        typer.Option(
            help="The nightly history's series directory (`history append --history`).",
            readable=False,
        ),
    ] = None,
    slo: Annotated[str, typer.Option(help="Goodput's SLO for run trees: Nx or Ns.")] = "2x",
    skip_bad: SkipBad = False,
    allow_mixed_revisions: AllowMixed = False,
) -> None:
    """Write a static site of RESULTS: a leaderboard per workload (every scheduler ranked on
    mean JCT, p99 JCT or goodput, each against the leader with the protocol's paired verdict,
    the paper's reduction beside TOPAS's), one page per workload (JCT distribution, lever
    effects, the mechanism over one run, stage latency, the other sources' settings), one per
    source, levers, fidelity and the nightly history. Charts are drawn offline by the bundled
    plotly.js; tables sort and download as CSV. No server, no network: open OUT/index.html.

    RESULTS is one run tree (a sweep's --out) or a directory of sources: run trees and report
    directories (what `topas-bench report` writes, runs not needed), ordered and titled by
    RESULTS/site.toml.

    Examples:
      topas-bench site results --out results/site
      topas-bench site runs/nightly --history history/series --out site
      topas-bench site results --runs evaluation-paper=runs/eval-paper --out /tmp/site
    """
    from topas_bench.analysis.metrics import Slo
    from topas_bench.analysis.site import Options, build_site

    behind = {k: Path(str(v)) for k, v in parse_assignments(runs or [], "--runs").items()}
    for name, path in behind.items():
        if not path.is_dir():
            raise TopasError(f"--runs {name}={path}: not a directory")
    target = check_out_dir(out_dir if out_dir is not None else results / "site")
    words = ["topas-bench", "site", str(results), "--out", str(target)]
    words += [f"--runs={k}={v}" for k, v in behind.items()]
    words += [f"--history={history}"] if history else []
    words += [f"--slo={slo}"] if slo != "2x" else []
    words += ["--skip-bad"] * skip_bad + ["--allow-mixed-revisions"] * allow_mixed_revisions
    opts = Options(Slo.parse(slo), skip_bad, allow_mixed_revisions)
    result = build_site(results, target, shlex.join(words), runs=behind, history=history,
                        opts=opts)  # fmt: skip
    out.print(
        f"site of {', '.join(result.sources)}: {len(result.pages)} pages, {result.files} files "
        f"in {result.out}; open {result.out / 'index.html'}",
        markup=False,
    )
