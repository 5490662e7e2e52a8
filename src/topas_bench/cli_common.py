"""What every `topas-bench` command shares: the two consoles, error handling (one line on
stderr and exit code 2; 70 for a bug), output-path checks and `key=value` parsing.

The command modules (`cli`, `cli_analysis`, `cli_trace`, `cli_gpu`) import this
module and never each other, so the command line has no import cycle.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import click
import typer
from rich.console import Console

from topas_bench.errors import TopasError
from topas_bench.invariants import InvariantError
from topas_bench.workloads.trace import TraceError

# Wide enough for the JCT table when output is piped (rich assumes 80 columns there).
# emoji=False: rich would render segment keys like `agent:A:4096` as emoji (`:a:`).
out = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)

P = ParamSpec("P")
R = TypeVar("R")


#: Exit code of an unexpected exception (a bug), as sysexits' EX_SOFTWARE; bad input is 2.
INTERNAL_ERROR = 70
DEBUG_ENV = "TOPAS_BENCH_DEBUG"


def _error_handler(list_problems: bool) -> Callable[[Callable[P, R]], Callable[P, R]]:
    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        return _handled(fn, list_problems)

    return decorate


def _handled(fn: Callable[P, R], list_problems: bool) -> Callable[P, R]:
    """`fn` with library errors turned into one clear line and exit code 2 (an invalid trace:
    its first problem and how many there are, or, with `list_problems`, a line per problem).
    An unexpected exception is a bug: one line naming it and exit code 70, never a traceback
    (unless $TOPAS_BENCH_DEBUG is set); so is a result that breaks an invariant."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TraceError as e:
            if list_problems:
                err.print(f"error: {e.source}: {e.count:,} problem(s)", markup=False)
                err.print(e.report(), markup=False)
            else:
                more = e.count > 1 and e.source.endswith((".jsonl", ".gz"))
                hint = f" (`topas-bench workloads validate {e.source}` lists them)" * more
                err.print(f"error: {e}{hint}", markup=False)
            raise typer.Exit(2) from None
        except InvariantError as e:  # a bug of an engine: the cell was not written
            err.print(
                f"internal error: {e}; the cell was not written; please report it", markup=False
            )
            raise typer.Exit(INTERNAL_ERROR) from None
        except TopasError as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2) from None
        except OSError as e:  # an output path that cannot be written, a file that vanished
            where = f"{e.filename}: " if e.filename else ""
            err.print(f"error: {where}{e.strerror or e}", markup=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("interrupted: finished runs are kept; run again to resume", markup=False)
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.Abort, click.ClickException):
            raise  # the command's own exit code, or a usage error
        except Exception as e:  # a bug of ours: one line, a distinct exit code, no traceback
            if os.environ.get(DEBUG_ENV):
                raise
            frame = traceback.extract_tb(e.__traceback__)[-1]
            err.print(
                f"internal error: {type(e).__name__}: {e} ({Path(frame.filename).name}:"
                f"{frame.lineno}); please report it; {DEBUG_ENV}=1 shows the traceback",
                markup=False,
            )
            raise typer.Exit(INTERNAL_ERROR) from None

    return wrapper


#: Commands: errors as one line (`TraceError`: the first problem and the count).
handles_errors = _error_handler(list_problems=False)
#: Commands that check files (`workloads validate`, `trace import`): a line per trace problem.
lists_problems = _error_handler(list_problems=True)


def check_out_dir(path: Path | str, flag: str = "--out") -> Path:
    """Fail before anything runs when `path` could not become a directory this process writes
    to: it is empty (a string as given: `--out ''` is no directory, though `Path('')` would be
    the current one), it or an ancestor is a file, or the nearest existing one takes no new
    files. Creates nothing that stays (a probe file comes and goes)."""
    if isinstance(path, str):
        if not path.strip():
            raise TopasError(f"{flag} is empty; give a directory (`.` for the current one)")
        path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise TopasError(f"{flag} {path}: {p} is not a directory")
            if problem := _unwritable(p):
                raise TopasError(f"{flag} {path}: cannot write in {p} ({problem})")
            break
    return path


def check_writable_file(path: Path) -> Path:
    """Fail before anything runs when the file `path` could not be written: its directory is
    missing or takes no new files, or `path` is a directory or another thing that is not a
    regular file (a device such as /dev/null, which the atomic rename would replace)."""
    if path.is_dir():
        raise TopasError(f"cannot write {path}: it is a directory")
    if path.exists() and not path.is_file():
        raise TopasError(f"cannot write {path}: not a regular file (a device, pipe or socket)")
    if not path.parent.is_dir():
        raise TopasError(f"cannot write {path}: {path.parent} is not a directory")
    if problem := _unwritable(path.parent):
        raise TopasError(f"cannot write {path}: {path.parent} takes no new files ({problem})")
    return path


def check_not_input(output: Path, inputs: Mapping[str, Path | str], flag: str) -> Path:
    """Fail when the file `output` would be written over one of `inputs` (what each is, by
    its path): the same path, or another name of the same file (a link). Writing a command's
    output over its input would lose the input, a recording that may not be made again."""
    for what, given in inputs.items():
        src = Path(given)
        try:
            same = output.resolve() == src.resolve() or (
                output.exists() and os.path.samefile(output, src)
            )
        except (OSError, RuntimeError):  # a link loop, say: then it is no file to lose
            same = False
        if same:
            raise TopasError(
                f"{flag} {output}: that is {what} ({src}); writing over it would lose it, so "
                "write to another file"
            )
    return output


def _unwritable(directory: Path) -> str | None:
    """Why no file can be made in `directory`, or None. Tried, not inferred from permission
    bits, which do not say it all (root, a read-only mount, a full disk)."""
    probe = directory / f".topas-bench-write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return e.strerror or str(e)
    return None


def parse_assignments(items: list[str], flag: str) -> dict[str, Any]:
    """`key=value` pairs; values are JSON when they parse as JSON, else strings."""
    result: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise TopasError(f"{flag} expects key=value, got {item!r}")
        try:
            result[key.strip()] = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON (or beyond what json reads): a string
            result[key.strip()] = raw
    return result


def parse_by_name(items: list[str], flag: str, what: str) -> dict[str, dict[str, Any]]:
    """`name.key=value` pairs, grouped by name (`what` names it in the error)."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in parse_assignments(items, flag).items():
        name, dot, param = key.partition(".")
        if not dot or not param:
            raise TopasError(f"{flag} expects {what}.key=value, got {key!r}")
        grouped.setdefault(name, {})[param] = value
    return grouped


def parse_scheduler_params(items: list[str]) -> dict[str, dict[str, Any]]:
    """`scheduler.key=value` pairs, grouped by scheduler name."""
    return parse_by_name(items, "--scheduler-param", "scheduler")
