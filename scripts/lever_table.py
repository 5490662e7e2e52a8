"""The table of docs/evaluation.md "Levers of TOPAS, isolated": TOPAS and its ablations
against the best other scheduler, per workload, from sweep directories.

    python scripts/lever_table.py runs/i21-eval runs/i21-eval2 --seeds 0-4 \
        --schedulers topas,topas-no-pins,topas-no-joint,topas-no-move-stall,topas-prev-score
    python scripts/lever_table.py runs/i21-eval2 --seeds 0-2 --pair topas,topas-expected-path

Reads each cell's run.json summary (mean and p99 JCT). Per workload and rate, the best other
scheduler is the one (not named topas*) with the lowest seed-averaged mean (or p99) JCT over
every seed asked; a margin is 1 - TOPAS / best, with a 95% paired bootstrap interval over the
seeds (10,000 resamples, seeded). `--pair a,b` prints b's mean JCT against a's instead.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

Cells = dict[tuple[str, str, str], dict[int, dict[str, float]]]


def load(roots: list[Path]) -> Cells:
    """(workload, rate tag, scheduler) -> seed -> {mean, p99}."""
    out: Cells = defaultdict(dict)
    for root in roots:
        for f in sorted(root.glob("*/*/*/run.json")):
            cell = f.parent.name
            m = re.search(r"-(r[0-9.e-]+)-n\d+-s(\d+)-", cell)
            if m is None:
                continue
            s = json.loads(f.read_text())["summary"]
            key = (f.parents[2].name, m.group(1), f.parents[1].name)
            out[key][int(m.group(2))] = {"mean": s["mean_jct_s"], "p99": s["p99_jct_s"]}
    return out


def values(cells: Cells, key: tuple[str, str, str], metric: str, seeds: list[int]) -> list[float]:
    got = cells.get(key, {})
    return [got[s][metric] for s in seeds] if all(s in got for s in seeds) else []


def interval(t: list[float], b: list[float]) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    ta, ba = np.array(t), np.array(b)
    idx = rng.integers(0, len(ta), (10_000, len(ta)))
    r = 100 * (1 - ta[idx].mean(1) / ba[idx].mean(1))
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("roots", type=Path, nargs="+")
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0-4"))
    ap.add_argument("--schedulers", default="topas")
    ap.add_argument("--pair", default="")
    a = ap.parse_args()
    cells = load(a.roots)
    groups = sorted({(w, r) for w, r, _ in cells})
    if a.pair:
        x, y = a.pair.split(",")
        print(f"| workload | rate | {x} mean JCT (s) | {y} | difference (per seed) |")
        print("|---|---|---:|---:|---:|")
        for w, r in groups:
            u, v = (
                values(cells, (w, r, x), "mean", a.seeds),
                values(cells, (w, r, y), "mean", a.seeds),
            )
            if u and v:
                per = ", ".join(f"{100 * (q / p - 1):+.1f}" for p, q in zip(u, v, strict=True))
                diff = 100 * (statistics.mean(v) / statistics.mean(u) - 1)
                print(f"| {w} | {r[1:]} | {statistics.mean(u):.1f} | {statistics.mean(v):.1f} "
                      f"| {diff:+.1f}% ({per}) |")  # fmt: skip
        return
    print("| workload (rate /s) | scheduler | mean JCT (s) | mean vs best other | p99 JCT (s) "
          "| p99 vs best other |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|")
    for w, r in groups:
        others = sorted(
            {s for ww, rr, s in cells if (ww, rr) == (w, r) and not s.startswith("topas")}
        )
        best = {}
        for metric in ("mean", "p99"):
            scored = [(statistics.mean(v), s) for s in others
                      if (v := values(cells, (w, r, s), metric, a.seeds))]  # fmt: skip
            if not scored:
                break
            best[metric] = min(scored)
        if len(best) < 2:
            continue
        (bm, sm), (bp, sp) = best["mean"], best["p99"]
        print(f"| {w} ({r[1:]}) | best of {len(others)} others: {sm} (mean), {sp} (p99) "
              f"| {bm:.1f} | | {bp:.1f} | |")  # fmt: skip
        for s in a.schedulers.split(","):
            m, p = (
                values(cells, (w, r, s), "mean", a.seeds),
                values(cells, (w, r, s), "p99", a.seeds),
            )
            if not m:
                print(f"| | {s} | - | | - | |")
                continue
            lo, hi = interval(m, values(cells, (w, r, sm), "mean", a.seeds))
            plo, phi = interval(p, values(cells, (w, r, sp), "p99", a.seeds))
            mm, pp = statistics.mean(m), statistics.mean(p)
            print(
                f"| | {s} | {mm:.1f} | {100 * (1 - mm / bm):+.1f}% [{lo:+.1f}, {hi:+.1f}] "
                f"| {pp:.1f} | {100 * (1 - pp / bp):+.1f}% [{plo:+.1f}, {phi:+.1f}] |"
            )


if __name__ == "__main__":
    main()
