"""The `topas-bench` command line: thin typer commands over the library.

Each command parses, calls one library function, prints. Problems with the input are one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
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
)

from topas_bench import cli_analysis, cli_fidelity, cli_site
from topas_bench.cli_common import (
    check_out_dir,
    check_writable_file,
    err,
    handles_errors,
    lists_problems,
    out,
    parse_assignments,
    parse_scheduler_params,
)
from topas_bench.cli_history import history_app
from topas_bench.errors import TopasError
from topas_bench.recorder.cli import trace_app
from topas_bench.runners.sglang import cli as sglang_cli

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    help="Schedulers for multi-agent LLM serving: TOPAS, its baselines, an SGLang-faithful "
    "simulator.\n\nExample: topas-bench run --workload metagpt-tl --scheduler all",
)
workloads_app = typer.Typer(
    no_args_is_help=True, help="List, inspect, export and validate workloads."
)
schedulers_app = typer.Typer(no_args_is_help=True, help="List the registered schedulers.")
presets_app = typer.Typer(no_args_is_help=True, help="List and show hardware/model presets.")
app.add_typer(workloads_app, name="workloads")
app.add_typer(schedulers_app, name="schedulers")
app.add_typer(presets_app, name="presets")
app.add_typer(trace_app, name="trace")
app.add_typer(history_app, name="history")


def _print_version(value: bool) -> None:
    if value:
        from topas_bench import __version__

        out.print(f"topas-bench {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Schedulers for multi-agent LLM serving: TOPAS, its baselines, an SGLang-faithful
    simulator.

    Example: topas-bench run --workload metagpt-tl --scheduler all
    """


# -- run ---------------------------------------------------------------------------------------
@app.command()
@handles_errors
def run(
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            "-w",
            help="Workload name (see `workloads list`) or a trace file (docs/workload-format.md).",
        ),
    ] = "metagpt-tl",
    scheduler: Annotated[
        str,
        typer.Option(
            "--scheduler",
            "-s",
            help="`paper` (the paper's five baselines + topas), `peers` (the schedulers the "
            "paper left out: kvflow, continuum, lpm-aging, stock SGLang's), `all` (paper + "
            "peers), `baselines`, `sglang`, `ablations`, `everything`, names, or a "
            "comma-separated mix (paper,topas-base).",
        ),
    ] = "all",
    rate: Annotated[
        float | None, typer.Option(help="Poisson arrival rate, tasks/s (default: the workload's).")
    ] = None,
    load: Annotated[
        float | None,
        typer.Option(help="Arrival rate as a fraction of measured capacity (instead of --rate)."),
    ] = None,
    tasks: Annotated[
        int | None,
        typer.Option("--tasks", "-n", help="Number of tasks (default: 200; a file: all of its)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload sample.")] = 0,
    preset: Annotated[
        str,
        typer.Option(
            help="Hardware/model preset: a name (see `presets list`) or a preset .toml file "
            "(e.g. from `calibrate`)."
        ),
    ] = "a100-qwen32b",
    kv_budget: Annotated[
        int | None,
        typer.Option(
            "--kv-budget", help="KV cache budget in tokens (default: derived from the preset)."
        ),
    ] = None,
    length_hint: Annotated[
        str, typer.Option(help="`none`, or `oracle` to show policies true output lengths.")
    ] = "none",
    host_tier_tokens: Annotated[
        int, typer.Option(help="Host-memory KV tier capacity in tokens (0 = off).")
    ] = 0,
    workload_param: Annotated[
        list[str] | None,
        typer.Option(
            "--workload-param", help="Override a generator parameter, key=value (repeatable)."
        ),
    ] = None,
    scheduler_param: Annotated[
        list[str] | None,
        typer.Option("--scheduler-param", help="Scheduler parameter, name.key=value (repeatable)."),
    ] = None,
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
    out_dir: Annotated[Path, typer.Option("--out", help="Results directory.")] = Path("runs"),
    force: Annotated[bool, typer.Option(help="Re-run cells whose results already exist.")] = False,
    allow_large: Annotated[
        bool,
        typer.Option(help="Run even if the estimated memory exceeds half of this machine's RAM."),
    ] = False,
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
    """
    from topas_bench.analysis.console import print_plan, print_run_table
    from topas_bench.experiment import parse_schedulers, plan_run, run_cell
    from topas_bench.runners.engines import ENGINES
    from topas_bench.sizing import ESTIMATE_ABOVE_TASKS, run_gate

    ENGINES.get(engine)  # an unknown engine: one line naming the known ones
    if length_hint not in ("none", "oracle"):
        raise TopasError(f"--length-hint must be `none` or `oracle`, got {length_hint!r}")
    if engine != "sglang":
        given = {"--model": model, "--endpoint": endpoint, "--sglang-arg": sglang_arg,
                 "--server-python": server_python, "--router-python": router_python}  # fmt: skip
        for flag, value in given.items():
            if value:
                raise TopasError(
                    f"{flag} is for --engine sglang; --engine {engine} does not use it"
                )
    from topas_bench.workloads.registry import run_defaults

    names = parse_schedulers(scheduler)
    wparams = parse_assignments(workload_param or [], "--workload-param")
    rparams = parse_assignments(router_param or [], "--router-param")
    sparams = parse_scheduler_params(scheduler_param or [])
    num_tasks = tasks if tasks is not None else run_defaults(workload, wparams)[0]
    building = Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err,
        transient=True, disable=not err.is_terminal,
    )  # fmt: skip

    def before_generate(rate_per_s: float) -> None:
        if engine != "sglang":  # a real server's memory is not this process's
            run_gate(
                workload=workload,
                params=wparams,
                num_tasks=num_tasks,
                seed=seed,
                schedulers=names,
                preset=preset,
                kv_budget_tokens=kv_budget,
                scheduler_params=sparams,
                forced=allow_large,
                say=lambda msg: err.print(msg, markup=False),
            )(rate_per_s / (replicas or 1))  # probed on one server at its share of the rate
        if num_tasks > ESTIMATE_ABOVE_TASKS:
            building.start()
            building.add_task(f"sampling {num_tasks:,} tasks", total=None)

    try:
        plan = plan_run(
            workload=workload, schedulers=names, num_tasks=num_tasks, seed=seed,
            rate_per_s=rate, load=load, preset=preset, kv_budget_tokens=kv_budget,
            length_hint="oracle" if length_hint == "oracle" else "none",
            host_tier_tokens=host_tier_tokens, out=check_out_dir(out_dir),
            workload_params=wparams, scheduler_params=sparams, before_generate=before_generate,
            engine="sim" if engine == "sglang" else engine, replicas=replicas, router=router,
            router_params=rparams,
        )  # fmt: skip
    finally:
        if building.live.is_started:
            building.stop()
    if engine == "sglang-cpu":
        from topas_bench.runners.sglang_cpu.engine import check_plan

        check_plan(plan)  # the venv and the settings, before anything starts
    if engine == "sglang":
        from topas_bench.runners.sglang.runner import options
        from topas_bench.runners.sglang.runner import print_plan as print_sglang_plan

        plan = options(plan, model, endpoint, sglang_arg or [], server_python, router_python)
        print_sglang_plan(out, plan)
    else:
        print_plan(out, plan)
    from topas_bench.experiment import default_rate_warning

    warning = default_rate_warning(plan, rate_given=rate is not None)
    if warning is not None:
        err.print(warning, markup=False)
    results = []
    with Progress(
        TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("tasks"), TimeElapsedColumn(), console=err, transient=False,
    ) as progress:  # fmt: skip
        for name in plan.schedulers:
            bar = progress.add_task(name, total=plan.num_tasks)
            cell = run_cell(plan, name, force=force, on_task_done=_advance(progress, bar))
            progress.update(bar, completed=plan.num_tasks)
            results.append(cell)
    print_run_table(out, plan, results)


def _advance(progress: Progress, bar: TaskID) -> Callable[[int], None]:
    def update(done: int) -> None:
        progress.update(bar, completed=done)

    return update


# -- tune -----------------------------------------------------------------------------------
@app.command()
@handles_errors
def tune(
    workload: Annotated[str, typer.Option("--workload", "-w", help="Workload to tune on.")],
    scheduler: Annotated[str, typer.Option("--scheduler", "-s", help="A TOPAS variant.")] = "topas",
    tasks: Annotated[int, typer.Option("--tasks", "-n", help="Tasks per tuning run.")] = 150,
    seeds: Annotated[
        str, typer.Option(help="Tuning seeds (disjoint from evaluation seeds 0-4).")
    ] = "101,102,103",
    load: Annotated[float | None, typer.Option(help="Load as a fraction of capacity.")] = None,
    rate: Annotated[
        float | None, typer.Option(help="Arrival rate, tasks/s (default: the workload's).")
    ] = None,
    preset: Annotated[
        str, typer.Option(help="Preset: a name or a preset .toml file.")
    ] = "a100-qwen32b",
    kv_budget: Annotated[
        int | None, typer.Option("--kv-budget", help="KV budget in tokens.")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="Choices for one parameter, name=v1,v2,... (repeatable; replaces the default "
            "search space).",
        ),
    ] = None,
    trials: Annotated[int, typer.Option(help="Trials to add to the study.")] = 30,
    jobs: Annotated[int, typer.Option(help="Worker processes sharing the study.")] = 2,
    plots: Annotated[
        bool, typer.Option(help="Draw Optuna's history and importances into OUT/plots.")
    ] = False,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where the study (tune.db) and its runs are kept.")
    ] = Path("runs/tune"),
) -> None:
    """Search TOPAS's parameters with Optuna on tuning seeds; print the best setting and what
    it moved.

    The objective is the mean of (mean JCT, p99 JCT), each relative to the best baseline on the
    same sample, averaged over the tuning seeds. The study lives in OUT/tune.db (SQLite): the
    same command again resumes it and adds --trials trials; --jobs workers share it.

    Examples:
      topas-bench tune --workload metagpt-tl --trials 60 --jobs 2 --plots
      topas-bench tune -w dag4 --param beta=0,0.5,1 --param preempt_margin_s=5,20 --trials 6
    """
    from topas_bench.tune import DEFAULT_GRID, TuneSpec
    from topas_bench.tune import plots as draw_plots
    from topas_bench.tune import tune as run_tune

    grid: dict[str, tuple[Any, ...]] = dict(DEFAULT_GRID)
    if param:
        grid = {}
        for item in param:
            name, sep, values = item.partition("=")
            if not sep or not name.strip() or not values.strip():
                raise TopasError(f"--param expects name=v1,v2,..., got {item!r}")
            grid[name.strip()] = tuple(
                parse_assignments([f"v={v}"], "--param")["v"] for v in values.split(",")
            )
    try:
        seed_list = tuple(int(x) for x in seeds.split(","))
    except ValueError:
        raise TopasError(f"--seeds expects comma-separated integers, got {seeds!r}") from None
    spec = TuneSpec(
        workload=workload, scheduler=scheduler, num_tasks=tasks, seeds=seed_list, load=load,
        rate_per_s=rate, preset=preset, kv_budget_tokens=kv_budget, grid=grid, trials=trials,
        jobs=jobs, out=check_out_dir(out_dir),
    )  # fmt: skip
    result = run_tune(spec, progress=lambda msg: err.print(msg, markup=False))
    b, d = result.best, result.default
    settings = " ".join(f"--scheduler-param {scheduler}.{k}={v}" for k, v in b.params.items())
    out.print(f"best setting on {workload} (seeds {seeds}): {settings or 'the defaults'}")
    out.print(
        f"  vs best baseline: mean x{b.mean_ratio:.3f}, p99 x{b.p99_ratio:.3f} "
        f"(defaults: mean x{d.mean_ratio:.3f}, p99 x{d.p99_ratio:.3f})"
    )
    out.print(
        f"  vs defaults: mean {100 * (b.mean_ratio / d.mean_ratio - 1):+.1f}%, "
        f"p99 {100 * (b.p99_ratio / d.p99_ratio - 1):+.1f}%"
    )
    out.print(
        f"  study {result.study}: {len(result.trials)} trials in {out_dir / 'tune.db'}",
        markup=False,
    )
    if plots:
        files = draw_plots(result, out_dir / "plots")
        out.print(f"  plots: {', '.join(str(f) for f in files)}", markup=False)


# -- workloads ---------------------------------------------------------------------------------
@workloads_app.command("list")
@handles_errors
def workloads_list() -> None:
    """List the registered workloads with their default arrival rates.

    Example: topas-bench workloads list
    """
    from topas_bench.analysis.console import print_workloads

    print_workloads(out)


@workloads_app.command("show")
@handles_errors
def workloads_show(
    name: Annotated[str, typer.Argument(help="Workload name or trace file.")],
    seed: Annotated[int, typer.Option(help="Seed of the sample.")] = 0,
    workload_param: Annotated[
        list[str] | None, typer.Option("--workload-param", help="key=value override (repeatable).")
    ] = None,
) -> None:
    """Show a workload's agents and the DAG of one sampled task.

    Example: topas-bench workloads show metagpt-tl
    """
    from topas_bench.analysis.console import print_workload
    from topas_bench.workloads.registry import generate

    params = parse_assignments(workload_param or [], "--workload-param")
    print_workload(out, generate(name, num_tasks=1, seed=seed, **params))


@workloads_app.command("export")
@handles_errors
def workloads_export(
    name: Annotated[str, typer.Argument(help="Workload name or trace file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Trace file to write (JSONL).")],
    tasks: Annotated[
        int | None,
        typer.Option("--tasks", "-n", help="Number of tasks (default: 200, as `run`)."),
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="Arrival rate, tasks/s (default: the workload's).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    workload_param: Annotated[
        list[str] | None, typer.Option("--workload-param", help="key=value override (repeatable).")
    ] = None,
) -> None:
    """Sample a workload and write it as a versioned JSONL trace.

    Example: topas-bench workloads export dag4 -n 50 -o dag4.jsonl
    """
    from topas_bench.workloads.registry import generate, run_defaults
    from topas_bench.workloads.trace import dump_workload

    params = parse_assignments(workload_param or [], "--workload-param")
    check_writable_file(output)
    n = tasks if tasks is not None else run_defaults(name, params)[0]
    w = generate(name, num_tasks=n, rate_per_s=rate, seed=seed, **params)
    dump_workload(w, output)
    out.print(f"wrote {output}: {len(w.tasks)} tasks, {sum(len(t.stages) for t in w.tasks)} calls")


@workloads_app.command("saturation")
@handles_errors
def workloads_saturation(
    name: Annotated[str, typer.Argument(help="Workload name or trace file.")],
    schedulers: Annotated[
        str, typer.Option("--schedulers", "-s", help="Schedulers or groups, comma-separated.")
    ] = "baselines",
    preset: Annotated[str, typer.Option(help="Preset: a name or a preset .toml file.")] = (
        "a100-qwen32b"
    ),
    kv_budget: Annotated[
        int | None, typer.Option("--kv-budget", help="KV budget in tokens (default: derived).")
    ] = None,
    workload_param: Annotated[
        list[str] | None, typer.Option("--workload-param", help="key=value override (repeatable).")
    ] = None,
) -> None:
    """Each scheduler's saturation rate on the simulator: the Poisson rate at which its mean JCT
    reaches 3x the tasks' unloaded JCT (the capacity probe, run per scheduler), and the best.
    A load of F relative to the best baseline is F x the best rate: pass it as `--rate`.

    Example: topas-bench workloads saturation metagpt-tl -s baselines
    """
    from topas_bench.experiment import measure_capacity, parse_schedulers
    from topas_bench.runners.sim.cost import load_preset

    params = parse_assignments(workload_param or [], "--workload-param")
    pre = load_preset(preset)
    budget = kv_budget if kv_budget is not None else pre.derived_kv_budget_tokens
    names = parse_schedulers(schedulers)
    rates = {}
    for s in names:
        rates[s] = measure_capacity(name, tuple(sorted(params.items())), pre, budget, s)
        out.print(f"{s:>24}  {rates[s]:.5f} tasks/s", markup=False)
    best = max(rates, key=lambda k: rates[k])
    out.print(f"{'best':>24}  {rates[best]:.5f} tasks/s ({best}; KV budget {budget})", markup=False)


@workloads_app.command("validate")
@lists_problems
def workloads_validate(
    path: Annotated[Path, typer.Argument(help="Trace file (JSONL).")],
    kv_budget: Annotated[
        int | None,
        typer.Option("--kv-budget", help="Also check every call fits this KV budget (tokens)."),
    ] = None,
) -> None:
    """Validate a trace file (docs/workload-format.md): every line against the format (all its
    JSON Schema says, and more), then the DAG, agents and keys; report every problem with its
    line and field. Streams: memory stays small whatever the file's size. A .gz file or one
    with a UTF-8 byte order mark is read as it is.

    Example: topas-bench workloads validate dag4.jsonl --kv-budget 18692
    """
    from topas_bench.workloads.trace import validate_file

    s = validate_file(path, kv_budget_tokens=kv_budget)
    out.print(f"{path}: valid: {s.tasks:,} tasks, {s.calls:,} calls, {s.agents} agents")


# -- schedulers and presets -------------------------------------------------------------------
@schedulers_app.command("list")
@handles_errors
def schedulers_list() -> None:
    """List the registered schedulers.

    Example: topas-bench schedulers list
    """
    from topas_bench.analysis.console import print_schedulers

    print_schedulers(out)


@presets_app.command("list")
@handles_errors
def presets_list() -> None:
    """List the packaged presets with their derived KV budgets.

    Example: topas-bench presets list
    """
    from topas_bench.analysis.console import print_presets

    print_presets(out)


@presets_app.command("show")
@handles_errors
def presets_show(
    name: Annotated[str, typer.Argument(help="Preset name or preset .toml file.")],
) -> None:
    """Show a preset's hardware, model and cost-model values.

    Example: topas-bench presets show a100-qwen32b
    """
    from topas_bench.analysis.console import print_preset
    from topas_bench.runners.sim.cost import load_preset

    print_preset(out, load_preset(name))


# sweep, report, figures, compare; fidelity; site; serve, calibrate: in their own modules.
cli_analysis.register(app)
cli_fidelity.register(app)
cli_site.register(app)
sglang_cli.register(app)


def main() -> None:
    app()
