"""Rich tables the CLI prints. Formatting only: every number comes from the library."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from topas_bench.analysis.metrics import METRIC_BY_NAME
from topas_bench.runners.sglang.options import SglangOptions
from topas_bench.runners.sim.cost import Preset, load_preset, preset_names
from topas_bench.workloads.lengths import describe, lengths_line
from topas_bench.workloads.model import Workload
from topas_bench.workloads.registry import WORKLOADS

if TYPE_CHECKING:
    from topas_bench.cell.stored import CellResult
    from topas_bench.plan import RunPlan

RUN_COLUMNS = (
    ("tasks", "tasks"),
    ("mean_jct_s", "mean JCT s"),
    ("p50_jct_s", "p50 s"),
    ("p90_jct_s", "p90 s"),
    ("p99_jct_s", "p99 s"),
    ("throughput_tps", "tasks/s"),
    ("prefix_hit_rate", "prefix hit"),
    ("preemptions", "preempt"),
)


def fmt_metric(name: str, value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return METRIC_BY_NAME[name].fmt.format(value)


def budget_line(plan: RunPlan) -> str:
    p = plan.preset
    how = (
        f"derived: {p.gpu.memory_gb:g} GB x {p.mem_fraction_static:g} - {p.model.weight_gb:g} GB "
        f"weights, {p.kv_bytes_per_token // 1024} KiB/token; override with --kv-budget"
        if plan.kv_budget_derived
        else "from --kv-budget"
    )
    return f"KV budget {plan.kv_budget_tokens:,} tokens ({how})"


def workload_title(name: str, params: Mapping[str, Any]) -> str:
    """A workload as a person names it: a trace file by its path."""
    return str(params["file"]) if name == "trace" and "file" in params else name


def arrivals_line(plan: RunPlan) -> str:
    """How tasks arrive: Poisson at a rate, or a trace file's recorded times (rescaled)."""
    scale = plan.workload.params.get("time_scale") if plan.workload_name == "trace" else None
    if scale is not None and plan.rate_per_s == 0:
        rate = "arrivals as recorded in the file (every task at t = 0)"
    elif scale is not None:
        how = "as recorded" if scale == 1 else f"as recorded, times x {scale:.4g}"
        rate = f"arrivals {how} (mean rate {plan.rate_per_s:.4g} tasks/s)"
    else:
        rate = f"Poisson rate {plan.rate_per_s:.4g} tasks/s"
    if plan.load is not None and plan.capacity_tps is not None:
        rate += f" (load {plan.load:g} x measured capacity {plan.capacity_tps:.4g} tasks/s)"
    title = workload_title(plan.workload_name, plan.workload_params)
    return f"workload {title}: {plan.num_tasks} tasks, seed {plan.seed}, {rate}"


def print_plan(console: Console, plan: RunPlan) -> None:
    if isinstance(plan.options, SglangOptions):
        _print_server_plan(console, plan, plan.options)
        return
    console.print(arrivals_line(plan), markup=False)
    console.print(
        f"engine {plan.engine}, preset {plan.preset.name} ({plan.preset.gpu.name}, "
        f"{plan.preset.model.name}), {budget_line(plan)}"
    )
    oracle = plan.sim.length_hint == "oracle"
    console.print(lengths_line(plan.workload_name, plan.workload.params, oracle), markup=False)
    if plan.sim.host_tier_tokens:
        console.print(f"host tier: {plan.sim.host_tier_tokens:,} tokens")
    if plan.cluster is not None:
        console.print(
            f"cluster: {plan.cluster.describe()}; each replica has its own scheduler and the "
            "KV budget above",
            markup=False,
        )
    console.print(f"schedulers: {', '.join(plan.schedulers)}")


def _print_server_plan(console: Console, plan: RunPlan, opts: SglangOptions) -> None:
    """A real server's plan: where it is and its KV budget (the server's own unless given)."""
    console.print(
        f"workload {plan.workload_name}: {plan.num_tasks} tasks, seed {plan.seed}, "
        f"Poisson rate {plan.rate_per_s:.4g} tasks/s"
    )
    where = f"endpoint {opts.endpoint}" if opts.endpoint else f"model {opts.model}"
    budget = "server default" if plan.kv_budget_derived else f"{plan.kv_budget_tokens:,} tokens"
    console.print(f"engine {plan.engine}, {where}, KV budget {budget}")
    console.print(lengths_line(plan.workload_name, plan.workload.params), markup=False)
    if plan.cluster is not None:
        console.print(f"cluster: {plan.cluster.describe()} (sglang-router 0.3.2)", markup=False)
    console.print(f"schedulers: {', '.join(plan.schedulers)}")


def print_run_table(console: Console, plan: RunPlan, cells: Sequence[CellResult]) -> None:
    title = workload_title(plan.workload_name, plan.workload_params)
    length = describe(plan.workload_name, plan.identity_workload_params)
    table = Table(title=f"{title} ({length}): JCT per scheduler", title_justify="left")
    table.add_column("scheduler")
    for _, label in RUN_COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("sim s", justify="right")
    table.add_column("wall s", justify="right")
    best = {key: min(c.summary[key] for c in cells) for key in ("mean_jct_s", "p99_jct_s")}
    for c in cells:
        row = [c.scheduler + (" (cached)" if c.cached else "")]
        for key, _ in RUN_COLUMNS:
            text = fmt_metric(key, c.summary[key])
            if key in best and len(cells) > 1 and c.summary[key] == best[key]:
                text = f"[bold]{text}[/bold]"
            row.append(text)
        row += [f"{c.sim_time_s:,.0f}", f"{c.wall_s:.1f}"]
        table.add_row(*row)
    console.print(table)
    for c in cells:
        if "per_replica" in c.extra:
            console.print(replica_line(c), markup=False)
    if any(c.cached for c in cells):
        console.print(
            "(cached): a stored run with the same identity was reused; the identity does not "
            "cover the code, so pass --force after changing a policy or the engine"
        )
    if cells:
        console.print(f"results: {cells[0].run_dir.parent.parent.parent}/")


def replica_line(c: CellResult) -> str:
    """A cluster cell's spread over its replicas: requests, busy fraction, prefix hit rate."""
    rows = c.extra["per_replica"]

    def spread(key: str, fmt: str) -> str:
        vals = sorted(v for r in rows if (v := float(r[key])) == v)  # NaN: a replica never used
        if not vals:
            return "-"
        return "/".join(fmt.format(v) for v in (vals[0], vals[len(vals) // 2], vals[-1]))

    return (
        f"{c.scheduler}: {len(rows)} replicas (min/median/max): requests "
        f"{spread('requests', '{:.0f}')}, busy {spread('busy_fraction', '{:.0%}')}, "
        f"prefix hit {spread('prefix_hit_rate', '{:.0%}')}"
    )


def print_workloads(console: Console) -> None:
    table = Table(title="workloads", title_justify="left")
    for col in ("name", "description", "default rate (tasks/s)", "why that rate"):
        table.add_column(col)
    for name in WORKLOADS:
        spec = WORKLOADS.get(name)
        rate = "the file's" if spec.defaults is not None else f"{spec.default_rate_per_s:g}"
        table.add_row(name, spec.description, rate, spec.rate_note)
    console.print(table)


def print_workload(console: Console, w: Workload) -> None:
    console.print(f"workload {w.name}  (seed {w.seed})")
    table = Table(title="agents", title_justify="left")
    table.add_column("agent")
    table.add_column("prefix tokens", justify="right")
    for a in w.agents:
        table.add_row(a.name, f"{a.prefix_tokens:,}")
    console.print(table)
    task = w.tasks[0]
    t = Table(title=f"task {task.id} ({len(task.stages)} calls)", title_justify="left")
    cols = ("stage", "agent", "kind", "deps", "prompt segments", "prompt", "output", "max new",
            "delay s")  # fmt: skip
    for col in cols:
        t.add_column(col)
    for s in task.stages:
        segs = ", ".join(f"{g.key}:{g.tokens}" for g in s.prompt)
        t.add_row(
            s.id, s.agent, s.kind, ",".join(s.deps) or "-", segs,
            f"{s.prompt_tokens:,}", f"{s.output_tokens:,}", f"{s.max_new_tokens:,}",
            f"{s.delay_s:g}",
        )  # fmt: skip
    console.print(t)
    for key, value in w.params.items():
        console.print(f"  {key} = {value}")


def print_presets(console: Console) -> None:
    table = Table(title="presets", title_justify="left")
    for col in ("name", "GPU", "model", "KV bytes/token", "derived KV budget (tokens)"):
        table.add_column(col)
    for name in preset_names():
        p = load_preset(name)
        table.add_row(
            name, p.gpu.name, p.model.name, f"{p.kv_bytes_per_token:,}",
            f"{p.derived_kv_budget_tokens:,}",
        )  # fmt: skip
    console.print(table)


def print_preset(console: Console, p: Preset) -> None:
    console.print(f"{p.name}: {p.description}")
    for section, obj in (("gpu", p.gpu), ("model", p.model), ("efficiency", p.efficiency)):
        for field in obj.__dataclass_fields__:
            console.print(f"  {section}.{field} = {getattr(obj, field)}")
    console.print(f"  serving.mem_fraction_static = {p.mem_fraction_static}")
    console.print(f"  kv_bytes_per_token = {p.kv_bytes_per_token:,}")
    console.print(f"  derived_kv_budget_tokens = {p.derived_kv_budget_tokens:,}")
