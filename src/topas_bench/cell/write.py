"""Writing a cell: whole or not at all, with its digests (docs/design.md section 8).

A cell is written into a temporary sibling directory (`.<cell>.tmp-*`), then renamed into
place, so a killed writer never leaves a directory that looks finished; run.json records the
identity, versions, git revision, results format, each table's row count, digest and size, and
its own digest (`results`).
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench import __version__
from topas_bench.cell.identity import RunIdentity
from topas_bench.invariants import check_cell as check_invariants
from topas_bench.results import (
    RESULT_FILES,
    RESULTS_FORMAT,
    TABLES,
    chunks,
    meta_digest,
    table_digest,
)


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
            digests[name] = table_digest(ident, name, chunks(path))
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


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
