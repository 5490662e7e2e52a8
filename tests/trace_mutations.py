"""Mutated workload traces, run end to end through the CLI (issue 24): shared by
`tests/test_fuzz_traces.py` (1,000 examples per `make test`) and `benchmarks/fuzz_census.py`.

A valid trace (dag4, 3 tasks) is mutated in its types, numbers, strings and structure (keys
dropped or doubled, lines cut, swapped, repeated; a BOM, CRLF, gzip, binary, an empty file;
issue 30: strings written as JSON escapes, so lone surrogates arrive as ``\\ud800``, and the
file in UTF-16, UTF-32 or Latin-1; harmless changes too, so that many mutants are still
valid), then given to `workloads validate` and to `run`. The promise: each exits 0 or 2; a
refusal is `error: ...` on one line (`validate` adds a line per problem, each naming the file
and line); never a traceback; what `validate` refuses `run` refuses; and every cell `run`
writes holds the result invariants, checked here independently of `topas_bench.invariants`
(own floor: each call's batch-of-one decode steps summed by numpy, the DAG walked
recursively).
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import typer
import typer.testing
from hypothesis import strategies as st

from fuzz_targets import DEEP, JSON, _drop, _paths, _set
from topas_bench.cli import app
from topas_bench.results import read_table
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.workloads.model import Task
from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import dumps_workload, load_workload

BASE = dumps_workload(generate("dag4", num_tasks=3, seed=0, prefix_tokens=64))
_CLI = typer.main.get_command(app)


class CliRunner(typer.testing.CliRunner):
    """typer's runner with the command built once (it rebuilds it on every call, 0.15 s)."""

    def invoke(self, app: typer.Typer, *args: Any, **kw: Any) -> Any:
        with mock.patch.object(typer.testing, "_get_command", lambda _: _CLI):
            return super().invoke(app, *args, **kw)


SCHEDULERS = ("fcfs", "lpm", "spf", "autellix", "topas")

NUMBERS = st.sampled_from([
    0, -1, 1, 2, 3, 0.5, 1e-300, 999_999_999.0, 1e9, 1e9 + 1, 1e308, -1e308, float("nan"),
    float("inf"), float("-inf"), 2**31 - 1, 2**31, 2**63, 10**30, True, False, None,
    "5", 64, 256, 4096, 100.0, -0.0,
])  # fmt: skip
STRINGS = st.one_of(
    st.sampled_from([
        "", "x" * 1_000_000, "a\nb", "é中😀", "\x00", "\ud800", "a.b[0]", " ", "agent:A",
        "t0000/s0/out", "A", "B", "s0", "t0001", "\u202e", "\\", '"', "\udfff", "s\ud83d",
        "\ud83d\ude00", "A\udc00",
    ]),
    st.text(max_size=8),
)  # fmt: skip


def _leaves(v: Any, kind: type | tuple[type, ...]) -> list[tuple[Any, ...]]:
    return [
        p
        for p in _paths(v)
        if p and isinstance(_get(v, p), kind) and not isinstance(_get(v, p), bool)
    ]


def _get(v: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        v = v[k]
    return v


@st.composite
def _mutated_row(draw: st.DrawFn, row: Any) -> Any:
    how = draw(st.sampled_from(["number", "number", "string", "type", "drop", "benign", "keys"]))
    if how == "number" and (leaves := _leaves(row, (int, float))):
        return _set(row, draw(st.sampled_from(leaves)), draw(NUMBERS))
    if how == "string" and (leaves := _leaves(row, str)):
        return _set(row, draw(st.sampled_from(leaves)), draw(STRINGS))
    if how == "type":
        return _set(row, draw(st.sampled_from(_paths(row))), draw(JSON))
    if how == "drop" and len(paths := _paths(row)) > 1:
        return _drop(row, draw(st.sampled_from(paths[1:])))
    if how == "benign" and isinstance(row, dict) and isinstance(row.get("arrival_s"), float):
        return {**row, "arrival_s": row["arrival_s"] * draw(st.sampled_from([0.0, 0.1, 2.0, 1e3]))}
    if how == "keys" and isinstance(row, dict):
        return dict(reversed(list(row.items())))  # the same object, keys in another order
    return row


@st.composite
def traces(draw: st.DrawFn) -> bytes:
    """A mutant of `BASE`, as the bytes of a file."""
    lines: list[Any] = [json.loads(line) for line in BASE.splitlines()]
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["row", "row", "row", "line", "line", "text"]))
        if how == "row" and not isinstance(lines[i], str):
            lines[i] = draw(_mutated_row(lines[i]))
        elif how == "line":
            j = draw(st.integers(0, len(lines) - 1))
            op = draw(st.sampled_from(["dup", "drop", "swap", "blank", "deep"]))
            if op == "dup":
                lines.insert(i, lines[i])
            elif op == "drop" and len(lines) > 1:
                del lines[i]
            elif op == "swap":
                lines[i], lines[j] = lines[j], lines[i]
            elif op == "blank":
                lines.insert(i, "   ")
            else:
                lines[i] = DEEP
        else:
            text = lines[i] if isinstance(lines[i], str) else _dumps(lines[i])
            op = draw(st.sampled_from(["cut", "dupkey", "garble", "bignum"]))
            if op == "bignum":  # beyond what `json` reads (4,300 digits)
                lines[i] = re.sub(r"[0-9]+", "9" * 5000, text, count=1)
            elif op == "cut":
                lines[i] = text[: draw(st.integers(0, len(text)))]
            elif op == "dupkey":
                lines[i] = text.replace("{", '{"id":"dup",', 1) if "{" in text else text
            else:
                lines[i] = draw(st.text(max_size=30))
    ascii_only = draw(st.sampled_from([False, False, True]))  # escapes: \ud800 as JSON has it
    text = "".join((x if isinstance(x, str) else _dumps(x, ascii_only)) + "\n" for x in lines)
    data = text.encode("utf-8", "surrogatepass")
    wrap = draw(st.sampled_from(["", "", "", "bom", "crlf", "gzip", "empty", "binary", "header",
                                 "utf-16", "utf-32", "latin-1"]))  # fmt: skip
    if wrap == "bom":
        data = b"\xef\xbb\xbf" + data
    elif wrap == "crlf":
        data = data.replace(b"\n", b"\r\n")
    elif wrap == "gzip":
        data = gzip.compress(data, mtime=0)
    elif wrap == "empty":
        data = b""
    elif wrap == "binary":
        data = draw(st.binary(max_size=64))
    elif wrap == "header":
        data = BASE.splitlines()[0].encode() + b"\n"
    elif wrap:
        data = text.encode(wrap, "replace" if wrap == "latin-1" else "surrogatepass")
    return data


def _dumps(v: Any, ascii_only: bool = False) -> str:
    return json.dumps(v, allow_nan=True, ensure_ascii=ascii_only)


def run_both(data: bytes) -> tuple[str, str]:
    """(outcome, detail) of `validate` and `run` on a file of `data`: ``ok`` (both accepted,
    the cells hold), ``rejected`` (both refused), ``run-refused`` (valid, but past the run's
    own limits, e.g. the KV budget), or ``crash`` with what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "trace.jsonl", Path(tmp) / "runs"
        path.write_bytes(data)
        runner = CliRunner()
        v = runner.invoke(app, ["workloads", "validate", str(path)])
        if problem := _form(v, str(path), listing=True):
            return "crash", f"validate: {problem}"
        scheduler = SCHEDULERS[len(data) % len(SCHEDULERS)]
        r = runner.invoke(app, ["run", "-w", str(path), "-s", scheduler, "--out", str(out)])
        if problem := _form(r, str(path), listing=False):
            return "crash", f"run: {problem}"
        if v.exit_code == 2:
            return (
                ("rejected", "")
                if r.exit_code == 2
                else ("crash", "run took what validate refused")
            )
        if r.exit_code == 2:
            return "run-refused", r.stderr.strip()
        broken = check_cells(out, path)
        return ("crash", f"invariant: {broken}") if broken else ("ok", "")


def _form(result: Any, source: str, *, listing: bool) -> str | None:
    """What is wrong with how a command ended, or None."""
    if "Traceback" in result.output or (
        result.exception and not isinstance(result.exception, SystemExit)
    ):
        return f"traceback: {result.exception!r}"
    if result.exit_code not in (0, 2):
        return f"exit code {result.exit_code}: {result.stderr.strip()[:300]}"
    if result.exit_code == 0:
        return None
    lines = result.stderr.splitlines()
    if not lines or not lines[0].startswith("error: "):
        return f"not an error line: {result.stderr[:300]!r}"
    if any(len(line) > 2000 for line in lines):
        return "a line longer than 2,000 characters"
    rest = lines[1:]
    if not listing and rest:
        return f"{len(lines)} lines: {result.stderr[:300]!r}"
    if any(not line.startswith(source) for line in rest):
        return f"a problem line not naming the file: {result.stderr[:300]!r}"
    return None


def check_cells(out: Path, path: Path) -> str | None:
    """The first broken result invariant of the cells under `out`, or None."""
    w = load_workload(path)
    floors = {t.id: _floor(t) for t in w.tasks}
    cells = list(out.rglob("run.json"))
    if not cells:
        return "no cell written"
    for cell in cells:
        tasks, requests = read_table(cell.parent, "tasks"), read_table(cell.parent, "requests")
        if sorted(tasks["task_id"]) != sorted(floors):
            return f"tasks {sorted(tasks['task_id'])} != {sorted(floors)}"
        jct, arrival, finish = (
            tasks[c].to_numpy(float) for c in ("jct_s", "arrival_s", "finish_s")
        )
        floor = tasks["task_id"].map(floors).to_numpy(float)
        if not (np.isfinite(jct).all() and np.isfinite(finish).all()):
            return "a JCT or finish is not finite"
        if not np.allclose(jct, finish - arrival, rtol=1e-12, atol=1e-9):
            return "JCT != finish - arrival"
        if (jct < floor * (1 - 1e-6) - 1e-9).any():
            return f"JCT below the floor: {jct.min()} vs {floor[jct.argmin()]}"
        if not (tasks["unloaded_jct_s"].to_numpy(float) >= floor * (1 - 1e-6)).all():
            return "unloaded JCT below the floor"
        if (requests["status"] != "ok").any():
            return "a call not served"
        ready, first, end = (
            requests[c].to_numpy(float) for c in ("ready_s", "first_token_s", "finish_s")
        )
        if not ((ready <= first) & (first <= end)).all():
            return "a call's times out of order"
        by_task = tasks.set_index("task_id")
        if (ready < requests["task_id"].map(by_task["arrival_s"]).to_numpy(float)).any():
            return "a call ready before its task arrived"
        if (end > requests["task_id"].map(by_task["finish_s"]).to_numpy(float)).any():
            return "a call finished after its task"
        if requests.groupby("task_id").size().to_dict() != {t.id: len(t.stages) for t in w.tasks}:
            return "calls != stages"
    return None


@cache
def _cost() -> CostModel:
    return CostModel(load_preset("a100-qwen32b"))


def _floor(task: Task) -> float:
    stages = {s.id: s for s in task.stages}

    @cache
    def done(sid: str) -> float:
        s = stages[sid]
        call = float(_cost().decode_steps_s(1, s.prompt_tokens, s.output_tokens).sum())
        return max((done(d) for d in s.deps), default=0.0) + s.delay_s + call

    return max(done(sid) for sid in stages)
