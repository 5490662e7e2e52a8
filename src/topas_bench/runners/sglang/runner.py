"""The real server behind the harness (`run --engine sglang`): a scheduler's server, the workload.

Per scheduler: start an SGLang server with the topas plugin set to that scheduler (or use
`--endpoint`), run the workload through the workflow client, and hand the harness the same
tables as `sim` (docs/design.md section 8). Finished tasks are journaled as they end
(`partial.jsonl` in the cell's directory), so a crash of the server, of the client or of this
process loses nothing: the launcher restarts a dead server (up to `max_restarts`) while the
client's retries wait, and a rerun of the same command resumes with the tasks not yet done (a
resumed run starts its first remaining task at once and keeps the others' spacing). A cell
whose every task succeeded is written whole; otherwise the harness keeps the partial tables, the
error names how many failed and the rerun retries them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.errors import TopasError
from topas_bench.plan import Cell, CellProgress, RunPlan, Served, cell_progress
from topas_bench.runners.records import (
    DECISION_COLUMNS,
    REQUEST_COLUMNS,
    TASK_COLUMNS,
    TIMELINE_COLUMNS,
    request_row,
    task_row,
)
from topas_bench.runners.sglang.api import RequestError, connect, served_model
from topas_bench.runners.sglang.client import (
    ClientCall,
    ClientConfig,
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
from topas_bench.runners.sglang.options import SglangOptions
from topas_bench.runners.sglang.prompts import PromptBuilder, server_tokenizer
from topas_bench.runners.workflow import TaskRun
from topas_bench.spec import RunSpec

JOURNAL = "partial.jsonl"
SERVER_LOG = "server.log"
ROUTER_LOG = "router.log"


class SglangServer:
    """`plan.Server` for real SGLang servers: one scheduler's server (or fleet) per cell."""

    def prepare(self, spec: RunSpec) -> RunSpec:
        """What can be checked before anything starts: sglang-router and its interpreter for
        a cluster, the model directory, the server's interpreter."""
        opts = spec.engine
        assert isinstance(opts, SglangOptions)
        if spec.cluster is not None:  # N servers behind sglang-router, all started here
            from topas_bench.runners.sglang import router

            router.check_router(spec.cluster.router)
            router.router_argv("python", 0, [], spec.cluster.router, spec.cluster.router_params)
            opts = replace(opts, router_python=router.router_python(opts.router_python))
        model = opts.model
        if model is not None and not Path(model).exists() and not looks_like_hub_id(model):
            raise TopasError(f"--model {model!r}: no such model directory")
        if model is not None and opts.endpoint is None:  # we start the servers
            check_server_python(opts.server_python or sys.executable, "--server-python")
        return replace(spec, engine=opts)

    def serve(
        self, plan: RunPlan, cells: Sequence[Cell], progress: CellProgress | None
    ) -> Iterator[Served]:
        for i, cell in enumerate(cells):
            yield _serve(plan, cell, cell_progress(progress, i))


SERVER = SglangServer()


def _serve(plan: RunPlan, cell: Cell, on_task_done: Callable[[int], None] | None) -> Served:
    opts = plan.options
    assert isinstance(opts, SglangOptions)
    run_dir = cell.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = run_dir / JOURNAL
    if cell.fresh:  # forced, or finished on another workload sample
        journal.unlink(missing_ok=True)
        (run_dir / "run.json").unlink(missing_ok=True)
    done = _load_journal(journal)
    remaining = [t for t in plan.workload.tasks if not (t.id in done and done[t.id][0][-1])]
    fleet = None if opts.endpoint else _fleet(plan, cell, opts, run_dir)
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
    return _served(plan, cell, done, fleet, wall_s, len(remaining))


def _fleet(plan: RunPlan, cell: Cell, opts: SglangOptions, run_dir: Path) -> Fleet:
    """One server (`server.log`), or N (`server-<i>.log`) behind sglang-router (`router.log`)."""
    assert opts.model is not None
    n = plan.cluster.replicas if plan.cluster is not None else 1
    logs = [SERVER_LOG] if plan.cluster is None else [f"server-{i}.log" for i in range(n)]
    workers = [
        sglang_server(
            python=opts.server_python,
            model=opts.model,
            scheduler=cell.scheduler,
            params=cell.params,
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

    def on_task(run: TaskRun, calls: list[ClientCall], ok: bool) -> None:
        nonlocal finished
        line = json.dumps({
            "task": [*task_row(run), ok], "requests": [request_row(c, c.status) for c in calls],
            "served_by": [c.served_by for c in calls], "sent_s": [c.attempt_s for c in calls],
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


def _served(
    plan: RunPlan, cell: Cell, done: Journal, fleet: Fleet | None, wall_s: float, attempted: int
) -> Served:
    """The cell's tables from the journal: a cluster's with a `replica` column, the timeline
    from the server's log (none with `--endpoint`); `failed` when a task did not succeed."""
    ok_rows = [task[:-1] for task, _, _ in done.values() if task[-1]]
    req_rows = [tuple(r) for _, reqs, _ in done.values() for r in reqs]
    served = [u for _, _, extra in done.values() for u in extra["served_by"]]
    sent = [float(t) for _, _, extra in done.values() for t in extra["sent_s"]]
    tasks = pd.DataFrame(ok_rows, columns=TASK_COLUMNS).sort_values("arrival_s")
    requests = pd.DataFrame(req_rows, columns=REQUEST_COLUMNS)
    requests = requests.assign(served_by=served, sent_s=sent).sort_values("ready_s")
    timeline = pd.DataFrame([], columns=TIMELINE_COLUMNS)
    cluster: dict[str, Any] = {}
    if fleet is not None and plan.cluster is not None:
        from topas_bench.runners.sglang.replicas import per_replica, replica_tables

        urls = requests.pop("served_by").tolist()
        requests, tasks, timeline = replica_tables(fleet, requests, urls, tasks)
        cluster = {
            **plan.cluster.engine_params(), "router_params": dict(plan.cluster.router_params),
            "registry_order": [fleet.replica(u) for u in fleet.order],
            "per_replica": per_replica(fleet, requests, tasks, timeline),
        }  # fmt: skip
    elif fleet is not None:
        from topas_bench.runners.sglang.calibrate import timeline_from_log

        timeline = timeline_from_log(fleet.workers[0].log_text())
    if plan.cluster is None:  # the single-server layout, unchanged
        requests = requests.drop(columns="sent_s")
    requests = requests.drop(columns="served_by", errors="ignore")
    tables = {
        "requests": requests.reset_index(drop=True), "tasks": tasks, "timeline": timeline,
        "decisions": pd.DataFrame([], columns=DECISION_COLUMNS),
    }  # fmt: skip
    cached = requests["cached_tokens"].astype(float)
    counters = {
        "admitted_prompt_tokens": float(requests["prompt_tokens"][cached.notna()].sum()),
        "cached_prompt_tokens": float(cached.sum()),
        "failed_requests": float((~requests["status"].isin(["ok"])).sum()),
        "server_restarts": float(fleet.restarts if fleet is not None else 0),
        "preemptions": math.nan,  # not visible to a client
    }
    span = float(tasks["finish_s"].max()) if not tasks.empty else 0.0
    failed = None
    if n_failed := len(plan.workload.tasks) - len(ok_rows):
        first = requests[requests["status"] != "ok"]["status"].head(1).tolist()
        failed = (
            f"{n_failed} of {len(plan.workload.tasks)} tasks failed under {cell.scheduler!r} "
            f"(first error: {first[0] if first else 'unknown'}); partial results are in "
            f"{cell.run_dir}; rerun the same command to retry them"
        )
    info = {"resumed": attempted < plan.num_tasks, **({"cluster": cluster} if cluster else {})}
    extra = {"per_replica": cluster["per_replica"]} if cluster else {}
    return Served(tables, counters, span, wall_s, info=info, extra=extra, failed=failed)
