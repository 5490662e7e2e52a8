"""What verifying a stored cell costs (issue 30): for every cell of a results tree, the read the
report did before digests (run.json, every table's Parquet footer, the tasks, decisions and
calls tables) against `cell.stored.load_cell` (the same, plus every table's digest, run.json's own
and the result invariants on read), interleaved cell by cell so that the machine's load falls
on both alike; CPU seconds, least of `--repeat`.

    python benchmarks/bench_verify.py RESULTS [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from topas_bench.cell.stored import load_cell
from topas_bench.results import TABLES


def old_read(d: Path) -> None:
    json.loads((d / "run.json").read_text())
    for t in TABLES:
        pq.read_metadata(d / f"{t}.parquet")
    for t in ("tasks", "decisions", "requests"):
        pd.read_parquet(d / f"{t}.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cells = sorted(p.parent for p in args.results.rglob("run.json"))
    old, new = [], []
    for _ in range(args.repeat):
        o = n = 0.0
        for d in cells:
            t0 = time.process_time()
            old_read(d)
            t1 = time.process_time()
            load_cell(d, read=("decisions",))
            n += time.process_time() - t1
            o += t1 - t0
        old.append(o)
        new.append(n)
    extra = (min(new) - min(old)) / len(cells) * 1e3
    print(f"{len(cells)} cells: read {min(old):.2f} s, load_cell {min(new):.2f} s of CPU (least "
          f"of {args.repeat}): {extra:+.2f} ms a cell")  # fmt: skip


if __name__ == "__main__":
    main()
