"""Read a results tree into one row per run (docs/design.md section 8: analysis only reads files).

A run directory is taken only when it is whole and verified (`cell.stored.load_cell`): `run.json`
readable with an identity that matches the directory's name, every table present, matching the
digest run.json records and with its row count, and the result invariants holding on the tables
read (`invariants.check_stored`: one task row per task of the identity, times finite and
ordered, JCT > 0, ...). Anything else is reported as a problem and left out, never mixed in
(the CLI refuses to report a tree with problems unless told to skip them). Runs of a format
before table digests are taken unverified and listed in `Collection.unverified`. Directories
whose names start with a dot (cells being written, `cell.write.write_run`) are not results and
are not looked at. Runs of one group (same identity but scheduler) and seed must share the
workload sample (`workload_digest`); when they do not, the tree is an error, not a
comparison. `check_revisions` tells whether the runs come
from one code revision and results format.

Metrics are recomputed from the files with the `METRICS` table (`summarize`), the same
functions `run` uses, under the SLO the caller gives (goodput); `run.json` contributes its
counters (prefix hits, preemptions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.metrics import RunTables, Slo, mechanism, stage_summary, summarize
from topas_bench.cell.identity import RunIdentity
from topas_bench.cell.stored import CellError, load_cell
from topas_bench.errors import TopasError
from topas_bench.results import TABLES, is_hidden
from topas_bench.workloads import lengths

#: Identity fields that vary within a group, i.e. are not part of the group key.
WITHIN_GROUP = ("scheduler", "scheduler_params", "scheduler_source", "seed")
LENGTH_KEYS = (lengths.MODE, lengths.CAP)


@dataclass
class Collection:
    """`runs`: one row per usable run (identity fields, group key and label, scheduler label,
    metrics); `jct`: each run's task JCTs by path; `stages`: per run (`path`) and stage kind,
    `metrics.stage_summary`; `problems`: what was left out and why; `slo`: goodput's SLO;
    `unverified`: runs taken without digests to check (a format before them), by path."""

    root: Path
    runs: pd.DataFrame
    jct: dict[str, np.ndarray] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    stages: pd.DataFrame = field(default_factory=pd.DataFrame)
    slo: Slo = field(default_factory=Slo)
    unverified: list[str] = field(default_factory=list)


def collect(root: Path, slo: Slo | None = None) -> Collection:
    if not root.is_dir():
        raise TopasError(f"{root}: not a directory of results")
    rows: list[dict[str, Any]] = []
    stages: list[dict[str, Any]] = []
    coll = Collection(root, pd.DataFrame(), slo=slo or Slo())
    for run_dir in _run_dirs(root):
        try:
            row, jct, per_stage, verified = _read_run(run_dir, coll.slo)
        except TopasError as e:
            coll.problems.append(f"{_rel(run_dir, root)}: {e}".replace(f"{run_dir}/", ""))
            continue
        row["path"] = str(run_dir)
        rows.append(row)
        if not verified:
            coll.unverified.append(str(run_dir))
        coll.jct[str(run_dir)] = jct
        stages += [{"path": str(run_dir), "kind": k, **v} for k, v in per_stage.items()]
    if not rows:
        raise TopasError(f"{root}: no finished runs found" + _first(coll.problems))
    runs = pd.DataFrame(rows).sort_values(["group", "scheduler", "seed", "path"])
    _check_unique(runs, root)
    _check_samples(runs)
    coll.runs = runs.reset_index(drop=True)
    coll.stages = pd.DataFrame(stages)
    return coll


def _first(problems: list[str]) -> str:
    return f" ({len(problems)} left out; first: {problems[0]})" if problems else ""


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path != root else "."


def _run_dirs(root: Path) -> list[Path]:
    """Directories that hold any run file: finished or not, so partial ones are reported."""
    names = {"run.json", *(f"{t}.parquet" for t in TABLES)}
    return sorted(
        {
            p.parent
            for p in root.rglob("*")
            if p.name in names and not is_hidden(p, root) and p.is_file()
        }
    )


def _read_run(
    run_dir: Path, slo: Slo
) -> tuple[dict[str, Any], np.ndarray, dict[str, dict[str, float]], bool]:
    if not (run_dir / "run.json").is_file():
        raise TopasError("unfinished run (no run.json)")
    try:
        cell = load_cell(run_dir, read=("decisions", "timeline"))
    except CellError as e:
        raise TopasError(str(e)) from None
    meta, ident = cell.meta, cell.identity
    tasks, requests = cell.tables["tasks"], cell.tables["requests"]
    digest = meta.get("workload_digest")
    if not isinstance(digest, str):
        raise TopasError("run.json has no workload_digest; cannot check the workload sample")
    counters = {k: float(v) for k, v in (meta.get("counters") or {}).items()}
    metrics = summarize(RunTables(tasks, requests, cell.tables["decisions"], counters, slo))
    jct = tasks["jct_s"].to_numpy(dtype=float)
    row = _row(ident, meta, digest) | metrics | mechanism(cell.tables["timeline"])
    return row, jct, stage_summary(requests), cell.verified


def _row(ident: RunIdentity, meta: dict[str, Any], digest: str) -> dict[str, Any]:
    d = ident.to_json()
    key = json.dumps({k: v for k, v in d.items() if k not in WITHIN_GROUP}, sort_keys=True)
    load = meta.get("load")
    return {
        "group": key,
        "group_label": group_label(ident, load, meta.get("load_reference")),
        "workload": workload_label(ident),
        "engine": ident.engine,
        "max_tokens": lengths.describe(ident.workload, ident.workload_params),
        "preset": ident.preset,
        "kv_budget_tokens": ident.kv_budget_tokens,
        "rate_per_s": ident.rate_per_s,
        "load": float(load) if load is not None else float("nan"),
        "num_tasks": ident.num_tasks,
        "scheduler": scheduler_label(ident.scheduler, d["scheduler_params"]),
        "scheduler_name": ident.scheduler,
        "scheduler_params": json.dumps(d["scheduler_params"], sort_keys=True),
        "seed": ident.seed,
        "workload_digest": digest,
        "code": code_version(meta),
    }


def workload_label(ident: RunIdentity) -> str:
    """The workload's name; a trace file (the `trace` workload) by its file name."""
    file = ident.workload_params.get("file") if ident.workload == "trace" else None
    return Path(str(file)).name if file else ident.workload


def unverified_note(coll: Collection) -> str | None:
    """One line on the runs taken without digests (`Collection.unverified`), or None."""
    if not coll.unverified:
        return None
    n, first = len(coll.unverified), _rel(Path(coll.unverified[0]), coll.root)
    return (
        f"{n} run{'s' * (n != 1)} written before table digests (results format 2 or older, "
        f"e.g. {first}): read unverified (row counts and result invariants checked, not the "
        "tables' digests)"
    )


def code_version(meta: dict[str, Any]) -> str:
    """The code that wrote a run: its git revision and results format (`results_format` 1
    when absent: cells written before it was recorded)."""
    return (
        f"{meta.get('git_revision') or 'unknown revision'}, format {meta.get('results_format', 1)}"
    )


def check_revisions(coll: Collection) -> None:
    """`TopasError` when the runs come from more than one code version (`code_version`): a
    report of them would compare results of different code as if they were one experiment."""
    runs = coll.runs
    versions = runs.groupby("code", sort=True)["path"].agg(["count", "first"])
    if len(versions) <= 1:
        return
    seen = "; ".join(
        f"{code}: {n} run{'s' * (n != 1)}, e.g. {_rel(Path(first), coll.root)}"
        for code, (n, first) in versions.iterrows()
    )
    raise TopasError(
        f"{coll.root}: runs from {len(versions)} code versions ({seen}); rerun the stale ones "
        "(or report on a fresh --out), or pass --allow-mixed-revisions"
    )


def scheduler_label(name: str, params: dict[str, Any]) -> str:
    """`topas`, or `topas[beta=0.2]` for non-default parameters."""
    if not params:
        return name
    return name + "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(params.items())) + "]"


def group_label(ident: RunIdentity, load: Any, reference: Any = None) -> str:
    """``load 0.8, rate 0.2266/s, a100-qwen32b, KV 18,692, 60 tasks, max_tokens=exact``: the
    length setting always (`lengths.describe`; a cell that names none used the legacy one),
    then any other workload and engine parameter. A load against other reference schedulers
    than FCFS names them: ``load 0.8 x best of fcfs/lpm/spf``."""
    parts = [f"load {float(load):g}"] if load is not None else []
    if parts and isinstance(reference, list) and reference and reference != ["fcfs"]:
        parts[0] += " x best of " + "/".join(str(r) for r in reference)
    parts.append(f"rate {ident.rate_per_s:.4g}/s")
    parts += [ident.preset, f"KV {ident.kv_budget_tokens:,}", f"{ident.num_tasks} tasks"]
    parts.append(lengths.describe(ident.workload, ident.workload_params))
    params = {k: v for k, v in ident.workload_params.items() if k not in LENGTH_KEYS}
    extra = {**params, **ident.engine_params}
    parts += [f"{k}={v}" for k, v in sorted(extra.items())]
    return ", ".join(parts)


def _check_unique(runs: pd.DataFrame, root: Path) -> None:
    dup = runs[runs.duplicated(["group", "scheduler", "seed"], keep=False)]
    if not dup.empty:
        paths = ", ".join(_rel(Path(p), root) for p in dup["path"].head(2))
        raise TopasError(f"{root}: the same run appears twice ({paths}); point at one tree")


def _check_samples(runs: pd.DataFrame) -> None:
    """Every scheduler of a group and seed must have run on the same workload sample."""
    for (_, seed), g in runs.groupby(["group", "seed"], sort=True):
        digests = g.groupby("workload_digest")["scheduler"].apply(list)
        if len(digests) > 1:
            first = g.iloc[0]
            seen = "; ".join(f"{d}: {', '.join(s)}" for d, s in digests.items())
            raise TopasError(
                f"{first['workload']} ({first['group_label']}), seed {seed}: schedulers ran on "
                f"different workload samples ({seen}); these runs cannot be compared"
            )
