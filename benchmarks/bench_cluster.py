"""Simulated cluster speed: 64 replicas x 10,000 metagpt-tl tasks (issue 15: >= 1,000x real time).

The workload arrives at the workload's default rate per replica (0.8 x one server's measured
capacity, times the replicas), so each replica is as loaded as the single server of `make run`.
Reports medians over repeats of: simulated seconds per wall second of the whole cluster
(`ClusterSim.run`, the event loop alone, timeline recorded as in a cell) by wall clock and
per CPU second of this process (the machine may be shared), simulated seconds, wall seconds,
and how the router spread the requests. The workload is sampled once, outside
the timed region.

    python benchmarks/bench_cluster.py [--replicas 64] [--tasks 10000] [--scheduler fcfs]
        [--router cache-aware] [--repeats 3] [--json FILE]
    python benchmarks/bench_cluster.py --ray --tasks 10000     # the same cell as a Ray sweep

With `--ray` the cell runs as a one-cell `topas-bench sweep` on a local Ray cluster (the
executor sweeps of such cells use), and the sweep's wall time and the cell's own are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from topas_bench.runners.cluster.routers import Cluster, make_router
from topas_bench.runners.cluster.sim import ClusterSim
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.schedulers.registry import make_policy
from topas_bench.workloads.registry import generate, run_defaults


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    preset = load_preset(args.preset)
    cost = CostModel(preset)
    cfg = SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens)
    rate = run_defaults(args.workload, {})[1] * args.replicas
    workload = generate(args.workload, num_tasks=args.tasks, rate_per_s=rate, seed=0)
    prefixes = {a.name: a.prefix_tokens for a in workload.agents}
    rows = []
    for _ in range(args.repeats):
        cluster = Cluster(args.replicas, kv_budget_tokens=cfg.kv_budget_tokens,
                          prefix_tokens=prefixes, cost=cost)  # fmt: skip
        router = make_router(args.router, cluster)
        policies = [make_policy(args.scheduler) for _ in range(args.replicas)]
        sim = ClusterSim(workload, policies, cost, cfg, router)
        cpu0 = time.process_time()
        res = sim.run()
        cpu = time.process_time() - cpu0
        rows.append({"wall_s": res.wall_s, "cpu_s": cpu, "sim_s": res.sim_time_s,
                     "speedup": res.sim_time_s / res.wall_s, "speedup_cpu": res.sim_time_s / cpu,
                     "iterations": sum(r.iterations for r in res.replicas),
                     "routed_min": min(res.routed), "routed_max": max(res.routed)})  # fmt: skip
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"benchmark": "cluster_speed", "workload": args.workload, "tasks": args.tasks,
            "replicas": args.replicas, "router": args.router, "scheduler": args.scheduler,
            "preset": args.preset, "rate_per_s": rate, "repeats": args.repeats,
            "median": med, "runs": rows}  # fmt: skip


def on_ray(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from topas_bench.sweep.run import run_sweep
    from topas_bench.sweep.spec import SweepSpec

    spec = SweepSpec(
        workloads=(args.workload,), schedulers=(args.scheduler,), num_tasks=args.tasks,
        replicas=(args.replicas,), routers=(args.router,), presets=(args.preset,),
    )  # fmt: skip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            result = run_sweep([spec], Path(out), executor="ray", address=address,
                               allow_large=True)  # fmt: skip
            wall = time.perf_counter() - t0
            if result.failed:
                raise SystemExit(f"the Ray sweep failed: {result.failed[0].error}")
            meta = json.loads(next(Path(out).rglob("run.json")).read_text())
    finally:
        ray.shutdown()
    return {"benchmark": "cluster_on_ray", "workload": args.workload, "tasks": args.tasks,
            "replicas": args.replicas, "router": args.router, "scheduler": args.scheduler,
            "sweep_wall_s": wall, "cell_wall_s": meta["wall_s"], "sim_s": meta["sim_time_s"],
            "speedup": meta["sim_time_s"] / meta["wall_s"],
            "mean_jct_s": meta["summary"]["mean_jct_s"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="metagpt-tl")
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--scheduler", default="fcfs")
    ap.add_argument("--router", default="cache-aware")
    ap.add_argument("--preset", default="a100-qwen32b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="run the cell as a sweep on local Ray")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    out = on_ray(args) if args.ray else simulate(args)
    if args.ray:
        print(
            f"{args.workload}, {args.tasks:,} tasks, {args.replicas} replicas, {args.router}, "
            f"{args.scheduler}, one cell on Ray: sweep {out['sweep_wall_s']:.1f} s wall, the "
            f"cell's simulation {out['speedup']:,.0f}x real time ({out['sim_s']:,.0f} simulated "
            f"s in {out['cell_wall_s']:.1f} s)"
        )
    else:
        m = out["median"]
        print(
            f"{args.workload}, {args.tasks:,} tasks, {args.replicas} replicas, {args.router}, "
            f"{args.scheduler}: median over {args.repeats} runs: {m['speedup']:,.0f}x real time "
            f"({m['sim_s']:,.0f} simulated s in {m['wall_s']:.1f} wall s; {m['speedup_cpu']:,.0f}x "
            f"per CPU second, {m['cpu_s']:.1f} s); requests per replica "
            f"{m['routed_min']:.0f}-{m['routed_max']:.0f}; load average {os.getloadavg()[0]:.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
