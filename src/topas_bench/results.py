"""The result files of a cell: their names, format and digests (docs/design.md section 8).

A cell's directory holds `requests.parquet`, `tasks.parquet`, `timeline.parquet`,
`decisions.parquet` and `run.json` (identity, versions, git revision, results format, each
table's row count, digest and size, wall time, summary, and run.json's own digest). This module
is the format; a cell's identity, its reuse, its writing and its verified reading are the
`cell` package's (`cell.identity`, `cell.stored`, `cell.write`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.errors import TopasError

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
#: The tables `cell.stored.load_cell` always reads in full (the invariants on read need them).
CHECKED_TABLES = ("tasks", "requests")


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


def chunks(path: Path) -> Iterator[bytes]:
    """The bytes of the file at `path` in 1 MiB chunks (a table of any size costs no memory)."""
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk


def is_hidden(path: Path, root: Path) -> bool:
    """Whether `path` lies in a directory (below `root`) whose name starts with a dot: a cell
    being written or set aside, never a result."""
    return any(part.startswith(".") for part in path.relative_to(root).parts[:-1])


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
