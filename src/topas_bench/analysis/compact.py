"""What the site draws from runs, kept small enough to commit beside a report (issue 33).

A report directory (`topas-bench report RUNS --out DIR`) holds the rows and verdicts of its
runs, not the runs. Two figures need more than the rows: the JCT distribution and the
mechanism timeline. This module reduces both to compact tables, written beside the report
when the runs are at hand and read back by the site, so that a clean clone redraws every
figure without the runs:

- `cdf.csv.gz`: per workload's main setting and scheduler, the JCT quantiles of the tasks of
  every seed pooled (`QUANTILES`: 0, 1%, ..., 100%);
- `timeline.csv.gz`: per workload's main setting, TOPAS, the strongest other scheduler and
  the best of the paper's baselines over one run (the setting's first seed), as series over
  the whole run on `POINTS` evenly spaced times: tasks in the system, calls waiting for
  admission, KV tokens in use (duration-weighted means per bin), preemptions so far and, per
  agent, the share of each bin its prefix was resident (`timeline`'s definitions).

Both are pure functions of the runs: the same runs give byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from topas_bench.analysis.collect import Collection
from topas_bench.analysis.figures import main_groups
from topas_bench.analysis.timeline import binned, in_system, residency, resident_agents_of
from topas_bench.errors import TopasError
from topas_bench.results import read_table

CDF_FILE = "cdf.csv.gz"
TIMELINE_FILE = "timeline.csv.gz"
QUANTILES = np.round(np.linspace(0.0, 1.0, 101), 2)
#: Points (bins) of each timeline series over the whole run; residency strips use half.
POINTS = 400
KEY = ["workload", "group_label", "scheduler"]
_GZ = {"method": "gzip", "mtime": 0}


def _seeds(r: pd.Series) -> set[int]:
    return {int(s) for s in str(r["seeds"]).split(",") if s != ""}


def cdf_table(coll: Collection, rows: pd.DataFrame) -> pd.DataFrame:
    """JCT quantiles per (main setting, scheduler) of `rows` (report rows with `group`)."""
    out: list[pd.DataFrame] = []
    runs = coll.runs
    for _, r in main_groups(rows).iterrows():
        pick = runs[(runs["group"] == r["group"]) & (runs["scheduler"] == r["scheduler"])
                    & runs["seed"].isin(_seeds(r))]  # fmt: skip
        arrays = [coll.jct[p] for p in pick["path"] if p in coll.jct]
        if not arrays:
            continue
        jct = np.concatenate(arrays)
        out.append(pd.DataFrame({
            "workload": r["workload"], "group_label": r["group_label"],
            "scheduler": r["scheduler"], "q": QUANTILES,
            "jct_s": np.quantile(jct, QUANTILES),
        }))  # fmt: skip
    return _six(pd.concat(out, ignore_index=True)) if out else pd.DataFrame()


def _six(table: pd.DataFrame) -> pd.DataFrame:
    """Floats to six significant digits, as the files keep them: a table computed from the
    runs and one read back from its file are equal, so the site draws the same either way."""
    for col in ("jct_s", "t_s", "value"):
        if col in table:
            table[col] = [float(f"{v:.6g}") for v in table[col]]
    return table


def timeline_shown(g: pd.DataFrame) -> list[str]:
    """TOPAS, the strongest other scheduler and the best paper baseline of one setting's rows
    (by mean JCT), without repeats; [] without TOPAS or anything to set against it."""
    present = list(g["scheduler"])
    if "topas" not in present:
        return []
    first = g.iloc[0]
    wanted = [first.get("best_any_mean"), first.get("best_baseline_mean")]
    others = [s for s in dict.fromkeys(wanted) if isinstance(s, str) and s in present]
    others = [s for s in others if s != "topas"]
    return ["topas", *others] if others else []


def _series(
    name: str, times: np.ndarray, values: np.ndarray, base: dict[str, object]
) -> pd.DataFrame:
    return pd.DataFrame({**base, "series": name, "t_s": times, "value": values})


def timeline_table(coll: Collection, rows: pd.DataFrame) -> pd.DataFrame:
    """The timeline series of each workload's main setting (module docstring); empty when the
    runs hold no timelines."""
    out: list[pd.DataFrame] = []
    runs = coll.runs
    main = main_groups(rows)
    for group, g in main.groupby("group", sort=False):
        shown = timeline_shown(g)
        if not shown:
            continue
        seed = min(_seeds(g.iloc[0]))
        data = {}
        for s in shown:
            pick = runs[(runs["group"] == group) & (runs["scheduler"] == s)
                        & (runs["seed"] == seed)]  # fmt: skip
            if pick.empty:
                break
            path = Path(pick["path"].iloc[0])
            data[s] = {t: read_table(path, t) for t in ("timeline", "tasks", "decisions")}
        if len(data) < len(shown) or any(d["timeline"].empty for d in data.values()):
            continue
        start = min(float(d["tasks"]["arrival_s"].min()) for d in data.values())
        end = max(float(d["tasks"]["finish_s"].max()) for d in data.values())
        edges = np.linspace(start, end, POINTS + 1)
        mids = (edges[:-1] + edges[1:]) / 2
        coarse = np.linspace(start, end, POINTS // 2 + 1)
        coarse_mids = (coarse[:-1] + coarse[1:]) / 2
        agents = sorted({a for d in data.values() for a in resident_agents_of(d["timeline"])})
        first = g.iloc[0]
        for s in shown:
            tl, tasks, dec = data[s]["timeline"], data[s]["tasks"], data[s]["decisions"]
            base: dict[str, object] = {"workload": first["workload"],
                                       "group_label": first["group_label"], "scheduler": s,
                                       "seed": seed}  # fmt: skip
            t_dec = dec["t_s"].to_numpy(dtype=float) if not dec.empty else np.array([])
            n_dec = np.cumsum(dec["preempt"].to_numpy(dtype=float)) if not dec.empty else t_dec
            at = np.searchsorted(t_dec, mids, "right")
            preempted = np.concatenate([[0.0], n_dec])[at]
            out += [
                _series("in_system", mids, in_system(tasks, mids).astype(float), base),
                _series("waiting", mids, binned(tl, tl["waiting"].to_numpy(dtype=float),
                                                  edges, state=True), base),
                _series("kv_used_tokens", mids, binned(
                    tl, tl["kv_used_tokens"].to_numpy(dtype=float), edges, state=False), base),
                _series("preemptions", mids, preempted, base),
            ]  # fmt: skip
            res = residency(tl, agents, coarse)
            out += [_series(f"resident:{a}", coarse_mids, res[i], base)
                    for i, a in enumerate(agents)]  # fmt: skip
    return _six(pd.concat(out, ignore_index=True)) if out else pd.DataFrame()


def write_compact(coll: Collection, rows: pd.DataFrame, out: Path) -> list[Path]:
    """`cdf.csv.gz` and `timeline.csv.gz` of `coll` into `out` (a table the runs cannot give
    is not written, and a stale one removed)."""
    written = []
    for name, table in ((CDF_FILE, cdf_table(coll, rows)),
                        (TIMELINE_FILE, timeline_table(coll, rows))):  # fmt: skip
        path = out / name
        if table.empty:
            path.unlink(missing_ok=True)
            continue
        table.to_csv(path, index=False, float_format="%.6g", compression=_GZ)
        written.append(path)
    return written


def read_compact(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A report directory's CDF and timeline tables, each empty where it has none."""
    out = []
    for name in (CDF_FILE, TIMELINE_FILE):
        f = path / name
        try:
            out.append(pd.read_csv(f, keep_default_na=False) if f.is_file() else pd.DataFrame())
        except (OSError, ValueError, EOFError) as e:
            raise TopasError(f"{f}: unreadable ({e})") from None
    return out[0], out[1]
