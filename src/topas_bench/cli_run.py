"""`topas-bench run | sweep`: the commands that run cells (registered by `register`; `tune` is
`cli_tune`'s).

Each parses its flags into a validated specification (`spec.RunSpec`, `sweep.SweepSpec`),
calls the library and prints; progress goes to stderr (`cli_progress`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from topas_bench.cli_common import (
    check_out_dir,
    err,
    handles_errors,
    out,
    parse_assignments,
    parse_by_name,
    parse_scheduler_params,
)
from topas_bench.cli_options import (
    AllowLarge,
    HostTierTokens,
    KvBudget,
    LengthHint,
    Load,
    Preset,
    Rate,
    SchedulerParams,
    Schedulers,
    Seed,
    Tasks,
    Tuned,
    Workload,
)
from topas_bench.errors import TopasError


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(sweep)


@handles_errors
def run(
    workload: Workload = "metagpt-tl",
    scheduler: Schedulers = "all",
    rate: Rate = None,
    load: Load = None,
    tasks: Tasks = None,
    seed: Seed = 0,
    preset: Preset = "a100-qwen32b",
    kv_budget: KvBudget = None,
    length_hint: LengthHint = "none",
    host_tier_tokens: HostTierTokens = 0,
    workload_param: Annotated[
        list[str] | None,
        typer.Option(
            "--workload-param", help="Override a generator parameter, key=value (repeatable)."
        ),
    ] = None,
    scheduler_param: SchedulerParams = None,
    engine: Annotated[
        str,
        typer.Option(
            help="Engine: `sim` (the simulator), `sglang-cpu` (SGLang's own scheduler on CPU, "
            "the reference; `make sglang-env`) or `sglang` (real servers)."
        ),
    ] = "sim",
    model: Annotated[
        str | None, typer.Option(help="sglang: model path; one server per scheduler.")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="sglang: an existing server's URL (one scheduler).")
    ] = None,
    sglang_arg: Annotated[
        list[str] | None,
        typer.Option("--sglang-arg", help="sglang: a launch_server argument (repeatable)."),
    ] = None,
    server_python: Annotated[
        str | None, typer.Option(help="sglang: interpreter with SGLang (default: this one).")
    ] = None,
    router_python: Annotated[
        str | None,
        typer.Option(
            help="sglang --replicas: interpreter with sglang-router 0.3.2 (default: "
            ".venvs/sglang-router, `make router-env`)."
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            help="Serve from N replicas behind a router (sim: simulated; sglang: N servers and "
            "sglang-router). A --load and the default rate are then per replica."
        ),
    ] = None,
    router: Annotated[
        str | None,
        typer.Option(
            help="With --replicas: round-robin, least-load, cache-aware (sglang-router's "
            "default), agent-affinity or workflow-aware (docs/cluster.md)."
        ),
    ] = None,
    router_param: Annotated[
        list[str] | None,
        typer.Option("--router-param", help="Router parameter, key=value (repeatable)."),
    ] = None,
    tuned: Tuned = None,
    out_dir: Annotated[
        str, typer.Option("--out", metavar="<path>", help="Results directory.")
    ] = "runs",
    force: Annotated[bool, typer.Option(help="Re-run cells whose results already exist.")] = False,
    allow_large: AllowLarge = False,
) -> None:
    """Run schedulers on one sampled workload and print a JCT table per scheduler.

    Every scheduler sees the same tasks. Results go to OUT/<workload>/<scheduler>/<cell>/
    (Parquet tables + run.json); a finished cell is reused unless --force. Above 5,000 tasks
    the run's memory and time are estimated first, and a run that would need more than half
    of this machine's RAM is refused unless --allow-large.

    Examples:
      topas-bench run --workload metagpt-tl
      topas-bench run -w dag4 -s fcfs,lpm --load 0.8 -n 500 --seed 3
      topas-bench run -w chain3 --kv-budget 40000 --out runs/big-kv
      topas-bench run -w my-trace.jsonl -s fcfs,topas        # a trace file, as recorded
      topas-bench run -w metagpt-tl -s fcfs,topas --engine sglang-cpu -n 50
      topas-bench run -w metagpt-tl -s fcfs,topas --replicas 4 --router cache-aware -n 400
      topas-bench run -w dag4 -s fcfs,topas --engine sglang --model /models/Qwen2.5-32B-Instruct
      topas-bench run -w dag4 -s paper --load 0.8 --tuned runs/tune/tuned.toml
    """
    from topas_bench.analysis.console import print_plan, print_run_table
    from topas_bench.cli_progress import RunBars
    from topas_bench.experiment import default_rate_warning, plan_run, run_plan
    from topas_bench.runners.cluster.config import ClusterConfig
    from topas_bench.runners.engines import engine_options
    from topas_bench.spec import RunSpec, parse_schedulers

    options = engine_options(engine, {
        "--length-hint": length_hint, "--host-tier-tokens": host_tier_tokens, "--model": model,
        "--endpoint": endpoint, "--sglang-arg": sglang_arg, "--server-python": server_python,
        "--router-python": router_python,
    })  # fmt: skip
    names = parse_schedulers("all" if scheduler is None else scheduler)  # `-s ''` is no name
    spec = RunSpec(
        workload=workload, schedulers=names, num_tasks=tasks,
        seed=seed, rate_per_s=rate, load=load, preset=preset, kv_budget_tokens=kv_budget,
        workload_params=parse_assignments(workload_param or [], "--workload-param"),
        scheduler_params=parse_scheduler_params(scheduler_param or []),
        cluster=ClusterConfig.from_flags(
            replicas, router, parse_assignments(router_param or [], "--router-param")
        ),
        engine=options, out=check_out_dir(out_dir),
    )  # fmt: skip
    variants = _tuned_variants(tuned, spec.schedulers, (spec.seed,), spec.scheduler_params)
    with RunBars(err) as bars:
        plan = plan_run(spec, check_size=True, allow_large=allow_large, progress=bars)
        print_plan(out, plan)
        if warning := default_rate_warning(plan, rate_given=rate is not None):
            err.print(warning, markup=False)
        results = run_plan(plan, force=force, progress=bars)
        if variants:  # the same sample, each tuned variant beside its default
            from dataclasses import replace

            from rich.markup import escape

            from topas_bench.analysis.collect import scheduler_label

            again = replace(plan, schedulers=tuple(variants), scheduler_params=variants)
            for c in run_plan(again, force=force, progress=bars):  # rows named name[k=v,...]
                label = escape(scheduler_label(c.scheduler, variants[c.scheduler]))
                results.append(replace(c, scheduler=label))
    print_run_table(out, plan, results)
    for c in results:
        if c.redone is not None:
            err.print(f"redone: {c.run_dir}: {c.redone}", markup=False)


def _tuned_variants(
    path: Path | None, schedulers: tuple[str, ...], seeds: tuple[int, ...],
    given: Mapping[str, Any],
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """`--tuned`'s settings for `schedulers` that are not their defaults (none without it)."""
    if path is None:
        return {}
    from topas_bench.tuned import load_tuned

    tuned = load_tuned(path)
    tuned.check_seeds(seeds, "--seed")
    variants = tuned.variants(schedulers)
    both = sorted(set(variants) & set(given))
    if both:
        raise TopasError(f"--scheduler-param for {both[0]!r}, which {path} tunes: give one or "
                         "the other")  # fmt: skip
    return variants


def _listed(text: str | None, flag: str, kind: type[int] | type[float]) -> list[Any] | None:
    from topas_bench.sweep import parse_list

    return parse_list(text, flag, kind) if text else None


@handles_errors
def sweep(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="Sweep file (TOML); flags override it.", readable=False
        ),
    ] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", "-w", help="Workloads, comma-separated.")
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            "-s",
            help="`paper`, `peers`, `all`, `baselines`, `sglang`, `ablations`, `peers-2026`, "
            "`everything`, or a,b,c (default: all).",
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
    kv_budget_multiples: Annotated[
        str | None,
        typer.Option(
            "--kv-budget-multiples",
            help="KV budgets as multiples of each workload's agent-prefix working set, "
            "comma-separated; `one-agent` = the largest prefix plus one call (instead of "
            "--kv-budget).",
        ),
    ] = None,
    output_scales: Annotated[
        str | None,
        typer.Option("--output-scales", help="Output-length factors, comma-separated (0.5,1,2)."),
    ] = None,
    load_reference: Annotated[
        str | None,
        typer.Option(
            "--load-reference",
            help="Schedulers or groups whose best saturation rate a load is a fraction of "
            "(default: fcfs, the measured capacity).",
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
        str | None,
        typer.Option("--out", metavar="<path>", help="Results directory (default: runs)."),
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
    tuned: Annotated[
        Path | None,
        typer.Option(
            "--tuned",
            help="A tuned file (`tune`'s OUT/tuned.toml): each scheduler's tuned setting runs "
            "beside its default, on the same samples.",
        ),
    ] = None,
    tuned_only: Annotated[
        bool,
        typer.Option(
            "--tuned-only", help="With --tuned: run the tuned settings instead of the defaults."
        ),
    ] = False,
    allow_large: AllowLarge = False,
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
      topas-bench sweep -c results/regime-map.toml --out runs/regime-map
      topas-bench sweep -c results/paper-regime.toml --tuned runs/tune/tuned.toml --out runs/t
    """
    from topas_bench.cli_progress import SweepBars
    from topas_bench.sweep import load_specs, read_toml, run_sweep

    source = str(config) if config else "flags"
    flags: dict[str, Any] = {
        "workloads": workload.split(",") if workload else None,
        "schedulers": scheduler,
        "loads": _listed(load, "--load", float),
        "rates": _listed(rate, "--rate", float),
        "seeds": _listed(seeds, "--seeds", int),
        "presets": preset.split(",") if preset else None,
        "kv_budgets": _budgets(kv_budget) if kv_budget else None,
        "kv_budget_multiples": _multiples(kv_budget_multiples) if kv_budget_multiples else None,
        "output_scales": _listed(output_scales, "--output-scales", float),
        "load_reference": load_reference,
        "tasks": tasks,
        "length_hint": length_hint,
        "host_tier_tokens": host_tier_tokens,
        "workload_params": parse_by_name(workload_param or [], "--workload-param", "name") or None,
        "scheduler_params": parse_scheduler_params(scheduler_param or []) or None,
        "replicas": _listed(replicas, "--replicas", int),
        "routers": router.split(",") if router else None,
        "tuned": str(tuned) if tuned else None,
        "tuned_only": True if tuned_only else None,
    }
    doc = read_toml(config) if config else {}
    specs = load_specs(doc, flags, source, base=config.parent if config else None)
    outs = {o for _, o in specs if o is not None}
    if len(outs) > 1:
        raise TopasError(f"{source}: the sweeps name different `out` directories")
    target = check_out_dir(out_dir if out_dir is not None else (outs.pop() if outs else "runs"))
    with SweepBars(err) as bars:
        result = run_sweep(
            [s for s, _ in specs], target, jobs=jobs if jobs is not None else os.cpu_count() or 1,
            executor=executor,
            address=address, force=force, compact=compact, progress=bars,
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


def _multiples(text: str) -> list[Any]:
    from topas_bench.sweep import parse_list
    from topas_bench.units import ONE_AGENT

    parts = [p.strip() for p in text.split(",")]
    flag = "--kv-budget-multiples"
    return [p if p == ONE_AGENT else parse_list(p, flag, float)[0] for p in parts]


def _budgets(text: str) -> list[Any]:
    from topas_bench.sweep import parse_list

    parts = [p.strip() for p in text.split(",")]
    return ["derived" if p == "derived" else parse_list(p, "--kv-budget", int)[0] for p in parts]
