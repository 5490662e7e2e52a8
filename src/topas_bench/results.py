"""Run identity, result directories, and reading/writing a run's files (docs/design.md section 8).

A run is (workload spec, scheduler + params, engine + preset + settings, rate, seed). Its
directory is derived from that identity, so a finished run is found again and skipped, and a
sweep resumes after a crash. A directory holds `requests.parquet`, `tasks.parquet`,
`timeline.parquet`, `decisions.parquet` and `run.json` (identity, versions, git revision,
results format, each table's row count, wall time, summary).

A cell is written whole or not at all: into a temporary sibling directory (`.<cell>.tmp-*`),
then renamed into place, so a killed writer never leaves a directory that looks finished.
`check_cell` verifies a stored cell (run.json readable, every table readable with the row
count run.json records); a cell that fails is not reused but run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench import __version__
from topas_bench.errors import TopasError
from topas_bench.invariants import check_cell as check_invariants

TABLES = ("requests", "tasks", "timeline", "decisions")
#: The files of a result; anything else in a cell's directory (the SGLang runner's journal and
#: server log) is carried over when the cell is (re)written.
RESULT_FILES = ("run.json", *(f"{t}.parquet" for t in TABLES))
#: Version of the cell layout and run.json fields. 1: no `rows`, cells written in place;
#: 2: `rows` (per-table row counts) and `results_format`, cells written atomically.
RESULTS_FORMAT = 2


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
    """A finished, whole run of the same workload sample (`check_cell`). The identity names a
    workload by its parameters (a replayed file by its path), so a run whose stored sample
    differs (the file changed, or the generator did) is stale and must be rerun, never mixed
    in; so is a corrupt one."""
    return check_cell(run_dir, workload_digest) is None


def check_cell(run_dir: Path, workload_digest: str | None = None) -> str | None:
    """Why the cell in `run_dir` cannot be used, or None: unfinished, run.json unreadable, a
    table missing or unreadable (only the Parquet footers are read: cheap enough for every cell
    of a sweep), a table's row count differing from the one run.json records, or (given
    `workload_digest`) run on another workload sample."""
    if not is_finished(run_dir):
        return "unfinished (no run.json)"
    try:
        meta = read_meta(run_dir)
    except TopasError as e:
        return str(e).replace(f"{run_dir}/", "")
    rows = meta.get("rows")
    if rows is not None and not isinstance(rows, dict):
        return "run.json has malformed row counts"
    for name in TABLES:
        path = run_dir / f"{name}.parquet"
        if not path.is_file():
            return f"partial run: {path.name} is missing"
        try:
            n = parquet_rows(path)
        except TopasError as e:
            return str(e).replace(f"{run_dir}/", "")
        if rows is not None and rows.get(name) != n:
            return f"{path.name} has {n} rows, run.json records {rows.get(name)}"
    if workload_digest is not None and meta.get("workload_digest") != workload_digest:
        return "stored for another workload sample"
    return None


def parquet_rows(path: Path) -> int:
    """The row count in a Parquet file's footer; `TopasError` if the file is unreadable."""
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, ValueError) as e:
        raise TopasError(f"{path}: unreadable table ({e})") from None


def write_run(
    run_dir: Path,
    identity: RunIdentity,
    tables: Mapping[str, pd.DataFrame],
    info: Mapping[str, Any],
    *,
    jct_floor_s: Mapping[str, float],
) -> None:
    """Check the cell's invariants (`invariants.check_cell`, given each task's JCT floor: a
    broken one raises `InvariantError` and nothing is written), then write the cell whole into
    a temporary sibling directory and rename it into place (module docstring). A cell already
    at `run_dir` (a forced or corrupt rerun) is replaced; its files other than `RESULT_FILES`
    are carried over. A sweep runs each cell once; two
    writers of one cell (parallel tuning workers) both succeed and one copy stays. A writer
    clears the old leftovers of killed writers first."""
    check_invariants(tables, jct_floor_s)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    _clear_leftovers(run_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.tmp-", dir=run_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would make the cell private
        for name in TABLES:
            tables[name].to_parquet(tmp / f"{name}.parquet", index=False)
        meta = {
            "identity": identity.to_json(),
            "versions": versions(),
            "git_revision": git_revision(),
            "results_format": RESULTS_FORMAT,
            "rows": {name: len(tables[name]) for name in TABLES},
            **info,
        }
        text = json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n"
        (tmp / "run.json").write_text(text)
        if run_dir.is_dir():
            for f in run_dir.iterdir():
                if f.name not in RESULT_FILES:
                    copy = shutil.copytree if f.is_dir() else shutil.copy2
                    copy(f, tmp / f.name)
        _swap_into_place(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_into_place(tmp: Path, run_dir: Path) -> None:
    """Rename `tmp` to `run_dir`. An existing `run_dir` is first renamed aside, then deleted:
    a kill between the two renames leaves no cell at all (it is rerun), never half of one.
    When another writer put the same cell in place meanwhile (parallel tuning workers can run
    one identity twice; a cell is a function of its identity), its copy is kept."""
    if not run_dir.exists():
        try:
            os.rename(tmp, run_dir)
        except OSError:
            if not run_dir.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return
    old = run_dir.with_name(f".{run_dir.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
    os.rename(run_dir, old)
    os.rename(tmp, run_dir)
    shutil.rmtree(old, ignore_errors=True)


#: a temporary or set-aside directory of a cell older than this is a killed writer's leftover
#: (a writer creates its directory after the simulation, and fills it in seconds)
LEFTOVER_AGE_S = 900.0


def _clear_leftovers(run_dir: Path) -> None:
    """Temporary or set-aside directories of this cell that a killed writer left behind: those
    older than `LEFTOVER_AGE_S`, so a writer of the same cell at work now keeps its own."""
    now = time.time()
    for stale in run_dir.parent.glob(f".{run_dir.name}.*"):
        if not stale.name.rsplit(".", 1)[-1].startswith(("tmp-", "old-")):
            continue
        try:
            if stale.is_dir() and now - stale.stat().st_mtime > LEFTOVER_AGE_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            continue  # removed by its own writer meanwhile


def is_hidden(path: Path, root: Path) -> bool:
    """Whether `path` lies in a directory (below `root`) whose name starts with a dot: a cell
    being written or set aside, never a result."""
    return any(part.startswith(".") for part in path.relative_to(root).parts[:-1])


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:  # ValueError: JSONDecodeError and more
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
