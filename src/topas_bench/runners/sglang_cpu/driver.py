"""Entry point of the reference engine inside the SGLang venv:
``python -m topas_bench.runners.sglang_cpu.driver JOB.json``.

The job (`job.Job`, written by `engine.ReferenceServer.serve`) names a workload trace, a
cost-model preset, the server settings and the cells to run (one scheduler each). Per cell the
driver constructs SGLang's `Scheduler` (SGLang's own FCFS or LPM policy, or our plugin's
subclass for every other scheduler), serves the workload on the virtual clock
(`loop.ReferenceLoop`) and writes the record tables as Parquet plus `counters.json` into the
cell's folder. Progress goes to stdout as JSON lines (`{"cell": i, "tasks_done": n}`), errors
to stderr with exit code 1.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topas_bench.runners.sglang_cpu.job import Cell, Job, ServerSettings
from topas_bench.workloads.model import Workload

if TYPE_CHECKING:  # SGLang is imported only after `_env` has set its environment
    from topas_bench.runners.sglang_cpu.loop import ReferenceLoop

PROGRESS_EVERY_S = 1.0


def set_env(s: ServerSettings) -> None:
    """SGLang reads these once, at import (`schedule_policy.CLIP_MAX_NEW_TOKENS`) or through
    `envs` (the `new_token_ratio` tracker, retraction): set them before importing SGLang."""
    os.environ["SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"] = str(s.clip_max_new_tokens)
    os.environ["SGLANG_INIT_NEW_TOKEN_RATIO"] = repr(s.init_new_token_ratio)
    os.environ["SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR"] = repr(s.min_new_token_ratio_factor)
    os.environ["SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"] = str(s.new_token_ratio_decay_steps)
    os.environ["SGLANG_RETRACT_DECODE_STEPS"] = str(s.retract_decode_steps)
    os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", s.tree_core)


def reference_loop(
    workload: Workload,
    scheduler: str,
    params: dict[str, Any],
    preset: str,
    server: ServerSettings,
    model_path: Path,
    *,
    on_task_done: Callable[[int], None] | None = None,
) -> ReferenceLoop:
    """SGLang's scheduler for `scheduler` (its own policy, or the plugin's subclass), wired
    into a virtual-clock loop over `workload`, ready to `run()`."""
    from sglang.srt.managers.scheduler import Scheduler  # type: ignore[import-not-found]

    from topas_bench.runners.sglang.adapter import make_scheduler_class
    from topas_bench.runners.sglang_cpu.fakes import build_scheduler
    from topas_bench.runners.sglang_cpu.loop import Clock, ReferenceLoop
    from topas_bench.runners.sglang_cpu.tokens import TokenIds
    from topas_bench.runners.sim.cost import CostModel, load_preset
    from topas_bench.schedulers.estimator import ServiceEstimator
    from topas_bench.schedulers.registry import make_policy

    cost = CostModel(load_preset(preset))
    clock = Clock()
    needs = make_policy(scheduler, **params).needs
    loop = ReferenceLoop(
        workload, TokenIds.of(workload), cost, clock,
        record_timeline=server.record_timeline, on_task_done=on_task_done,
        routing_key=needs.schedule_policy == "routing-key",
    )  # fmt: skip
    # SGLang's own policies (their parameters within what SGLang expresses) run as SGLang's
    # `SchedulePolicy`, every other scheduler through our plugin.
    base: type = Scheduler
    if not needs.native:
        base = make_scheduler_class(
            lambda: make_policy(scheduler, **params),
            lambda: ServiceEstimator(cost),
            clock=clock, unix_clock=clock,
            on_decision=loop.decision,
        )  # fmt: skip
    server_args: dict[str, Any] = {
        "model_path": str(model_path),
        "context_length": server.context_length,
        "max_running_requests": server.max_running_requests,
        "chunked_prefill_size": server.chunked_prefill_size,
        "max_prefill_tokens": server.max_prefill_tokens,
        "schedule_policy": needs.schedule_policy if needs.native else "fcfs",
        "radix_eviction_policy": needs.eviction,
        "radix_eviction_policy_config": needs.eviction_config_dict or None,
    }
    from sglang.srt.environ import envs  # type: ignore[import-not-found]

    # a policy that sets node priorities needs SGLang's Python tree core (`Bridge`)
    core = needs.tree_core or server.tree_core
    with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override(core):
        loop.sched = build_scheduler(
            base, server_args, kv_tokens=server.kv_budget_tokens,
            max_reqs=server.max_running_requests, script=loop.script,
            on_requeue=loop.on_requeue,
        )  # fmt: skip
    if needs.native and needs.schedule_policy == "random":
        # SGLang shuffles with the global generator: seed it as the simulator seeds its own.
        random.seed(needs.seed)
    return loop


def run_cell(job: Job, index: int, cell: Cell, model_path: Path) -> None:
    from topas_bench.workloads.trace import load_workload

    workload = load_workload(job.trace)
    last = [0.0]

    def progress(done: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or done == len(workload.tasks):
            last[0] = now
            print(json.dumps({"cell": index, "tasks_done": done}), flush=True)

    loop = reference_loop(
        workload, cell.scheduler, cell.params, job.preset, job.server, model_path,
        on_task_done=progress,
    )  # fmt: skip
    wall0 = time.perf_counter()
    tables = loop.run()
    wall = time.perf_counter() - wall0
    out = Path(cell.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.to_parquet(out / f"{name}.parquet", index=False)
    counters = {
        "preemptions": loop.rec.preemptions,
        "admitted_prompt_tokens": loop.rec.prompt_tokens,
        "cached_prompt_tokens": loop.rec.hit_tokens,
        "iterations": loop.rec.iterations,
    }
    info = {"counters": counters, "sim_time_s": loop.clock.now, "wall_s": wall}
    (out / "counters.json").write_text(json.dumps(info, indent=2) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m topas_bench.runners.sglang_cpu.driver JOB.json", file=sys.stderr)
        return 2
    job = Job.read(Path(argv[0]))
    set_env(job.server)
    warnings.filterwarnings("ignore")
    import logging

    logging.basicConfig(level=logging.ERROR)
    from topas_bench.runners.sglang_cpu.fakes import model_dir
    from topas_bench.runners.sglang_cpu.tokens import TokenIds
    from topas_bench.workloads.trace import load_workload

    vocab = TokenIds.of(load_workload(job.trace)).vocab_size
    path = model_dir(vocab, job.server.context_length)
    for i, cell in enumerate(job.cells):
        run_cell(job, i, cell, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
