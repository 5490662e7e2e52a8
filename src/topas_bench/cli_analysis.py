"""`topas-bench sweep | report | figures | compare`: thin commands over `topas_bench.sweep` and
`topas_bench.analysis` (registered on the main app by `register`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from topas_bench.cli_common import (
    check_out_dir,
    err,
    handles_errors,
    out,
    parse_assignments,
    parse_scheduler_params,
)
from topas_bench.errors import TopasError
from topas_bench.sweep import Progress as SweepProgress


def register(app: typer.Typer) -> None:
    app.command()(sweep)
    app.command()(report)
    app.command()(figures)
    app.command()(compare)


class _Bar(SweepProgress):
    """A rich progress bar with an ETA per phase (capacity measurement, cells)."""

    def __init__(self, progress: Progress) -> None:
        self._p = progress
        self._bars: dict[str, TaskID] = {}

    def phase(self, name: str, total: int) -> None:
        self._bars[name] = self._p.add_task(name, total=total, last="")

    def advance(self, name: str, label: str) -> None:
        self._p.update(self._bars[name], advance=1, last=label)

    def note(self, text: str) -> None:
        self._p.console.print(text, markup=False)


@handles_errors
def sweep(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Sweep file (TOML); flags override it.")
    ] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", "-w", help="Workloads, comma-separated.")
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            "-s",
            help="`paper`, `peers`, `all`, `baselines`, `sglang`, `ablations`, `everything`, "
            "or a,b,c (default: all).",
        ),
    ] = None,
    load: Annotated[
        str | None, typer.Option(help="Loads (x measured capacity), comma-separated.")
    ] = None,
    rate: Annotated[str | None, typer.Option(help="Rates (tasks/s), comma-separated.")] = None,
    seeds: Annotated[str | None, typer.Option(help="Seeds: 0,1,2 or 0-2 (default: 0).")] = None,
    preset: Annotated[
        str | None, typer.Option(help="Presets (names or .toml files), comma-separated.")
    ] = None,
    kv_budget: Annotated[
        str | None,
        typer.Option(
            "--kv-budget", help="KV budgets in tokens, comma-separated; `derived` = the preset's."
        ),
    ] = None,
    tasks: Annotated[int | None, typer.Option("--tasks", "-n", help="Tasks per run.")] = None,
    length_hint: Annotated[str | None, typer.Option(help="`none` or `oracle`.")] = None,
    host_tier_tokens: Annotated[int | None, typer.Option(help="Host KV tier, tokens.")] = None,
    workload_param: Annotated[
        list[str] | None,
        typer.Option("--workload-param", help="workload.key=value (repeatable)."),
    ] = None,
    scheduler_param: Annotated[
        list[str] | None,
        typer.Option("--scheduler-param", help="scheduler.key=value (repeatable)."),
    ] = None,
    replicas: Annotated[
        str | None,
        typer.Option(help="Replica counts of simulated clusters, comma-separated (1,2,4,8)."),
    ] = None,
    router: Annotated[
        str | None,
        typer.Option(
            "--router", help="Routers of the clusters, comma-separated (docs/cluster.md)."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Results directory (default: runs).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", help="Local worker processes (default: cores).")
    ] = None,
    executor: Annotated[str, typer.Option(help="`local` processes or `ray` tasks.")] = "local",
    address: Annotated[
        str | None, typer.Option(help="Ray cluster address (with --executor ray).")
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Re-run finished cells; re-measure capacity.")
    ] = False,
    compact: Annotated[
        bool, typer.Option(help="Store tables losslessly smaller (zstd), e.g. to commit them.")
    ] = False,
    allow_large: Annotated[
        bool,
        typer.Option(help="Run even if the estimated memory exceeds half of this machine's RAM."),
    ] = False,
) -> None:
    """Run schedulers x workloads x loads (or rates) x seeds x presets x KV budgets (x replicas
    x routers for simulated clusters).

    Every scheduler of a (workload, load, seed, preset, budget) group runs on the same workload
    sample. Results go to OUT/<workload>/<scheduler>/<cell>/; finished cells are skipped unless
    --force, so a killed sweep resumes where it stopped.

    Examples:
      topas-bench sweep -w chain3,dag4 -s all --load 0.6,0.8 --seeds 0-2 -n 100 --out runs/s1
      topas-bench sweep --config results/reference.toml --out results/reference
      topas-bench sweep -c sweep.toml --executor ray --address 127.0.0.1:6379
      topas-bench sweep -w metagpt-tl -s fcfs,topas --replicas 1,2,4 --router cache-aware -n 100
    """
    from topas_bench.sweep import load_specs, parse_list, read_toml, run_sweep

    source = str(config) if config else "flags"
    doc = read_toml(config) if config else {}
    flags: dict[str, Any] = {
        "workloads": workload.split(",") if workload else None,
        "schedulers": scheduler,
        "loads": parse_list(load, "--load", float) if load else None,
        "rates": parse_list(rate, "--rate", float) if rate else None,
        "seeds": parse_list(seeds, "--seeds", int) if seeds else None,
        "presets": preset.split(",") if preset else None,
        "kv_budgets": _budgets(kv_budget) if kv_budget else None,
        "tasks": tasks,
        "length_hint": length_hint,
        "host_tier_tokens": host_tier_tokens,
        "workload_params": _by_name(workload_param, "--workload-param"),
        "scheduler_params": parse_scheduler_params(scheduler_param) if scheduler_param else None,
        "replicas": parse_list(replicas, "--replicas", int) if replicas else None,
        "routers": router.split(",") if router else None,
    }
    specs = load_specs(doc, flags, source)
    outs = {o for _, o in specs if o is not None}
    if len(outs) > 1:
        raise TopasError(f"{source}: the sweeps name different `out` directories")
    target = check_out_dir(out_dir or (Path(outs.pop()) if outs else Path("runs")))
    with Progress(
        TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        TextColumn("{task.fields[last]}"), console=err,
    ) as progress:  # fmt: skip
        workers = jobs if jobs is not None else os.cpu_count() or 1
        result = run_sweep(
            [s for s, _ in specs], target, jobs=workers, executor=executor,
            address=address, force=force, compact=compact, progress=_Bar(progress),
            allow_large=allow_large,
        )  # fmt: skip
    ran = len(result.ran) - len(result.failed)
    out.print(
        f"sweep {target}: {result.cells} cells: {ran} ran, {result.skipped} already finished, "
        f"{len(result.failed)} failed"
    )
    for path, why in result.redone:
        err.print(f"redone: {path.relative_to(target)}: {why}", markup=False)
    for c in result.failed:
        err.print(f"failed: {c.workload}/{c.scheduler} seed {c.seed}: {c.error}", markup=False)
    if result.failed:
        raise typer.Exit(1)
    out.print(f"next: topas-bench report {target}")


def _budgets(text: str) -> list[Any]:
    from topas_bench.sweep import parse_list

    parts = [p.strip() for p in text.split(",")]
    return ["derived" if p == "derived" else parse_list(p, "--kv-budget", int)[0] for p in parts]


def _by_name(items: list[str] | None, flag: str) -> dict[str, dict[str, Any]] | None:
    if not items:
        return None
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in parse_assignments(items, flag).items():
        name, dot, param = key.partition(".")
        if not dot or not param:
            raise TopasError(f"{flag} expects name.key=value, got {key!r}")
        grouped.setdefault(name, {})[param] = value
    return grouped


SkipBad = Annotated[
    bool,
    typer.Option(
        "--skip-bad", help="Leave out unreadable, partial or corrupt runs (listed) and go on."
    ),
]
AllowMixed = Annotated[
    bool,
    typer.Option(
        "--allow-mixed-revisions",
        help="Report runs written by different code revisions (or results formats) together.",
    ),
]


def _collect(results: Path, slo: str, skip_bad: bool, allow_mixed: bool) -> Any:
    """Collect a results tree. A bad run (unreadable, partial, corrupt) is an error naming it,
    after listing every one, unless `skip_bad`; so are runs of several code versions, unless
    `allow_mixed`."""
    from topas_bench.analysis.collect import check_revisions, collect
    from topas_bench.analysis.metrics import Slo

    coll = collect(results, Slo.parse(slo))
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


def _load(results: Path, slo: str = "2x", skip_bad: bool = False, allow_mixed: bool = False) -> Any:
    from topas_bench.analysis.report import build_report

    coll = _collect(results, slo, skip_bad, allow_mixed)
    return coll, build_report(coll)


@handles_errors
def report(
    results: Annotated[Path, typer.Argument(help="A results directory tree (a sweep's --out).")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", "-o", help="Where report.md/.csv go (default: RESULTS).")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="Do not print the Markdown.")] = False,
    slo: Annotated[
        str, typer.Option(help="Goodput's SLO: Nx (N x each task's unloaded JCT) or Ns.")
    ] = "2x",
    skip_bad: SkipBad = False,
    allow_mixed_revisions: AllowMixed = False,
) -> None:
    """Summarise a results tree: JCT (mean/p50/p90/p99 with 95% bootstrap intervals over
    seeds), reduction vs the best baseline, goodput under an SLO, request-level TTFT, TPOT,
    ITL, queueing and latency, per-stage latency, throughput, prefix hits, preemptions,
    decision overhead; as Markdown and CSV. Unreadable, partial or corrupt runs are listed and
    the report refuses to go on (exit 2) unless --skip-bad; so do runs of several code
    revisions unless --allow-mixed-revisions.

    Examples:
      topas-bench report runs/s1
      topas-bench report runs/s1 --slo 3x --out runs/s1/slo3
    """
    from topas_bench.analysis.render import to_markdown, write_report

    target = check_out_dir(out_dir or results)
    _, rep = _load(results, slo, skip_bad, allow_mixed_revisions)
    files = write_report(rep, target)
    if not quiet:
        out.print(to_markdown(rep), markup=False)
    out.print(f"wrote {', '.join(str(f) for f in files)}", markup=False)


@handles_errors
def figures(
    results: Annotated[Path, typer.Argument(help="A results directory tree.")],
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Figure directory (default: RESULTS/figures)."),
    ] = None,
    slo: Annotated[str, typer.Option(help="Goodput's SLO: Nx unloaded JCT, or Ns.")] = "2x",
    skip_bad: SkipBad = False,
    allow_mixed_revisions: AllowMixed = False,
) -> None:
    """Draw JCT CDFs, mean/p99 bars, JCT against load, a prefix-residency and KV timeline, and
    ablation bars (PNG and SVG).

    Example: topas-bench figures results/reference --out results/figures
    """
    from topas_bench.analysis.figures import write_figures

    target = check_out_dir(out_dir or results / "figures")
    coll, rep = _load(results, slo, skip_bad, allow_mixed_revisions)
    files = write_figures(coll, rep, target)
    out.print(f"wrote {len(files)} files to {out_dir or results / 'figures'}", markup=False)


@handles_errors
def compare(
    new: Annotated[Path, typer.Argument(help="New results tree.")],
    reference: Annotated[Path, typer.Argument(help="Reference results tree.")],
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
