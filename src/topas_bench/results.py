"""Run identity, result directories, and reading/writing a run's files (docs/design.md section 8).

A run is (workload spec, scheduler + params, engine + preset + settings, rate, seed). Its
directory is derived from that identity, so a finished run is found again and skipped, and a
sweep resumes after a crash. A directory holds `requests.parquet`, `tasks.parquet`,
`timeline.parquet`, `decisions.parquet` and `run.json` (identity, versions, git revision,
results format, each table's row count, wall time, summary).

A cell is written whole or not at all: into a temporary sibling directory (`.<cell>.tmp-*`),
then renamed into place, so a killed writer never leaves a directory that looks finished.

A stored cell is verified before it is used (`load_cell`, `check_cell`): run.json readable,
its identity that of the directory, every table's bytes matching the digest run.json records
(`table_digest`, bound to the cell's identity, so another cell's table fails too), the row
counts, and the result invariants that the tables prove on their own
(`invariants.check_stored`). A cell that fails is not reused but run again, and never reported.
Cells of results format 2 and older record no digests: they are read "unverified" (everything
but the digests is checked) and never reused (docs/reliability.md, "Results").
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench import __version__
from topas_bench.errors import TopasError
from topas_bench.invariants import InvariantError, check_stored
from topas_bench.invariants import check_cell as check_invariants

TABLES = ("requests", "tasks", "timeline", "decisions")
#: The files of a result; anything else in a cell's directory (the SGLang runner's journal and
#: server log) is carried over when the cell is (re)written.
RESULT_FILES = ("run.json", *(f"{t}.parquet" for t in TABLES))
#: Version of the cell layout and run.json fields. 1: no `rows`, cells written in place;
#: 2: `rows` (per-table row counts) and `results_format`, cells written atomically;
#: 3: `digests` (`table_digest` of every table), `bytes` (their sizes) and `meta_digest` (of
#: run.json's other fields).
RESULTS_FORMAT = 3
#: The first format whose run.json records `digests`.
DIGESTS_FROM = 3
#: What a table's digest starts from (`table_digest`): a new scheme gets a new tag.
_DIGEST_TAG = b"topas-bench table digest 1"
#: The tables `load_cell` always reads in full (the invariants on read need them).
CHECKED_TABLES = ("tasks", "requests")


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
    #: A plugin scheduler's distribution and version (`schedulers.plugins`): a changed plugin's
    #: cells are never reused as the old one's. Empty for a built-in, and then left out of the
    #: JSON, so built-in identities (and their digests) are what they were before plugins.
    scheduler_source: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("workload_params", "scheduler_params", "engine_params", "scheduler_source"):
            d[k] = dict(sorted(d[k].items()))
        if not d["scheduler_source"]:
            del d["scheduler_source"]
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
    """A finished, whole, verified run of the same workload sample (`check_cell` with digests
    required). The identity names a workload by its parameters (a replayed file by its path),
    so a run whose stored sample differs (the file changed, or the generator did) is stale and
    must be rerun, never mixed in; so is a corrupt one, or one too old to verify."""
    return check_cell(run_dir, workload_digest, require_digests=True) is None


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


def table_digest(identity: Mapping[str, Any], name: str, data: bytes | Iterable[bytes]) -> str:
    """The digest run.json records of table `name` (its file's bytes, `data`, whole or in
    chunks) in the cell of `identity` (as run.json records it): SHA-256 of a tag, the identity's
    canonical JSON, the table's name and the bytes. With the identity and name in it, a table
    copied from another cell, or another cell's digest with it, fails; only a run.json rewritten
    with digests computed afresh (the scheme is public, nothing is secret) passes unnoticed."""
    h = hashlib.sha256()
    for part in (_DIGEST_TAG, json.dumps(identity, sort_keys=True).encode(), name.encode()):
        h.update(part + b"\0")  # the canonical JSON is ASCII: no NUL inside a part
    for chunk in [data] if isinstance(data, bytes) else data:
        h.update(chunk)
    return h.hexdigest()


def meta_digest(meta: Mapping[str, Any]) -> str:
    """The digest run.json records of its other fields (`meta_digest` aside): SHA-256 of a tag
    and their canonical JSON (key order and layout do not count, values do)."""
    rest = {k: v for k, v in meta.items() if k != "meta_digest"}
    blob = json.dumps(rest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(_DIGEST_TAG + b" run.json\0" + blob.encode()).hexdigest()


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
        same = same and digest == table_digest(meta["identity"], name, _chunks(path))
    except OSError as e:
        raise CellError(f"{path.name}: unreadable table ({e.strerror or e})") from None
    if not same:
        raise CellError(
            f"{path.name}: does not match its digest in run.json (changed since the cell was "
            "written, or another cell's table)"
        )


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk


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


def write_run(
    run_dir: Path,
    identity: RunIdentity,
    tables: Mapping[str, pd.DataFrame],
    info: Mapping[str, Any],
    *,
    jct_floor_s: Mapping[str, float],
    compact: bool = False,
) -> None:
    """Check the cell's invariants (`invariants.check_cell`, given each task's JCT floor: a
    broken one raises `InvariantError` and nothing is written), then write the cell whole into
    a temporary sibling directory and rename it into place (module docstring); run.json
    records each table's digest. `compact` stores the tables smaller (zstd). A cell
    already at `run_dir` (a forced or corrupt rerun) is replaced; its files other than
    `RESULT_FILES` are carried over. A sweep runs each cell once; two writers of one cell
    (parallel tuning workers) both succeed and one copy stays. A writer first clears what
    killed writers of the cell left (`_clear_leftovers`)."""
    check_invariants(tables, jct_floor_s)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    _clear_leftovers(run_dir)
    prefix = f".{run_dir.name}.tmp-{_writer()}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=run_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would make the cell private
        ident = json.loads(json.dumps(identity.to_json(), default=_json_default))
        digests, sizes = {}, {}
        for name in TABLES:
            path = tmp / f"{name}.parquet"
            df = tables[name]
            if compact:
                floats = [c for c in df.columns if df[c].dtype.kind == "f"]
                # zstd and byte-stream-split floats: about a quarter smaller, lossless
                df.to_parquet(path, index=False, compression="zstd", compression_level=19,
                              use_byte_stream_split=floats or False)  # fmt: skip
            else:
                df.to_parquet(path, index=False)
            digests[name] = table_digest(ident, name, _chunks(path))
            sizes[name] = path.stat().st_size
        meta = {
            "identity": ident,
            "versions": versions(),
            "git_revision": git_revision(),
            "results_format": RESULTS_FORMAT,
            "rows": {name: len(tables[name]) for name in TABLES},
            "digests": digests,
            "bytes": sizes,
            **info,
        }
        body = json.loads(json.dumps(meta, default=_json_default))  # as a reader sees it
        meta = {**body, "meta_digest": meta_digest(body)}
        text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
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
    old = run_dir.with_name(f".{run_dir.name}.old-{tmp.name.rsplit('.tmp-', 1)[-1]}")
    os.rename(run_dir, old)
    os.rename(tmp, run_dir)
    shutil.rmtree(old, ignore_errors=True)


#: a temporary or set-aside directory of a cell older than this is a killed writer's leftover
#: (a writer creates its directory after the simulation, and fills it in seconds), whoever
#: made it
LEFTOVER_AGE_S = 900.0
#: `.<cell>.tmp-<pid>x<machine>-<random>` (and `.old-`): who is writing it, where
_LEFTOVER = re.compile(r"\.(?:tmp|old)-(?:(\d+)x([0-9a-f]{8})-)?[A-Za-z0-9_]+")


def _writer() -> str:
    """This process as a writer: its pid and its machine (`_machine`)."""
    return f"{os.getpid()}x{_machine()}"


def _machine() -> str:
    """8 hex digits naming this host, boot and pid namespace: where a pid means one process."""
    parts = [socket.gethostname()]
    for f in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(os.readlink(f) if f.endswith("/pid") else Path(f).read_text().strip())
        except OSError:
            parts.append("")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: alive
        return True
    return True


def _clear_leftovers(run_dir: Path) -> None:
    """Temporary or set-aside directories of this cell that a killed writer left behind: those
    whose writer was a process of this machine that is gone (`_writer`), and any older than
    `LEFTOVER_AGE_S` (a writer elsewhere, or a name without its writer), so a writer of the
    same cell at work now keeps its own."""
    now, here = time.time(), _machine()
    for stale in run_dir.parent.glob(f".{run_dir.name}.*"):
        m = _LEFTOVER.fullmatch(stale.name, len(run_dir.name) + 1)
        if m is None:
            continue
        pid, machine = m.groups()
        gone = machine == here and int(pid) != os.getpid() and not _alive(int(pid))
        try:
            if stale.is_dir() and (gone or now - stale.stat().st_mtime > LEFTOVER_AGE_S):
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
