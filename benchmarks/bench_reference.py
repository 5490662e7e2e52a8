"""Reference-engine speed: one 200-task metagpt-tl cell per scheduler on `sglang-cpu` (SGLang's
own scheduler on CPU; target: at most 20 minutes per cell on a 2-core machine), beside the
simulator on the same cell.

Reports per scheduler: wall seconds of the cell (SGLang's import and scheduler construction
included), simulated seconds per wall second, engine iterations per wall second, and the same
for `sim`. Needs `make sglang-env`.

    python benchmarks/bench_reference.py [--tasks 200] [--schedulers all] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.results import read_meta
from topas_bench.runners.sglang_cpu.options import ReferenceOptions
from topas_bench.spec import RunSpec, parse_schedulers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="metagpt-tl")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--schedulers", default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    out = Path(tempfile.mkdtemp(prefix="bench-reference-"))
    spec = RunSpec(
        workload=args.workload, schedulers=parse_schedulers(args.schedulers),
        num_tasks=args.tasks, seed=args.seed, out=out,
    )  # fmt: skip
    plans = {
        "sim": plan_run(spec),
        "sglang-cpu": plan_run(replace(spec, engine=ReferenceOptions())),
    }
    plan = plans["sim"]
    rows = []
    for name in plan.schedulers:
        cells = {}
        for engine in ("sim", "sglang-cpu"):
            t0 = time.perf_counter()
            cell = run_cell(plans[engine], name, force=True)
            wall = time.perf_counter() - t0
            iterations = read_meta(cell.run_dir)["counters"]["iterations"]
            cells[engine] = {
                "wall_s": round(wall, 1),
                "sim_s_per_wall_s": round(cell.sim_time_s / wall, 1),
                "iterations_per_s": round(iterations / wall),
                "mean_jct_s": round(cell.summary["mean_jct_s"], 2),
            }
        rows.append({"scheduler": name, **cells})
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "benchmark": "reference_speed", "workload": args.workload, "tasks": args.tasks,
        "seed": args.seed, "kv_budget_tokens": plan.kv_budget_tokens, "cells": rows,
    }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
