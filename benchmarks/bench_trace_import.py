"""`topas-bench trace import` on a long recording (issue 13, item 3).

Builds a recorded call trace of `--calls` calls by repeating a recorded MetaGPT run
(`tests/data/metagpt/tl-2048-offline.jsonl` by default) back to back: ids, times and
`depends_on` shifted, so it reads as one long recording whose roles keep extending their
memories within each repetition. Then times the import as the CLI runs it (read, convert,
validate, write the workload trace) `--repeats` times and reports the median.

    python benchmarks/bench_trace_import.py [--calls 100000] [--repeats 3] [--json FILE]

Target: 100,000 recorded calls imported in under 30 s (it took over 5 minutes before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from topas_bench.workloads.metagpt_import import import_trace
from topas_bench.workloads.trace import dump_workload

REPO = Path(__file__).resolve().parent.parent
RECORDING = REPO / "tests" / "data" / "metagpt" / "tl-2048-offline.jsonl"


def long_recording(source: Path, calls: int) -> str:
    """`calls` calls: `source`'s run repeated back to back (ids, times, deps shifted)."""
    run = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    span = max(c["t_end"] for c in run) - min(c["t_start"] for c in run) + 1.0
    lines = []
    for k in range(-(-calls // len(run))):
        for c in run:
            if len(lines) == calls:
                break
            shift = k * len(run)
            lines.append(json.dumps(c | {
                "id": c["id"] + shift,
                "t_start": round(c["t_start"] + k * span, 4),
                "t_end": round(c["t_end"] + k * span, 4),
                "depends_on": [d + shift for d in c["depends_on"]],
            }))  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--source", type=Path, default=RECORDING)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calls.jsonl"
        path.write_text(long_recording(args.source, args.calls))
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            w = import_trace(path)
            dump_workload(w, Path(tmp) / "calls.workload.jsonl")
            times.append(time.perf_counter() - t0)
        size_mb = path.stat().st_size / 1e6
    stages = sum(len(t.stages) for t in w.tasks)
    result = {"calls": args.calls, "stages": stages, "median_s": statistics.median(times),
              "times_s": times, "recording_mb": size_mb}  # fmt: skip
    print(
        f"{args.calls:,} recorded calls ({size_mb:.1f} MB) -> {stages:,} stages: "
        f"import {result['median_s']:.2f} s (median of {args.repeats})"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
