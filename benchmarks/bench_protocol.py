"""What the evaluation protocol's run costs: the paper-regime sweep (every scheduler, its tuned
forms, the five workloads, ten seeds) timed end to end, as a user runs it (issue 29, part 7:
at most 45 minutes of wall time on the 2-core machine with `-j 2`).

    python benchmarks/bench_protocol.py --json results/bench/protocol.json
    python benchmarks/bench_protocol.py --config results/paper-regime.toml -j 2 --keep runs/pr

Runs `topas-bench sweep --config CONFIG --out OUT -j J --compact` into a fresh directory (a
temporary one unless --keep), then reads every cell's run.json: the cells' own wall seconds
summed per scheduler family (TOPAS and its variants, the rest), and per workload the median
over seeds of a TOPAS cell's wall time over an LPM cell's. A capacity cache (`capacity.json`)
given with --capacity is copied in first, so that the probes can be left out of a measurement
(say so when quoting it). Wall times are the machine's: quote them with the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TARGET_S = 45 * 60


def cells(out: Path) -> list[dict[str, Any]]:
    found = []
    for f in sorted(out.glob("*/*/*/run.json")):
        meta = json.loads(f.read_text())
        ident = meta["identity"]
        found.append({"workload": ident["workload"], "scheduler": ident["scheduler"],
                      "params": bool(ident.get("scheduler_params")), "seed": ident["seed"],
                      "wall_s": float(meta.get("wall_s") or 0.0)})  # fmt: skip
    return found


def summarize(found: list[dict[str, Any]], wall_s: float, jobs: int) -> dict[str, Any]:
    family: dict[str, float] = defaultdict(float)
    per: dict[tuple[str, str, int], float] = {}
    for c in found:
        family["topas" if c["scheduler"].startswith("topas") else "others"] += c["wall_s"]
        if not c["params"]:
            per[(c["workload"], c["scheduler"], c["seed"])] = c["wall_s"]
    ratios = {}
    for w in sorted({c["workload"] for c in found}):
        seeds = [s for (ww, name, s) in per if ww == w and name == "topas"]
        r = [per[(w, "topas", s)] / per[(w, "lpm", s)] for s in seeds
             if per.get((w, "lpm", s), 0.0) > 0]  # fmt: skip
        if r:
            ratios[w] = statistics.median(r)
    return {
        "wall_s": wall_s, "jobs": jobs, "cells": len(found),
        "cell_wall_s_by_family": dict(family), "topas_over_lpm_cell": ratios,
        "target_s": TARGET_S, "met": wall_s <= TARGET_S, "cpus": os.cpu_count(),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", type=Path, default=Path("results/paper-regime.toml"))
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="run into this directory and keep it")
    ap.add_argument("--capacity", type=Path, help="a capacity.json to start from (no probes)")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    a = ap.parse_args()
    tmp = None if a.keep else Path(tempfile.mkdtemp(prefix="bench-protocol-"))
    out = a.keep or (tmp / "runs")  # type: ignore[operator]
    try:
        if a.capacity:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(a.capacity, out / "capacity.json")
        exe = Path(sys.executable).with_name("topas-bench")
        cmd = [str(exe), "sweep", "--config", str(a.config), "--out", str(out), "-j",
               str(a.jobs), "--compact"]  # fmt: skip
        t0 = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            print(f"error: {' '.join(cmd)} exited {done.returncode}", file=sys.stderr)
            return 1
        result = summarize(cells(out), wall, a.jobs)
        result |= {"config": str(a.config), "capacity_given": a.capacity is not None,
                   "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result, indent=2))
    verdict = "met" if result["met"] else "MISSED"
    print(f"{result['cells']} cells in {wall / 60:.1f} min with -j {a.jobs}: the 45-minute "
          f"target {verdict}", file=sys.stderr)  # fmt: skip
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
