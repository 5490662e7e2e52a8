"""How fast `workloads validate` checks a big trace, and in how much memory (issue 24).

Writes a trace of `--tasks` tasks of `--workload` (default dag4, 300,000 tasks: 1.2 million
calls, about 215 MB; written once, streamed, under --dir, never committed) and runs `topas-bench
workloads validate FILE` on it `--repeat` times, each in a fresh process under `/usr/bin/time`
for its peak RSS. Reports calls per second (median of the runs) and peak memory, and the same
for `run -n 1000 -s fcfs` on the file (`--run`), which reads only its first 1,000 tasks in full.
The target: at least 20,000 calls/s (1 million calls in under a minute), memory that does not
grow with the tasks (the baseline is the interpreter with the CLI's imports).

    python benchmarks/bench_validate.py [--tasks 300000] [--workload dag4] [--repeat 3] [--run]
        [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import dumps_workload

CHUNK = 20_000  # tasks generated at a time (the writer holds one chunk)


def write_trace(path: Path, workload: str, tasks: int) -> int:
    """A valid trace of `tasks` tasks, written a chunk at a time; the number of calls."""
    calls = 0
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, tasks, CHUNK):
            n = min(CHUNK, tasks - start)
            w = generate(workload, num_tasks=n, seed=start // CHUNK)
            lines = dumps_workload(w).splitlines()
            if start == 0:
                f.write(lines[0] + "\n")
            for line in lines[1:]:  # fresh ids and keys per chunk, arrivals shifted on
                row = json.loads(line)
                old = row["id"]
                row["id"] = f"c{start // CHUNK}-{old}"
                row["arrival_s"] += start * 20.0
                text = json.dumps(row, separators=(",", ":")).replace(f'"{old}/', f'"{row["id"]}/')
                f.write(text + "\n")
                calls += len(row["stages"])
    return calls


def timed(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in KB) of a fresh `topas-bench` process. CPU time
    is what an idle core would take: the wall time counts the other jobs of a shared machine."""
    exe = str(Path(sys.executable).with_name("topas-bench"))
    start = time.perf_counter()
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%M %U %S", exe, *args], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {out.stderr.strip()[-500:]}")
    rss, user, system = out.stderr.strip().splitlines()[-1].split()
    return seconds, float(user) + float(system), int(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=300_000)
    ap.add_argument("--workload", default="dag4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--run", action="store_true", help="also time `run -n 1000` on the file")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--keep", action="store_true", help="keep the trace, and reuse a kept one")
    args = ap.parse_args()
    path = args.dir / f"bench-validate-{args.workload}-{args.tasks}.jsonl"
    started = time.perf_counter()
    if args.keep and path.exists():
        calls = sum(line.count('"output_tokens"') for line in path.open(encoding="utf-8"))
    else:
        calls = write_trace(path, args.workload, args.tasks)
    size = path.stat().st_size / 1e6
    print(f"{path}: {args.tasks:,} tasks, {calls:,} calls, {size:.0f} MB "
          f"(written in {time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    base = timed(["workloads", "validate", "docs/examples/writer-reviewer.jsonl"])[2]
    runs = [timed(["workloads", "validate", str(path)]) for _ in range(args.repeat)]
    wall = statistics.median(w for w, _, _ in runs)
    cpu = statistics.median(c for _, c, _ in runs)
    peak = max(m for *_, m in runs)
    each = ", ".join(f"{w:.1f}" for w, _, _ in runs)
    print(
        f"validate: median {wall:.1f} s wall of {args.repeat} ({each}): {calls / wall:,.0f} "
        f"calls/s; median {cpu:.1f} s CPU: {calls / cpu:,.0f} calls/CPU-s; peak RSS "
        f"{peak / 1024:.0f} MB (the CLI alone: {base / 1024:.0f} MB); load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    if args.run:
        with tempfile.TemporaryDirectory() as out:
            w, c, m = timed(["run", "-w", str(path), "-n", "1000", "-s", "fcfs", "--out", out])
        print(f"run -n 1000 -s fcfs: {w:.1f} s wall, {c:.1f} s CPU, peak RSS {m / 1024:.0f} MB")
    if not args.keep:
        path.unlink()


if __name__ == "__main__":
    main()
