"""A trace file's lines, as the checks need them: numbered, decoded, strict JSON.

Files may be gzip-compressed (recognised by their magic bytes, whatever the name) and may start
with a UTF-8 byte order mark, as editors and archives leave them: both are read transparently.
Lines end at ``\\n`` only (a ``\\r`` before it is JSON whitespace), so line numbers are an
editor's. A line longer than `MAX_LINE_BYTES` is a problem, not a memory spike: at most that
much of one line is ever held.

JSON is strict about keys: an object with a key twice (``{"id": "a", "id": "b"}``, where
`json.loads` keeps the last silently) is invalid; so is a string holding half of a UTF-16
surrogate pair (``"\\ud800"`` alone: valid JSON, but no Unicode text, which nothing can
encode to write it out again). ``NaN`` and ``Infinity`` (not JSON, but what
Python writes) are read as numbers, so that the field holding one is named by the checks, which
refuse every non-finite number.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from topas_bench.errors import TopasError, not_utf8

#: The longest line read (bytes). The imported 100,000-call MetaGPT task is a 25 MB line.
MAX_LINE_BYTES = 64 * 2**20
_BOM = b"\xef\xbb\xbf"
_GZIP = b"\x1f\x8b"


class LineError(ValueError):
    """A line that is not one strict JSON value; str() is the problem, for `TraceProblem`."""


def path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` cannot be read as a trace ("no such file", "is a directory", ...), or None
    for a regular file (or a link to one)."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"
    return None if stat.S_ISREG(mode) else f"{_kind(mode)}, not a regular file"


def check_trace_path(path: str | os.PathLike[str]) -> Path:
    """`path`, or a one-line `TopasError` when it is not a regular file (`path_problem`)."""
    if problem := path_problem(path):
        raise TopasError(f"{path}: cannot read trace: {problem}")
    return Path(path)


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "is a directory"), (stat.S_ISCHR, "is a character device"),
        (stat.S_ISBLK, "is a block device"), (stat.S_ISFIFO, "is a named pipe (FIFO)"),
        (stat.S_ISSOCK, "is a socket"),
    )  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "is not a regular file")


def open_binary(path: Path) -> IO[bytes]:
    """The file's bytes, gunzipped when it starts with gzip's magic number."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        if magic == _GZIP:
            return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile reads bytes
        return open(path, "rb")
    except OSError as e:
        raise TopasError(f"{path}: cannot read trace: {e.strerror or e}") from None


def raw_lines(f: IO[bytes], source: str) -> Iterator[tuple[int, int, bytes | LineError]]:
    """``(line number, byte offset, line)`` of every non-blank line (offsets are into the
    decompressed stream), or a `LineError` for a line too long to read. A broken gzip stream
    or a read error is a `TopasError` naming the file."""
    n, offset = 0, 0
    try:
        while line := f.readline(MAX_LINE_BYTES + 1):
            n += 1
            start = offset
            offset += len(line)
            if n == 1 and line.startswith(_BOM):
                line = line[len(_BOM) :]
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    offset += len(rest)
                offset += len(rest)
                limit = f"{MAX_LINE_BYTES // 2**20} MiB"
                yield n, start, LineError(f"line longer than {limit}; not read")
            elif line.strip():
                yield n, start, line
    except (OSError, EOFError, gzip.BadGzipFile) as e:  # a truncated or corrupt .gz
        raise TopasError(f"{source}: cannot read trace past line {n}: {e}") from None


def text_lines(text: str) -> Iterator[tuple[int, int, bytes | LineError]]:
    """`raw_lines` of a trace held as text (offsets are character offsets)."""
    offset = 0
    for n, line in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        if line.strip():
            yield n, offset, line.encode("utf-8", "surrogatepass")
        offset += len(line) + 1


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise LineError(f"invalid JSON: key {show(dup)} appears twice in one object")
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs)


def decode(line: bytes) -> Any:
    """One line as strict JSON; `LineError` with a one-line message if it is not."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LineError(not_utf8(e)) from None
    try:
        value = _DECODER.decode(text)
    except LineError:
        raise
    except json.JSONDecodeError as e:
        raise LineError(f"invalid JSON: {e.msg} (column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # a 5,000-digit integer; nesting too deep
        raise LineError(f"invalid JSON: {json_error(e)}") from None
    if _SURROGATE_ESCAPE.search(text) and (half := lone_surrogate(value)) is not None:
        raise LineError(
            f"not Unicode text: {show(half)} holds half of a UTF-16 surrogate pair "
            "(a \\ud800-\\udfff escape without its other half)"
        )
    return value


#: a `\\u` escape of a surrogate in JSON text (a line without one holds none: raw UTF-8 cannot)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any) -> str | None:
    """The first string (a key or a value) in `value`, a decoded JSON value, that holds a lone
    surrogate, or None. Iterative: `value` may be nested as deep as JSON allows."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return v
        elif isinstance(v, dict):
            todo += v.keys()
            todo += v.values()
        elif isinstance(v, list):
            todo += v
    return None


def json_error(e: Exception) -> str:
    """What `json.loads` failed on beyond syntax, in one short line."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split(";")[0]


def show(v: Any, width: int = 60) -> str:
    """`repr(v)`, cut to `width` characters: user values in messages stay on one short line."""
    shown = repr(v)
    return shown if len(shown) <= width else shown[: width - 3] + "..."
