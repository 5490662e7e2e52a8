"""`topas-bench history append | check | plot`: the nightly's JSON series per workload and
scheduler, the check of TOPAS's margin against the previous night, trend plots."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from topas_bench.cli_common import check_out_dir, err, handles_errors, out
from topas_bench.errors import TopasError

history_app = typer.Typer(
    no_args_is_help=True,
    help="The nightly's history: a JSON series per workload and scheduler, trend plots.",
)


@history_app.command("append")
@handles_errors
def history_append(
    results: Annotated[
        Path, typer.Argument(help="A results tree (e.g. the nightly's runs).", readable=False)
    ],
    history: Annotated[Path, typer.Option("--history", help="History directory.", readable=False)],
    date: Annotated[
        str | None, typer.Option(help="Date of the point (default: today, UTC).")
    ] = None,
    revision: Annotated[str, typer.Option(help="Code revision of the results.")] = "unknown",
) -> None:
    """Add a results tree's report rows to the series in HISTORY (one JSON file per workload
    and scheduler: mean/p99 JCT, goodput, TOPAS's reductions, each with its interval).

    Example: topas-bench history append runs/nightly --history history --revision $GITHUB_SHA
    """
    from topas_bench.analysis.collect import collect
    from topas_bench.analysis.history import append
    from topas_bench.analysis.report import build_report

    day = date or datetime.datetime.now(datetime.UTC).date().isoformat()
    coll = collect(results)
    if coll.problems:  # a point of the series is every run, or none
        n = len(coll.problems)
        raise TopasError(f"{results}: {n} bad run{'s' * (n != 1)} (first: {coll.problems[0]})")
    rep = build_report(coll)
    files = append(rep, check_out_dir(history, "--history"), day, revision)
    out.print(f"appended {day} ({revision}) to {len(files)} series in {history}", markup=False)


@history_app.command("check")
@handles_errors
def history_check(
    history: Annotated[Path, typer.Argument(help="History directory.", readable=False)],
) -> None:
    """Exit 1 when TOPAS's margin over the best baseline fell from the previous point by more
    than the seed-to-seed noise the two points measured (95% half-widths in quadrature).

    Example: topas-bench history check history
    """
    from topas_bench.analysis.history import check, load

    drops = check(load(history))
    for d in drops:
        out.print(f"DROPPED {d.describe()}", markup=False)
    out.print(f"{len(drops)} TOPAS margin(s) fell beyond the noise since the previous point")
    if drops:
        raise typer.Exit(1)


@history_app.command("plot")
@handles_errors
def history_plot(
    history: Annotated[Path, typer.Argument(help="History directory.", readable=False)],
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="Where the trend plots go.", readable=False)
    ],
) -> None:
    """Draw each workload's trend: TOPAS's margins with intervals, every scheduler's mean JCT.

    Example: topas-bench history plot history --out history/trend
    """
    from topas_bench.analysis.history import load, plot

    files = plot(load(history), check_out_dir(out_dir))
    err.print(f"wrote {len(files)} files to {out_dir}", markup=False)
