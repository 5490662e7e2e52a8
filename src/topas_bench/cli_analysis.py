"""`topas-bench report | figures | compare`: thin commands over `topas_bench.analysis`
(registered on the main app in `topas_bench.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from topas_bench.cli_common import check_out_dir, err, handles_errors, out
from topas_bench.cli_options import AllowMixed, SkipBad
from topas_bench.errors import TopasError


def _collect(results: Path, slo: str, skip_bad: bool, allow_mixed: bool) -> Any:
    """Collect a results tree. A bad run (unreadable, partial, corrupt) is an error naming it,
    after listing every one, unless `skip_bad`; so are runs of several code versions, unless
    `allow_mixed`."""
    from topas_bench.analysis.collect import check_revisions, collect, unverified_note
    from topas_bench.analysis.metrics import Slo

    coll = collect(results, Slo.parse(slo))
    if note := unverified_note(coll):
        err.print(f"note: {results}: {note}", markup=False)
    for p in coll.problems:
        err.print(f"{'left out' if skip_bad else 'bad run'}: {p}", markup=False)
    if coll.problems and not skip_bad:
        n = len(coll.problems)
        raise TopasError(
            f"{results}: {n} bad run{'s' * (n != 1)} (first: {coll.problems[0]}); "
            "`topas-bench sweep` with the same settings redoes them, or pass --skip-bad "
            "to leave them out"
        )
    if not allow_mixed:
        check_revisions(coll)
    return coll


def _load(
    results: Path, slo: str = "2x", skip_bad: bool = False, allow_mixed: bool = False,
    focus: str = "topas", tuned: Path | None = None,
) -> Any:  # fmt: skip
    from topas_bench.analysis.report import build_report
    from topas_bench.schedulers.registry import SCHEDULERS
    from topas_bench.tuned import load_tuned

    SCHEDULERS.get(focus)  # an unknown name: one line with the known ones
    coll = _collect(results, slo, skip_bad, allow_mixed)
    return coll, build_report(coll, focus, load_tuned(tuned) if tuned else None)


@handles_errors
def report(
    results: Annotated[
        Path, typer.Argument(help="A results directory tree (a sweep's --out).", readable=False)
    ],
    out_dir: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", metavar="<path>", help="Where report.md/.csv go (default: RESULTS)."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="Do not print the Markdown.")] = False,
    slo: Annotated[
        str, typer.Option(help="Goodput's SLO: Nx (N x each task's unloaded JCT) or Ns.")
    ] = "2x",
    skip_bad: SkipBad = False,
    allow_mixed_revisions: AllowMixed = False,
    focus: Annotated[
        str, typer.Option(help="The scheduler the verdicts judge against every other.")
    ] = "topas",
    tuned: Annotated[
        Path | None,
        typer.Option(
            "--tuned",
            help="The tuned file the runs were made with (`tune`'s tuned.toml): marks each "
            "scheduler's tuned form, which stands for it in the verdicts.",
        ),
    ] = None,
    site_data: Annotated[
        bool,
        typer.Option(
            help="Also write cdf.csv.gz and timeline.csv.gz (what the site draws without the runs)."
        ),
    ] = True,
) -> None:
    """Summarise a results tree: JCT (mean/p50/p90/p99 with 95% bootstrap intervals over
    seeds), reduction vs the best baseline, goodput under an SLO, request-level TTFT, TPOT,
    ITL, queueing and latency, per-stage latency, throughput, prefix hits, preemptions,
    decision overhead; as Markdown and CSV. Unreadable, partial or corrupt runs are listed and
    the report refuses to go on (exit 2) unless --skip-bad; so do runs of several code
    revisions unless --allow-mixed-revisions.

    The protocol's verdicts (docs/evaluation.md, "Protocol"): FOCUS against every other
    scheduler, against each of its ablations and each tuned scheduler against its defaults,
    per setting and metric, paired over seeds with a 95% bootstrap interval, win / loss only
    where it excludes 0 after Holm's correction over each table (verdicts.csv, levers.csv,
    tuning.csv; runs.csv.gz holds the per-run numbers they are computed from). cdf.csv.gz
    and timeline.csv.gz keep what the site's JCT distributions and timelines need, so that a
    report directory redraws them without its runs.

    Examples:
      topas-bench report runs/s1
      topas-bench report runs/s1 --slo 3x --out runs/s1/slo3
      topas-bench report runs/paper-regime --tuned runs/tune/tuned.toml --out results/pr
    """
    from topas_bench.analysis.compact import write_compact
    from topas_bench.analysis.render import to_markdown, write_report

    target = check_out_dir(out_dir if out_dir is not None else results)
    coll, rep = _load(results, slo, skip_bad, allow_mixed_revisions, focus, tuned)
    files = write_report(rep, target)
    if site_data:
        files += write_compact(coll, rep.rows, target)
    if not quiet:
        out.print(to_markdown(rep), markup=False, soft_wrap=True)  # piped: lines whole
    out.print(f"wrote {', '.join(str(f) for f in files)}", markup=False)


@handles_errors
def figures(
    results: Annotated[Path, typer.Argument(help="A results directory tree.", readable=False)],
    out_dir: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", metavar="<path>", help="Figure directory (default: RESULTS/figures)."
        ),
    ] = None,
    slo: Annotated[str, typer.Option(help="Goodput's SLO: Nx unloaded JCT, or Ns.")] = "2x",
    skip_bad: SkipBad = False,
    allow_mixed_revisions: AllowMixed = False,
    strict: Annotated[
        bool,
        typer.Option(
            help="Fail where a figure is unreadable at page width (text overlaps, "
            "clipped or under 8 pt, wider than 8 in)."
        ),
    ] = False,
) -> None:
    """Draw JCT CDFs, JCT relative to the best, JCT against load, a prefix-residency and KV
    timeline, and the levers' paired margins (PNG and SVG), each at most 8 in wide.

    Example: topas-bench figures results/reference --out runs/figures
    """
    from topas_bench.analysis.figures import write_figures

    target = check_out_dir(out_dir if out_dir is not None else results / "figures")
    coll, rep = _load(results, slo, skip_bad, allow_mixed_revisions)
    files = write_figures(coll, rep, target, strict=strict)
    out.print(f"wrote {len(files)} files to {target}", markup=False)


@handles_errors
def compare(
    new: Annotated[Path, typer.Argument(help="New results tree.", readable=False)],
    reference: Annotated[Path, typer.Argument(help="Reference results tree.", readable=False)],
    tolerance: Annotated[
        str,
        typer.Option(
            help="`noise`: a worsening beyond the seed-to-seed noise both trees measured (95% "
            "bootstrap half-widths, in quadrature); or a relative margin (0.05 = 5%)."
        ),
    ] = "noise",
    allow_missing: Annotated[
        bool,
        typer.Option(help="Compare the rows both trees have, even if NEW lacks some."),
    ] = False,
    slo: Annotated[str, typer.Option(help="Goodput's SLO: Nx unloaded JCT, or Ns.")] = "2x",
    skip_bad: SkipBad = False,
    allow_mixed_revisions: AllowMixed = False,
) -> None:
    """Compare NEW with REFERENCE per group and scheduler (mean and p99 JCT, goodput, p99 TTFT;
    TOPAS's reductions vs the best baseline) and print what moved.

    Each group is compared on the seeds both trees have.

    Exit codes: 0 = no regression; 1 = a regression beyond the tolerance; 2 = unusable input
    (an unreadable tree, nothing in common, or rows of REFERENCE missing from NEW without
    --allow-missing), each named.

    Examples:
      topas-bench compare runs/nightly results/reference
      topas-bench compare runs/s1 results/reference --tolerance 0.05 --allow-missing
    """
    from topas_bench.analysis.compare import Tolerance, on_common_seeds
    from topas_bench.analysis.compare import compare as compare_reports
    from topas_bench.analysis.report import build_report

    tol = Tolerance.parse(tolerance)
    colls = [_collect(tree, slo, skip_bad, allow_mixed_revisions) for tree in (new, reference)]
    new_coll, ref_coll, seed_notes = on_common_seeds(*colls)
    result = compare_reports(build_report(new_coll), build_report(ref_coll), tol)
    result.notes[:0] = seed_notes
    if result.missing and not allow_missing:
        for m in result.missing:
            err.print(f"missing: {m} (in {reference}, not in {new})", markup=False)
        raise TopasError(
            f"{new} lacks {len(result.missing)} of the reference's rows (listed above; first: "
            f"{result.missing[0]}): run the reference's settings (`sweep --config` with its "
            "file), or pass --allow-missing to compare the rows both have"
        )
    moved = sorted((c for c in result.changes if abs(c.relative) > 1e-9),
                   key=lambda c: (not c.regressed, -abs(c.relative)))  # fmt: skip
    for c in moved:
        out.print(("REGRESSED " if c.regressed else "moved     ") + c.describe(), markup=False)
    if result.missing:  # allowed: a count, not one line per row (--allow-missing's point)
        workloads = sorted({m.split(" ", 1)[0] for m in result.missing})
        out.print(
            f"missing   {len(result.missing)} rows of the reference not in {new} (workloads: "
            f"{', '.join(workloads)}); without --allow-missing they are listed one per line",
            markup=False,
        )
    for note in result.notes:
        out.print(f"note      {note}", markup=False)
    out.print(
        f"compared {result.compared} scheduler rows at tolerance {tol.describe()}: "
        f"{len(result.regressions)} regressed, {len(moved) - len(result.regressions)} moved "
        f"within tolerance, {len(result.missing)} missing"
    )
    if result.regressions:
        raise typer.Exit(1)
