"""One cell of `topas-bench run --engine sglang`: a scheduler's server, the workload, the files.

Per scheduler: start an SGLang server with the topas plugin set to that scheduler (or use
`--endpoint`), run the workload through the workflow client, write the same files as `sim`
(docs/design.md section 8). Finished tasks are journaled as they end (`partial.jsonl` in the run
directory), so a crash of the server, of the client or of this process loses nothing: the
launcher restarts a dead server (up to `max_restarts`) while the client's retries wait, and a
rerun of the same command resumes with the tasks not yet done (a resumed run starts its first
remaining task at once and keeps the others' spacing). `run.json`, written last, marks a cell
whose every task succeeded; otherwise the error names how many failed and the rerun retries them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from topas_bench.errors import TopasError
from topas_bench.results import RunIdentity, is_finished, write_run
from topas_bench.runners.engines import engine_version
from topas_bench.runners.sglang.api import RequestError, connect, served_model
from topas_bench.runners.sglang.client import (
    ClientConfig,
    RequestRecord,
    TaskRecord,
    WorkflowClient,
    prefix_lengths,
)
from topas_bench.runners.sglang.fleet import Fleet
from topas_bench.runners.sglang.launcher import (
    ServerError,
    check_server_python,
    looks_like_hub_id,
    replica_gpu_args,
    sglang_server,
)
from topas_bench.runners.sglang.prompts import PromptBuilder, server_tokenizer
from topas_bench.runners.sim.records import (
    DECISION_COLUMNS,
    REQUEST_COLUMNS,
    TASK_COLUMNS,
    TIMELINE_COLUMNS,
)
from topas_bench.workloads.lengths import lengths_line

if TYPE_CHECKING:
    from rich.console import Console

    from topas_bench.plan import CellResult, RunPlan

JOURNAL = "partial.jsonl"
SERVER_LOG = "server.log"
ROUTER_LOG = "router.log"


@dataclass(frozen=True)
class SglangOptions:
    """How `run --engine sglang` reaches its servers.

    model: the model path the launcher serves (and the `model` field of requests).
    endpoint: an existing server's base URL instead of launching one (then one scheduler).
    server_args: extra `sglang.launch_server` arguments, passed through unchanged.
    server_python: the interpreter with SGLang and topas-bench installed (default: this one).
    router_python: with `--replicas`, the interpreter with sglang-router (`make router-env`).
    """

    model: str | None = None
    endpoint: str | None = None
    server_args: tuple[str, ...] = ()
    server_python: str | None = None
    router_python: str | None = None
    served_model: str | None = None
    concurrency: int = 256
    request_timeout_s: float = 600.0
    retries: int = 4
    health_timeout_s: float = 900.0
    max_restarts: int = 2

    def __post_init__(self) -> None:
        if (self.model is None) == (self.endpoint is None):
            raise TopasError("--engine sglang needs exactly one of --model PATH or --endpoint URL")
        if self.endpoint is not None and not self.endpoint.startswith("http://"):
            raise TopasError(f"--endpoint must be an http:// URL, got {self.endpoint!r}")


def options(
    plan: RunPlan, model: str | None, endpoint: str | None, server_args: list[str],
    server_python: str | None, router_python: str | None = None,
) -> RunPlan:  # fmt: skip
    """`plan` set to run on SGLang; checks what can be checked before anything starts."""
    import dataclasses

    if plan.cluster is not None:  # N servers behind sglang-router, all started here
        from topas_bench.runners.sglang import router

        if endpoint is not None:
            raise TopasError(
                "--replicas starts the servers and sglang-router itself; it takes --model, not "
                "--endpoint"
            )
        router.check_router(plan.cluster.router)
        router.router_argv("python", 0, [], plan.cluster.router, plan.cluster.router_params)
        router_python = router.router_python(router_python)
    elif router_python is not None:
        raise TopasError("--router-python is for --replicas N (sglang-router)")
    opts = SglangOptions(model, endpoint, tuple(server_args), server_python, router_python)
    if endpoint is not None and len(plan.schedulers) != 1:
        raise TopasError(
            "--endpoint serves one scheduler (the one its server was started with); give "
            f"exactly one --scheduler, got {', '.join(plan.schedulers)}"
        )
    if plan.sim.length_hint != "none" or plan.sim.host_tier_tokens:
        raise TopasError(
            "--length-hint and --host-tier-tokens are simulator settings; a real server has "
            "neither (use SGLang's own --enable-hierarchical-cache via --sglang-arg)"
        )
    if model is not None and not Path(model).exists() and not looks_like_hub_id(model):
        raise TopasError(f"--model {model!r}: no such model directory")
    if model is not None and endpoint is None:  # we start the servers
        check_server_python(server_python or sys.executable, "--server-python")
    return dataclasses.replace(plan, sglang=opts, engine="sglang")


def identity(plan: RunPlan, scheduler: str, opts: SglangOptions) -> RunIdentity:
    engine_params: dict[str, Any] = {"model": opts.model or opts.served_model or opts.endpoint}
    if opts.server_args:
        engine_params["server_args"] = list(opts.server_args)
    if plan.cluster is not None:
        engine_params.update(plan.cluster.engine_params())
    return RunIdentity(
        workload=plan.workload_name, num_tasks=plan.num_tasks, rate_per_s=plan.rate_per_s,
        seed=plan.seed, scheduler=scheduler, preset=plan.preset.name,
        kv_budget_tokens=0 if plan.kv_budget_derived else plan.kv_budget_tokens, engine="sglang",
        engine_version=engine_version("sglang"),
        workload_params=plan.identity_workload_params,
        scheduler_params=dict(plan.scheduler_params.get(scheduler, {})),
        engine_params=engine_params,
    )  # fmt: skip


def run_cell(
    plan: RunPlan,
    scheduler: str,
    *,
    force: bool = False,
    on_task_done: Callable[[int], None] | None = None,
) -> CellResult:
    from topas_bench.plan import stored_cell, workload_digest

    opts: SglangOptions = plan.sglang
    ident = identity(plan, scheduler, opts)
    run_dir = ident.run_dir(plan.out)
    digest = workload_digest(plan.workload)
    if not force and (stored := stored_cell(scheduler, run_dir, digest)) is not None:
        return stored
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = run_dir / JOURNAL
    if force or is_finished(run_dir):  # forced, or finished on another workload sample
        journal.unlink(missing_ok=True)
        (run_dir / "run.json").unlink(missing_ok=True)
    done = _load_journal(journal)
    remaining = [t for t in plan.workload.tasks if not (t.id in done and done[t.id][0][-1])]
    fleet = None if opts.endpoint else _fleet(plan, scheduler, opts, run_dir)
    wall0 = time.monotonic()
    try:
        if fleet is not None:
            fleet.start(opts.health_timeout_s)
        base = opts.endpoint.rstrip("/") if opts.endpoint else fleet.url  # type: ignore[union-attr]
        model = opts.served_model or opts.model or _served_model(base)
        if remaining:
            asyncio.run(_drive(plan, remaining, base, model, opts, journal, fleet, on_task_done))
    finally:
        if fleet is not None:
            fleet.stop()
    done = _load_journal(journal)
    wall_s = time.monotonic() - wall0
    return _finish(plan, ident, run_dir, digest, done, fleet, wall_s, len(remaining))


def _fleet(plan: RunPlan, scheduler: str, opts: SglangOptions, run_dir: Path) -> Fleet:
    """One server (`server.log`), or N (`server-<i>.log`) behind sglang-router (`router.log`)."""
    assert opts.model is not None
    n = plan.cluster.replicas if plan.cluster is not None else 1
    logs = [SERVER_LOG] if plan.cluster is None else [f"server-{i}.log" for i in range(n)]
    workers = [
        sglang_server(
            python=opts.server_python,
            model=opts.model,
            scheduler=scheduler,
            params=plan.scheduler_params.get(scheduler, {}),
            preset=plan.preset.source or plan.preset.name,  # a preset file by its absolute path
            kv_budget_tokens=None if plan.kv_budget_derived else plan.kv_budget_tokens,
            extra=opts.server_args
            if plan.cluster is None
            else replica_gpu_args(opts.server_args, i),
            log_path=run_dir / log,
        )
        for i, log in enumerate(logs)
    ]
    if plan.cluster is None:
        return Fleet(workers)
    from topas_bench.runners.sglang.router import router_server

    assert opts.router_python is not None
    router = router_server(
        opts.router_python, [w.url for w in workers], plan.cluster.router,
        plan.cluster.router_params, run_dir / ROUTER_LOG,
    )  # fmt: skip
    return Fleet(workers, router)


def _served_model(base: str) -> str:
    async def ask() -> str:
        api = connect(base, timeout_s=10.0, retries=2)
        try:
            return await served_model(api)
        finally:
            await api.close()

    try:
        return asyncio.run(ask())
    except RequestError as e:
        raise TopasError(f"cannot reach the server at {base}: {e}") from None


async def _drive(
    plan: RunPlan, tasks: list[Any], base: str, model: str, opts: SglangOptions, journal: Path,
    fleet: Fleet | None, on_task_done: Callable[[int], None] | None,
) -> None:  # fmt: skip
    cfg = ClientConfig(
        base_url=base, model=model, concurrency=opts.concurrency,
        request_timeout_s=opts.request_timeout_s, retries=opts.retries,
    )  # fmt: skip
    api = connect(base, timeout_s=opts.request_timeout_s, retries=opts.retries)
    # sglang-router has no /tokenize: a cluster's client tokenizes at a worker
    tok_url = fleet.tokenize_url if fleet is not None else base
    tok = api if tok_url == base else connect(tok_url, timeout_s=60.0, retries=opts.retries)
    try:
        await _drive_with(plan, tasks, base, cfg, api, tok, opts, journal, fleet, on_task_done)
    finally:
        await api.close()
        if tok is not api:
            await tok.close()


async def _drive_with(
    plan: RunPlan, tasks: list[Any], base: str, cfg: ClientConfig, api: Any, tok: Any,
    opts: SglangOptions, journal: Path, fleet: Fleet | None,
    on_task_done: Callable[[int], None] | None,
) -> None:  # fmt: skip
    builder = PromptBuilder(server_tokenizer(tok, cfg.model))
    try:
        await builder.prepare()
    except RequestError as e:
        raise TopasError(f"cannot reach the server at {base}: {e}") from None
    finished = len(plan.workload.tasks) - len(tasks)
    lock = threading.Lock()

    def on_task(task: TaskRecord, reqs: list[RequestRecord]) -> None:
        nonlocal finished
        line = json.dumps({
            "task": [*task.row(), task.ok], "requests": [r.row() for r in reqs],
            "served_by": [r.served_by for r in reqs], "sent_s": [r.sent_s for r in reqs],
        })  # fmt: skip
        with lock, open(journal, "a") as f:
            f.write(line + "\n")
        finished += 1
        if on_task_done is not None:
            on_task_done(finished)

    client = WorkflowClient(cfg, builder, on_task, prefix_lengths(plan.workload), api)
    offset = min(t.arrival_s for t in tasks)
    work = asyncio.create_task(client.run(tasks, start_offset_s=offset))
    while not work.done():
        await asyncio.wait({work}, timeout=1.0)
        server = fleet.dead() if fleet is not None and not work.done() else None
        if server is not None:
            assert fleet is not None
            if server.restarts >= opts.max_restarts:
                work.cancel()
                what = "sglang-router" if server is fleet.router else "the server"
                raise ServerError(
                    f"{what} died {server.restarts + 1} times; partial results are kept "
                    f"in {journal.parent} (rerun to resume); log {server.log_path}:\n"
                    f"{server.log_tail()}"
                )
            # A server that dies again while starting is counted by the next check.
            with contextlib.suppress(ServerError):
                await asyncio.to_thread(fleet.restart, server, opts.health_timeout_s)
    await work


Journal = dict[str, tuple[list[Any], list[list[Any]], dict[str, list[Any]]]]


def _load_journal(path: Path) -> Journal:
    """task id -> (task row + ok flag, request rows, per request: the URL that served it and
    when it was sent); the latest record of a task wins."""
    out: Journal = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line cut by a crash mid-write
        n = len(rec["requests"])
        extra = {"served_by": rec.get("served_by") or [""] * n,
                 "sent_s": rec.get("sent_s") or [math.nan] * n}  # fmt: skip
        out[rec["task"][0]] = (rec["task"], rec["requests"], extra)
    return out


def _finish(
    plan: RunPlan, ident: RunIdentity, run_dir: Path, digest: str, done: Journal,
    fleet: Fleet | None, wall_s: float, attempted: int,
) -> CellResult:  # fmt: skip
    from topas_bench.analysis.metrics import RunTables, run_info
    from topas_bench.invariants import jct_floors, no_floor
    from topas_bench.plan import CellResult
    from topas_bench.unloaded import with_unloaded_jct

    ok_rows = [task[:-1] for task, _, _ in done.values() if task[-1]]
    req_rows = [tuple(r) for _, reqs, _ in done.values() for r in reqs]
    served = [u for _, _, extra in done.values() for u in extra["served_by"]]
    sent = [float(t) for _, _, extra in done.values() for t in extra["sent_s"]]
    tasks = pd.DataFrame(ok_rows, columns=TASK_COLUMNS).sort_values("arrival_s")
    requests = pd.DataFrame(req_rows, columns=REQUEST_COLUMNS)
    requests = requests.assign(served_by=served, sent_s=sent).sort_values("ready_s")
    timeline = pd.DataFrame([], columns=TIMELINE_COLUMNS)
    cluster: dict[str, Any] | None = None
    if fleet is not None and plan.cluster is not None:
        from topas_bench.runners.sglang.replicas import replica_tables

        urls = requests.pop("served_by").tolist()
        requests, tasks, timeline = replica_tables(fleet, requests, urls, tasks)
    elif fleet is not None:
        from topas_bench.runners.sglang.calibrate import timeline_from_log

        timeline = timeline_from_log(fleet.workers[0].log_text())
    if plan.cluster is None:  # the single-server layout, unchanged
        requests = requests.drop(columns="sent_s")
    requests = requests.drop(columns="served_by", errors="ignore")
    tables = {
        "requests": requests.reset_index(drop=True), "tasks": tasks.reset_index(drop=True),
        "timeline": timeline, "decisions": pd.DataFrame([], columns=DECISION_COLUMNS),
    }  # fmt: skip
    failed = len(plan.workload.tasks) - len(ok_rows)
    cached = requests["cached_tokens"].astype(float)
    counters = {
        "admitted_prompt_tokens": float(requests["prompt_tokens"][cached.notna()].sum()),
        "cached_prompt_tokens": float(cached.sum()),
        "failed_requests": float((~requests["status"].isin(["ok"])).sum()),
        "server_restarts": float(fleet.restarts if fleet is not None else 0),
        "preemptions": math.nan,  # not visible to a client
    }
    tasks = with_unloaded_jct(tasks, plan.workload, plan.preset, plan.sim)  # the cost model's
    tables["tasks"] = tasks.reset_index(drop=True)
    if fleet is not None and plan.cluster is not None:
        from topas_bench.runners.sglang.replicas import per_replica

        cluster = {
            **plan.cluster.engine_params(), "router_params": dict(plan.cluster.router_params),
            "registry_order": [fleet.replica(u) for u in fleet.order],
            "per_replica": per_replica(fleet, requests, tasks, timeline),
        }  # fmt: skip
    recorded = run_info(RunTables(tasks, requests, tables["decisions"], counters))
    summary = recorded["summary"]
    span = float(tasks["finish_s"].max()) if not tasks.empty else 0.0
    if failed:
        for name, df in tables.items():
            df.to_parquet(run_dir / f"{name}.parquet", index=False)
        first = requests[requests["status"] != "ok"]["status"].head(1).tolist()
        raise TopasError(
            f"{failed} of {len(plan.workload.tasks)} tasks failed under {ident.scheduler!r} "
            f"(first error: {first[0] if first else 'unknown'}); partial results are in "
            f"{run_dir}; rerun the same command to retry them"
        )
    info = {
        **recorded, "counters": counters, "sim_time_s": span, "wall_s": wall_s,
        "load": plan.load, "capacity_tps": plan.capacity_tps,
        "workload_digest": digest, "resumed": attempted < plan.num_tasks,
        **({"cluster": cluster} if cluster is not None else {}),
    }  # fmt: skip
    # a real server's speed is unknown: only the client's own delays bound a JCT
    write_run(run_dir, ident, tables, info, jct_floor_s=jct_floors(plan.workload, no_floor))
    extra = {"per_replica": cluster["per_replica"]} if cluster is not None else {}
    return CellResult(ident.scheduler, run_dir, summary, span, wall_s, extra=extra)


def print_plan(console: Console, plan: RunPlan) -> None:
    opts: SglangOptions = plan.sglang
    console.print(
        f"workload {plan.workload_name}: {plan.num_tasks} tasks, seed {plan.seed}, "
        f"Poisson rate {plan.rate_per_s:.4g} tasks/s"
    )
    where = f"endpoint {opts.endpoint}" if opts.endpoint else f"model {opts.model}"
    budget = "server default" if plan.kv_budget_derived else f"{plan.kv_budget_tokens:,} tokens"
    console.print(f"engine sglang, {where}, KV budget {budget}")
    console.print(lengths_line(plan.workload_name, plan.workload.params), markup=False)
    if plan.cluster is not None:
        console.print(f"cluster: {plan.cluster.describe()} (sglang-router 0.3.2)", markup=False)
    console.print(f"schedulers: {', '.join(plan.schedulers)}")
