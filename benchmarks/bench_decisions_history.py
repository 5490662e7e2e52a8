"""Decision latency across revisions: is a slower decision the code's or the machine's?

Checks each revision out into a temporary git worktree and runs that revision's own
`benchmarks/bench_decisions.py` (its source first on `PYTHONPATH`, this interpreter and its
packages) on one cell, in interleaved rounds (every revision once per round), so that a change of
machine or of load hits every revision alike. Prints each revision's medians and p99s per round
and the median of its medians.

    python benchmarks/bench_decisions_history.py c8ffb79 HEAD [--rounds 3] [--waiting 256]
        [--agents 10] [--repeats 100] [--scheduler topas] [--json FILE]

Pin it to one core on a shared machine (`taskset -c 1 python ...`). The revisions must have
`benchmarks/bench_decisions.py` with `--json` (2026-12-02 on).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def run_once(tree: Path, args: argparse.Namespace, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [
        sys.executable, "benchmarks/bench_decisions.py", "--scheduler", args.scheduler,
        "--waiting", str(args.waiting), "--agents", str(args.agents),
        "--repeats", str(args.repeats), "--json", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True)
    cell = json.loads(out.read_text())["cells"][0]
    return {"median_ms": cell["median_ms"], "p99_ms": cell["p99_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("revisions", nargs="+", help="git revisions (commits, tags, HEAD)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--waiting", type=int, default=256)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--scheduler", default="topas")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        shas = [git("rev-parse", "--short", rev) for rev in args.revisions]
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"error: not a revision of this repository: {e.stderr.strip()}") from None
    rows: dict[str, list[dict[str, float]]] = {sha: [] for sha in shas}
    with tempfile.TemporaryDirectory(prefix="decision-history-") as tmp:
        trees = {sha: Path(tmp) / sha for sha in shas}
        try:
            for sha, tree in trees.items():
                git("worktree", "add", "--detach", "--quiet", str(tree), sha)
            for rnd in range(1, args.rounds + 1):
                for sha, tree in trees.items():
                    cell = run_once(tree, args, Path(tmp) / f"{sha}-{rnd}.json")
                    rows[sha].append(cell)
                    print(f"round {rnd} {sha}: median {cell['median_ms']:.3f} ms, "
                          f"p99 {cell['p99_ms']:.3f} ms", flush=True)  # fmt: skip
        finally:
            for tree in trees.values():
                if tree.exists():
                    git("worktree", "remove", "--force", str(tree))
    print(f"\n{'revision':>10} {'median of medians':>18} {'medians':>24}")
    summary = []
    for sha, cells in rows.items():
        meds = [c["median_ms"] for c in cells]
        print(f"{sha:>10} {statistics.median(meds):>18.3f} "
              f"{' '.join(f'{m:.3f}' for m in meds):>24}")  # fmt: skip
        summary.append({"revision": sha, "median_of_medians_ms": statistics.median(meds),
                        "rounds": cells})  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"scheduler": args.scheduler, "waiting": args.waiting, "agents": args.agents,
               "repeats": args.repeats, "load_average": os.getloadavg()[0],
               "revisions": summary}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
