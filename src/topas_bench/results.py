"""Run identity, result directories, and reading/writing a run's files (DESIGN section 8).

A run is (workload spec, scheduler + params, engine + preset + settings, rate, seed). Its
directory is derived from that identity, so a finished run is found again and skipped, and a
sweep resumes after a crash. A directory holds `requests.parquet`, `tasks.parquet`,
`timeline.parquet`, `decisions.parquet` and `run.json` (identity, versions, git revision, wall
time, summary). `run.json` is written last, atomically: a directory without it is unfinished.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench import __version__
from topas_bench.errors import TopasError

TABLES = ("requests", "tasks", "timeline", "decisions")


@dataclass(frozen=True)
class RunIdentity:
    workload: str
    num_tasks: int
    rate_per_s: float
    seed: int
    scheduler: str
    preset: str
    kv_budget_tokens: int
    engine: str = "sim"
    #: `runners.engines.Engine.version`: cells made by an older engine are never reused.
    engine_version: int = 0
    workload_params: Mapping[str, Any] = field(default_factory=dict)
    scheduler_params: Mapping[str, Any] = field(default_factory=dict)
    engine_params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("workload_params", "scheduler_params", "engine_params"):
            d[k] = dict(sorted(d[k].items()))
        return d

    @property
    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def run_dir(self, out: Path) -> Path:
        cell = (
            f"{self.engine}-{self.preset}-kv{self.kv_budget_tokens}"
            f"-r{self.rate_per_s:g}-n{self.num_tasks}-s{self.seed}-{self.digest}"
        )
        return out / self.workload / self.scheduler / cell


def git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=here, capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
    except OSError:
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, str]:
    import numpy

    return {
        "topas_bench": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "pandas": pd.__version__,
    }


def is_finished(run_dir: Path) -> bool:
    return (run_dir / "run.json").is_file()


def reusable(run_dir: Path, workload_digest: str) -> bool:
    """A finished run of the same workload sample. The identity names a workload by its
    parameters (a replayed file by its path), so a run whose stored sample differs (the file
    changed, or the generator did) is stale and must be rerun, never mixed in."""
    if not is_finished(run_dir):
        return False
    try:
        return bool(read_meta(run_dir).get("workload_digest") == workload_digest)
    except TopasError:  # unreadable: rerun it
        return False


def write_run(
    run_dir: Path,
    identity: RunIdentity,
    tables: Mapping[str, pd.DataFrame],
    info: Mapping[str, Any],
) -> None:
    """Write the tables, then `run.json` last (atomically, via a rename)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        tables[name].to_parquet(run_dir / f"{name}.parquet", index=False)
    meta = {
        "identity": identity.to_json(),
        "versions": versions(),
        "git_revision": git_revision(),
        **info,
    }
    tmp = run_dir / "run.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n")
    os.replace(tmp, run_dir / "run.json")


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TopasError(f"{path}: unreadable run.json ({e})") from None
    if not isinstance(meta, dict) or "identity" not in meta:
        raise TopasError(f"{path}: not a topas-bench run.json (no identity)")
    return meta


def read_table(run_dir: Path, name: str) -> pd.DataFrame:
    path = run_dir / f"{name}.parquet"
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:
        raise TopasError(f"{path}: unreadable table ({e})") from None
