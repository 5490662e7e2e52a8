"""The `topas-bench` command line: thin typer commands over the library.

Each command parses, calls one library function, prints. Problems with the input are one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from topas_bench import cli_analysis, cli_fidelity, cli_gpu, cli_run, cli_site, cli_tune
from topas_bench.cli_common import (
    check_not_input,
    check_writable_file,
    handles_errors,
    lists_problems,
    out,
    parse_assignments,
)
from topas_bench.cli_help import ReflowGroup
from topas_bench.cli_history import history_app
from topas_bench.cli_trace import trace_app

app = typer.Typer(
    cls=ReflowGroup,
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
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Trace file to write (JSONL).", readable=False)
    ],
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
    inputs = {"the trace being sampled": name} if Path(name).is_file() else {}
    check_writable_file(check_not_input(output, inputs, "-o"))
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
    from topas_bench.experiment import measure_capacity
    from topas_bench.runners.sim.cost import load_preset
    from topas_bench.spec import parse_schedulers

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
    path: Annotated[Path, typer.Argument(help="Trace file (JSONL).", readable=False)],
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
    """List the registered schedulers (built-in, then installed plugins): group, capabilities,
    description (in full, wrapped).

    "acts while full": asked, and may act, while the batch is full (SGLang's `batch_is_full`);
    "preempts": may retract running requests by its own decision (docs/schedulers.md).

    Example: topas-bench schedulers list
    """
    from rich.table import Table

    from topas_bench.schedulers.plugins import note
    from topas_bench.schedulers.registry import (
        SCHEDULERS,
        UNGROUPED,
        capabilities,
        role,
        summary,
    )

    table = Table(title="schedulers (docs/schedulers.md)", title_justify="left")
    for column in ("name", "group", "acts while full", "preempts", "description"):
        table.add_column(column, overflow="fold")
    yes = ("no", "yes")
    notes = []
    for name in SCHEDULERS:
        plugin = SCHEDULERS.plugin(name)
        broken = note(plugin) if plugin is not None else None
        if broken is not None:  # listed, not loaded: using it fails with the same line
            notes.append(broken)
            table.add_row(name, "plugin", "?", "?", "(fails to load: see the note below)")
            continue
        if plugin is not None:
            notes.append(f"{name} is a plugin: {plugin.describe()}")
        caps = capabilities(name)
        why = f" In no group: {UNGROUPED[name]}." if name in UNGROUPED else ""
        table.add_row(
            name, role(name), yes[caps.acts_while_full], yes[caps.preempts], summary(name) + why
        )
    out.print(table)
    for line in notes:
        out.print(f"note: {line}", markup=False, highlight=False)


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


# The commands in their own modules, in the order `--help` lists them.
for _command in (
    cli_run.run,
    cli_run.sweep,
    cli_tune.tune,
    cli_analysis.report,
    cli_analysis.figures,
    cli_analysis.compare,
    cli_fidelity.fidelity,
    cli_site.site,
):
    app.command()(_command)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    cli_gpu.serve
)
app.command()(cli_gpu.calibrate)
app.command()(cli_gpu.profile)


def main() -> None:
    app()
