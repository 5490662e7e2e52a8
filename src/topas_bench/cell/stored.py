"""A stored cell: is it done, may it be reused, and reading it back verified.

A stored cell is verified before it is used (`load_cell`, `check_cell`): run.json readable,
its identity that of the directory, every table's bytes matching the digest run.json records
(`results.table_digest`, bound to the cell's identity, so another cell's table fails too), the
row counts, and the result invariants that the tables prove on their own
(`invariants.check_stored`). A cell that fails is not reused but run again, and never reported.
Cells of results format 2 and older record no digests: they are read "unverified" (everything
but the digests is checked) and never reused (docs/reliability.md, "Results").

`lookup` is the one reuse check of the harness and the sweep runner: a cell's directory, and
whether the cell stored there is reused or run again (and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from topas_bench.cell.identity import RunIdentity, cell_identity
from topas_bench.errors import TopasError
from topas_bench.invariants import InvariantError, check_stored
from topas_bench.results import (
    CHECKED_TABLES,
    DIGESTS_FROM,
    RESULTS_FORMAT,
    TABLES,
    chunks,
    meta_digest,
    read_meta,
    table_digest,
)

if TYPE_CHECKING:
    from topas_bench.plan import RunPlan


@dataclass(frozen=True)
class CellResult:
    scheduler: str
    run_dir: Path
    summary: dict[str, float]
    sim_time_s: float
    wall_s: float
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    #: why the stored cell of this identity was not reused but run again (corrupt, stale, too
    #: old to verify: `check_cell`), or None
    redone: str | None = None


@dataclass(frozen=True)
class Lookup:
    """Where a cell of a plan lives and what is stored there (`lookup`)."""

    run_dir: Path
    #: a finished, whole, verified cell of the same workload sample: reuse it
    reusable: bool
    #: why the finished cell there is run again (stale, corrupt, too old to verify), or None
    redone: str | None
    #: whoever serves the cell starts afresh (forced, or a finished cell is there)
    fresh: bool


def lookup(plan: RunPlan, scheduler: str, digest: str, *, force: bool = False) -> Lookup:
    """`scheduler`'s cell of `plan` (its directory under `plan.out`): reusable when a
    finished, whole, verified cell of the same workload sample (`digest`) is stored there
    (`check_cell` with digests required) and not `force`. The identity names a workload by
    its parameters (a replayed file by its path), so a cell whose stored sample differs (the
    file changed, or the generator did) is stale and must be rerun, never mixed in; so is a
    corrupt one, or one too old to verify."""
    run_dir = cell_identity(plan, scheduler).run_dir(plan.out)
    why = None if force else check_cell(run_dir, digest, require_digests=True)
    finished = is_finished(run_dir)
    if not force and why is None:
        return Lookup(run_dir, reusable=True, redone=None, fresh=False)
    return Lookup(
        run_dir,
        reusable=False,
        redone=why if why is not None and finished else None,
        fresh=force or finished,
    )


def cached_cell(scheduler: str, run_dir: Path) -> CellResult:
    """The result of a stored cell already verified (`check_cell`), from run.json."""
    meta = read_meta(run_dir)
    return CellResult(
        scheduler, run_dir, meta["summary"], meta["sim_time_s"], meta["wall_s"], cached=True
    )


def is_finished(run_dir: Path) -> bool:
    return (run_dir / "run.json").is_file()


class CellError(TopasError):
    """Why a stored cell cannot be used: one line, paths relative to the cell's directory."""


@dataclass(frozen=True)
class StoredCell:
    """A stored cell that passed `load_cell`: run.json, its identity, the tables read in full
    (`CHECKED_TABLES` and those asked for) and whether digests vouched for them (`verified`;
    False for a cell of a format before `DIGESTS_FROM`)."""

    meta: dict[str, Any]
    identity: RunIdentity
    tables: dict[str, pd.DataFrame]
    verified: bool

    @property
    def results_format(self) -> int:
        return int(self.meta.get("results_format", 1))


def check_cell(
    run_dir: Path, workload_digest: str | None = None, *, require_digests: bool = False
) -> str | None:
    """Why the cell in `run_dir` cannot be used (`load_cell`), or None. `require_digests`: a
    cell of a format that records no digests cannot be either (reuse asks this)."""
    try:
        cell = load_cell(run_dir, workload_digest)
    except CellError as e:
        return str(e)
    if require_digests and not cell.verified:
        return (
            f"written before table digests (results format {cell.results_format}): "
            "its tables cannot be verified"
        )
    return None


def load_cell(
    run_dir: Path, workload_digest: str | None = None, read: tuple[str, ...] = ()
) -> StoredCell:
    """The stored cell in `run_dir`, verified; else `CellError` naming the first problem:
    unfinished; run.json unreadable, of an unknown format, or naming another cell than its
    directory; (formats from `DIGESTS_FROM`) run.json not matching its own digest; a table
    missing, unreadable, or (formats from `DIGESTS_FROM`) not matching its digest; a row count
    differing from run.json's; (given `workload_digest`) run on another workload sample; a
    broken result invariant (`invariants.check_stored`). Tables are hashed in chunks (their
    size first); `CHECKED_TABLES` and `read` are read in full, the others' footers."""
    if not is_finished(run_dir):
        raise CellError("unfinished (no run.json)")
    try:
        meta = read_meta(run_dir)
    except TopasError as e:
        raise CellError(_one_line(str(e).replace(f"{run_dir}/", ""))) from None
    ident = _identity(meta, run_dir)
    fmt = meta.get("results_format", 1)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or not 1 <= fmt <= RESULTS_FORMAT:
        raise CellError(
            f"run.json has results format {_one_line(repr(fmt), 40)}; this code reads 1 to "
            f"{RESULTS_FORMAT}"
        )
    rows, digests = meta.get("rows"), meta.get("digests") if fmt >= DIGESTS_FROM else None
    if rows is not None and not isinstance(rows, dict):
        raise CellError("run.json has malformed row counts")
    if fmt >= DIGESTS_FROM and not isinstance(digests, dict):
        raise CellError("run.json records no table digests")
    if fmt >= DIGESTS_FROM and meta.get("meta_digest") != meta_digest(meta):
        raise CellError(
            "run.json: does not match its own digest (edited since the cell was written)"
        )
    tables: dict[str, pd.DataFrame] = {}
    for name in TABLES:
        path = run_dir / f"{name}.parquet"
        if not path.is_file():
            raise CellError(f"partial run: {path.name} is missing")
        if digests is not None:
            _check_digest(path, meta, digests.get(name))
        n = _parse(path, tables, full=name in CHECKED_TABLES or name in read)
        if rows is not None and rows.get(name) != n:
            raise CellError(f"{name}.parquet has {n} rows, run.json records {rows.get(name)}")
    if workload_digest is not None and meta.get("workload_digest") != workload_digest:
        raise CellError("stored for another workload sample")
    try:
        check_stored(tables, ident.num_tasks)
    except InvariantError as e:
        raise CellError(_one_line(f"{e.table or 'tasks'}.parquet: {e}")) from None
    return StoredCell(meta, ident, tables, digests is not None)


def _identity(meta: dict[str, Any], run_dir: Path) -> RunIdentity:
    """run.json's identity, which must be the one the directory's name and place say."""
    try:
        ident = RunIdentity(**meta["identity"])
        expected = ident.run_dir(Path())
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
        raise CellError(f"run.json has a malformed identity ({_one_line(str(e), 80)})") from None
    if run_dir.parts[-3:] != expected.parts:
        raise CellError(f"directory does not match its identity (expected {expected})")
    return ident


def _check_digest(path: Path, meta: dict[str, Any], digest: object) -> None:
    """`CellError` unless the table at `path` has the size and digest run.json records: the size
    first (a `stat`), then the bytes, read in chunks (a file of any size costs no memory)."""
    name = path.name.removesuffix(".parquet")
    size = (meta.get("bytes") or {}).get(name) if isinstance(meta.get("bytes"), dict) else None
    try:
        same = size is None or path.stat().st_size == size
        same = same and digest == table_digest(meta["identity"], name, chunks(path))
    except OSError as e:
        raise CellError(f"{path.name}: unreadable table ({e.strerror or e})") from None
    if not same:
        raise CellError(
            f"{path.name}: does not match its digest in run.json (changed since the cell was "
            "written, or another cell's table)"
        )


def _parse(path: Path, into: dict[str, pd.DataFrame], *, full: bool) -> int:
    """The table's row count; with `full`, the table itself goes into `into` too. Anything the
    Parquet reader raises on damaged bytes is `CellError` (a cell without digests can hold
    any bytes)."""
    import pyarrow.parquet as pq

    name = path.name.removesuffix(".parquet")
    try:
        if full:
            into[name] = pd.read_parquet(path)
            return len(into[name])
        return int(pq.read_metadata(path).num_rows)
    except Exception as e:  # corrupt bytes raise many kinds
        why = f"{type(e).__name__}: {e}".replace(str(path), path.name)
        raise CellError(f"{path.name}: unreadable table ({_one_line(why, 160)})") from None


def _one_line(text: str, width: int = 400) -> str:
    """`text` on one line (line breaks a library's message may hold become spaces), cut to
    `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
