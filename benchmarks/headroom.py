"""Where JCT goes: queueing vs running, per workload and scheduler, from result files.

A scheduler of one server controls two things: how long calls wait in the queue, and how the
running batch is composed (which stretches every call's run time: bigger batches read more KV
per decode step, and every admission's prefill pauses all decoding). For each workload at one
load, this prints, averaged over the runs' seeds, per task: mean JCT, the time its calls spent
queued (sent -> first admitted), the time they spent admitted (first admitted -> finished,
including preemptions), and the same tasks' JCT when served one at a time (no contention at
all: a floor no scheduler reaches at that load).

    python benchmarks/headroom.py runs/eval [--load 0.8] [--schedulers parrot,lpm,spf,topas]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import make_policy
from topas_bench.workloads.registry import generate


def solo_jct(workload: str, tasks: int, seed: int) -> float:
    preset = load_preset("a100-qwen32b")
    cfg = SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens, record_timeline=False)
    w = generate(workload, num_tasks=tasks, rate_per_s=1e-9, seed=seed)
    return float(Simulator(w, make_policy("fcfs"), CostModel(preset), cfg).run().tasks.jct_s.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--schedulers", default="fcfs,lpm,spf,parrot,autellix,topas")
    args = ap.parse_args()
    wanted = args.schedulers.split(",")
    cells: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    seeds: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for meta_path in sorted(args.results.glob("*/*/*/run.json")):
        meta = json.loads(meta_path.read_text())
        ident = meta["identity"]
        if meta.get("load") != args.load or ident["scheduler"] not in wanted:
            continue
        req = pd.read_parquet(meta_path.parent / "requests.parquet")
        per_task = (
            req.assign(
                wait=req.first_admitted_s - req.ready_s, run=req.finish_s - req.first_admitted_s
            )
            .groupby("task_id")[["wait", "run"]]
            .sum()
        )
        jct = float(pd.read_parquet(meta_path.parent / "tasks.parquet").jct_s.mean())
        key = (ident["workload"], ident["scheduler"])
        cells[key].append((jct, float(per_task.wait.mean()), float(per_task.run.mean())))
        seeds[ident["workload"]].add((ident["seed"], ident["num_tasks"]))
    print("| workload | scheduler | mean JCT s | queued s / task | admitted s / task | "
          "served alone s |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for workload in sorted(seeds):
        alone = statistics.mean(solo_jct(workload, n, s) for s, n in sorted(seeds[workload]))
        for sched in wanted:
            rows = cells.get((workload, sched))
            if not rows:
                continue
            jct, wait, run = (statistics.mean(x) for x in zip(*rows, strict=True))
            print(f"| {workload} | {sched} | {jct:.1f} | {wait:.1f} | {run:.1f} | {alone:.1f} |")


if __name__ == "__main__":
    main()
