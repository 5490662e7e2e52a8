"""`topas-bench tune`: parses its flags into a `tune.TuneSpec`, tunes, prints (registered in
`topas_bench.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from topas_bench.cli_common import check_out_dir, err, handles_errors, out, parse_assignments
from topas_bench.errors import TopasError

DEFAULT_WORKLOADS = "chain3,dag4,dag10-wide,metagpt-sop,metagpt-tl"


@handles_errors
def tune(
    scheduler: Annotated[
        str,
        typer.Option(
            "--scheduler",
            "-s",
            help="Schedulers to tune, each in turn with the same budget: names, or groups "
            "(`all`, `paper`, `peers`, `sglang`, `ablations`, `peers-2026`, `everything`: their "
            "schedulers that have a grid), comma-separated.",
        ),
    ] = "topas",
    workload: Annotated[
        str, typer.Option("--workload", "-w", help="Workloads of every study, comma-separated.")
    ] = DEFAULT_WORKLOADS,
    tasks: Annotated[int, typer.Option("--tasks", "-n", help="Tasks per run.")] = 80,
    seeds: Annotated[
        str, typer.Option(help="Tuning seeds, 101,102 or 101-103 (never evaluation seeds 0-9).")
    ] = "101-103",
    load: Annotated[
        float, typer.Option(help="Load: a fraction of the best --load-reference saturation.")
    ] = 0.8,
    load_reference: Annotated[
        str,
        typer.Option(
            "--load-reference",
            help="Schedulers or groups whose best saturation rate the load is a fraction of.",
        ),
    ] = "baselines",
    preset: Annotated[
        str, typer.Option(help="Preset: a name or a preset .toml file.")
    ] = "a100-qwen32b",
    kv_budget: Annotated[
        int | None,
        typer.Option("--kv-budget", help="KV budget in tokens (default: the preset's derived)."),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="Values for one parameter, scheduler.name=v1,v2,... (repeatable; replaces "
            "that scheduler's grid; name=v1,v2,... when one scheduler is tuned).",
        ),
    ] = None,
    trials: Annotated[
        int,
        typer.Option(help="Trials per scheduler, in all (a grid with fewer points: each once)."),
    ] = 30,
    jobs: Annotated[
        int, typer.Option(help="Worker processes running the baselines and each trial's cells.")
    ] = 2,
    plots: Annotated[
        bool, typer.Option(help="Draw Optuna's history and importances into OUT/plots/NAME.")
    ] = False,
    grids: Annotated[
        bool, typer.Option("--grids", help="Print every tunable scheduler's grid and stop.")
    ] = False,
    out_dir: Annotated[
        Path,
        typer.Option("--out", help="Where the studies (tune.db), runs and tuned.toml are kept."),
    ] = Path("runs/tune"),
) -> None:
    """Tune schedulers' parameters on tuning seeds, each with the same budget, and write the
    settings found to OUT/tuned.toml.

    Each scheduler searches its grid (`--grids` lists them) with Optuna, starting from its
    defaults: --trials trials, or every point of a smaller grid. The objective is the mean of
    (mean JCT, p99 JCT), each relative to the best default baseline on the same sample,
    averaged over workloads x seeds; the regime is the paper-regime sweep's (--load of the best
    baseline's saturation, measured once into OUT/capacity.json). Studies live in OUT/tune.db:
    the same command resumes them. OUT/tuned.toml gains a table per scheduler; `sweep --tuned`
    and `run --tuned` run the settings beside the defaults.

    Examples:
      topas-bench tune -s all --trials 30 --jobs 2 --out runs/tune
      topas-bench tune -s kvflow,continuum --out runs/tune     # adds to runs/tune/tuned.toml
      topas-bench tune -s topas -w dag4 --param beta=0,0.5,1 --trials 3 --out runs/tune-dag4
    """
    from topas_bench.sweep import parse_list
    from topas_bench.tune import GRIDS, TUNED_FILE, TuneSpec
    from topas_bench.tune import plots as draw_plots
    from topas_bench.tune import tune as run_tune
    from topas_bench.tune.grids import describe, size
    from topas_bench.tune.spec import TuneResult

    if grids:
        for name, grid in GRIDS.items():
            out.print(f"{name} ({size(name, grid):,} points): {describe(grid)}", markup=False)
        return
    names = _schedulers(scheduler)
    spec = TuneSpec(
        schedulers=names, workloads=tuple(w.strip() for w in workload.split(",") if w.strip()),
        num_tasks=tasks, seeds=tuple(parse_list(seeds, "--seeds", int)), load=load,
        load_reference=_reference(load_reference), preset=preset, kv_budget_tokens=kv_budget,
        grids=_grids(param or [], names), trials=trials, jobs=jobs, out=check_out_dir(out_dir),
    )  # fmt: skip
    err.print(f"tuning {', '.join(names)}; budget: {spec.budget().describe()}", markup=False)

    def show(r: TuneResult) -> None:
        b, d = r.best, r.default
        found = " ".join(f"{k}={v}" for k, v in b.params.items()) or "the defaults"
        ran = [t for t in r.trials if t.wall_s > 0]
        took = (f"; a trial run: {sum(t.wall_s for t in ran) / len(ran):,.0f} s wall, "
                f"{sum(t.cpu_s for t in ran) / len(ran):,.0f} s CPU" if ran else "")  # fmt: skip
        out.print(f"{r.scheduler}: {found} ({len(r.trials)} trials of {r.grid_points:,} grid "
                  f"points{took})", markup=False)  # fmt: skip
        out.print(
            f"  objective {b.objective:.4f} (mean x{b.mean_ratio:.3f}, p99 x{b.p99_ratio:.3f} "
            f"of the best baseline); defaults {d.objective:.4f} (mean x{d.mean_ratio:.3f}, "
            f"p99 x{d.p99_ratio:.3f})",
            markup=False,
        )
        if plots:
            files = draw_plots(r, out_dir / "plots" / r.scheduler)
            out.print(f"  plots: {', '.join(str(f) for f in files)}", markup=False)

    from topas_bench.cli_progress import SweepBars

    with SweepBars(err) as bars:
        _, tuned = run_tune(spec, progress=bars, on_result=show)
    path = out_dir / TUNED_FILE
    out.print(
        f"{path}: {len(tuned.entries)} schedulers ({', '.join(tuned.entries)}); run them beside "
        f"the defaults: topas-bench sweep ... --tuned {path}",
        markup=False,
    )


def _schedulers(text: str) -> tuple[str, ...]:
    """Names (each must be tunable) and groups (their tunable schedulers), in order, once."""
    from topas_bench.spec import GROUPS, parse_schedulers
    from topas_bench.tune.grids import grid_for, tunable

    names: list[str] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        if item in GROUPS or item == "everything":
            found = tunable(list(parse_schedulers(item)))
        else:
            grid_for(item)  # unknown or without parameters: the list of tunable ones
            found = [item]
        names += [n for n in found if n not in names]
    if not names:
        raise TopasError(f"--scheduler {text!r} holds no tunable scheduler")
    return tuple(names)


def _reference(text: str) -> tuple[str, ...]:
    from topas_bench.spec import parse_schedulers

    return parse_schedulers(text)


def _grids(items: list[str], names: tuple[str, ...]) -> dict[str, dict[str, tuple[Any, ...]]]:
    """`--param [scheduler.]name=v1,v2,...` as grids by scheduler."""
    grids: dict[str, dict[str, tuple[Any, ...]]] = {}
    for item in items:
        target, sep, values = item.partition("=")
        if not sep or not target.strip() or not values.strip():
            raise TopasError(f"--param expects [scheduler.]name=v1,v2,..., got {item!r}")
        owner, dot, name = target.strip().rpartition(".")
        if not dot:
            if len(names) != 1:
                raise TopasError(f"--param {item!r}: name the scheduler (scheduler.{target}=...)"
                                 " when several are tuned")  # fmt: skip
            owner = names[0]
        grids.setdefault(owner, {})[name] = tuple(
            parse_assignments([f"v={v}"], "--param")["v"] for v in values.split(",")
        )
    return grids
