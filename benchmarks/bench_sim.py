"""Simulator speed per workload and scheduler, and TOPAS's cost against a baseline's.

For each workload (sampled once per workload, outside the timed region) the schedulers run in
turn, `--repeats` rounds interleaved, so every ratio compares runs made on the same machine at
about the same moment. Reports medians over the rounds of: wall and CPU seconds, simulated
seconds per wall second, engine iterations (prefill iterations + decode steps) per wall second,
simulator events (iterations advanced as one) per wall second, and the policy's decisions; and
the median over rounds of each scheduler's wall time over the first scheduler's (the ratio).
`--step-by-step` adds each TOPAS-family scheduler asked at every attempt (`Simulator(stand=
False)`, the path before decisions could stand), as `NAME/step`.

    python benchmarks/bench_sim.py                      # metagpt-tl, 1000 tasks, fcfs
    python benchmarks/bench_sim.py --workload metagpt-tl --tasks 200 --scheduler lpm,topas
    python benchmarks/bench_sim.py --workload all --tasks 200 --scheduler lpm,topas --json F
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import make_policy
from topas_bench.workloads.model import Workload
from topas_bench.workloads.registry import generate

WORKLOADS = ("chain3", "dag4", "dag10-wide", "metagpt-sop", "metagpt-tl")


def run_once(workload: Workload, scheduler: str, cfg: SimConfig, preset: str) -> dict[str, float]:
    name, _, mode = scheduler.partition("/")
    policy = make_policy(name)
    sim = Simulator(workload, policy, CostModel(load_preset(preset)), cfg, stand=mode != "step")
    t0, c0 = time.perf_counter(), time.process_time()
    res = sim.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_s": res.sim_time_s,
        "speedup": res.sim_time_s / wall,
        "iterations_per_s": res.iterations / wall,
        "events_per_s": len(res.timeline) / wall,
        "decisions": float(len(res.decisions)),
        "mean_jct_s": float(res.tasks["jct_s"].mean()),
    }


def bench_workload(name: str, schedulers: list[str], args: argparse.Namespace) -> dict[str, Any]:
    preset = load_preset(args.preset)
    workload = generate(name, num_tasks=args.tasks, seed=args.seed, max_tokens=args.max_tokens)
    cfg = SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens)
    rounds = [
        {s: run_once(workload, s, cfg, args.preset) for s in schedulers}
        for _ in range(args.repeats)
    ]
    out: dict[str, Any] = {}
    first = schedulers[0]
    for s in schedulers:
        med = {k: statistics.median(r[s][k] for r in rounds) for k in rounds[0][s]}
        med["wall_ratio"] = statistics.median(r[s]["wall_s"] / r[first]["wall_s"] for r in rounds)
        med["cpu_ratio"] = statistics.median(r[s]["cpu_s"] / r[first]["cpu_s"] for r in rounds)
        out[s] = med
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="metagpt-tl", help="names, comma-separated, or all")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--scheduler", default="fcfs", help="comma-separated; ratios are to the first")
    ap.add_argument("--preset", default="a100-qwen32b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", default="cap", choices=("cap", "exact"),
                    help="the client's length setting (workloads.lengths)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--step-by-step", action="store_true", help="also TOPAS asked every attempt")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    workloads = list(WORKLOADS) if args.workload == "all" else args.workload.split(",")
    schedulers = args.scheduler.split(",")
    if args.step_by_step:
        schedulers += [f"{s}/step" for s in schedulers if s.startswith("topas")]
    results = {}
    for w in workloads:
        results[w] = cells = bench_workload(w, schedulers, args)
        for s, m in cells.items():
            print(
                f"{w}, {args.tasks} tasks, {s}, {args.preset}, {args.max_tokens} lengths: "
                f"median over {args.repeats} runs: "
                f"{m['speedup']:,.0f}x real time ({m['sim_s']:,.0f} simulated s in "
                f"{m['wall_s']:.2f} wall s, {m['cpu_s']:.2f} CPU s; {m['wall_ratio']:.2f}x "
                f"{schedulers[0]}'s wall, {m['cpu_ratio']:.2f}x its CPU), "
                f"{m['iterations_per_s']:,.0f} iterations/s, {m['events_per_s']:,.0f} events/s, "
                f"{m['decisions']:,.0f} decisions",
                flush=True,
            )
    out = {
        "benchmark": "sim_speed",
        "tasks": args.tasks,
        "schedulers": schedulers,
        "preset": args.preset,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "load_average": os.getloadavg()[0],
        "workloads": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
