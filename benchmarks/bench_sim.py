"""Simulator speed: metagpt-tl, 1000 tasks, fcfs, a100-qwen32b (issue: target >= 500x real time).

Reports medians over repeats of: simulated seconds per wall second, engine iterations (prefill
iterations + decode steps) per wall second, and simulator events (iterations advanced as one
event) per wall second. The workload is sampled once, outside the timed region.

    python benchmarks/bench_sim.py [--tasks 1000] [--repeats 5] [--scheduler fcfs] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import make_policy
from topas_bench.workloads.registry import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="metagpt-tl")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--scheduler", default="fcfs")
    ap.add_argument("--preset", default="a100-qwen32b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    preset = load_preset(args.preset)
    workload = generate(args.workload, num_tasks=args.tasks, seed=0)
    cfg = SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens)
    rows = []
    for _ in range(args.repeats):
        sim = Simulator(workload, make_policy(args.scheduler), CostModel(preset), cfg)
        t0 = time.perf_counter()
        res = sim.run()
        wall = time.perf_counter() - t0
        rows.append(
            {
                "wall_s": wall,
                "sim_s": res.sim_time_s,
                "speedup": res.sim_time_s / wall,
                "iterations_per_s": res.iterations / wall,
                "events_per_s": len(res.timeline) / wall,
            }
        )
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out = {
        "benchmark": "sim_speed",
        "workload": args.workload,
        "tasks": args.tasks,
        "scheduler": args.scheduler,
        "preset": args.preset,
        "kv_budget_tokens": cfg.kv_budget_tokens,
        "repeats": args.repeats,
        "median": med,
    }
    print(
        f"{args.workload}, {args.tasks} tasks, {args.scheduler}, {args.preset}: "
        f"median over {args.repeats} runs: {med['speedup']:,.0f}x real time "
        f"({med['sim_s']:,.0f} simulated s in {med['wall_s']:.2f} wall s), "
        f"{med['iterations_per_s']:,.0f} iterations/s, {med['events_per_s']:,.0f} events/s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
