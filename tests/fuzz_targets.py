"""Hostile inputs and how each must be handled (issue 13), shared by the fuzz suite
(`tests/test_fuzz.py`, a few hundred examples per target on every test run) and its census
(`benchmarks/fuzz_census.py`, thousands, with the counts docs/reliability.md reports).

Targets: workload trace files (`workloads validate`), recorded MetaGPT call traces
(`trace import`), command-line flags (`run`, `sweep`), and task metadata in `custom_params`
(the SGLang plugin's `Tracker.add`). Each input is classified:

- ``ok``: accepted;
- ``rejected``: exit code 2 with one line on stderr starting ``error:`` (a trace's problems
  may follow it, one per line) and no traceback; typer's own usage errors (exit 2, ``Usage:``)
  count too;
- ``fallback``: the plugin served the request as an independent task and counted the reason;
- ``crash``: anything else (a traceback, another exit code, an exception out of the plugin),
  or a half-written file left behind. The goal is none.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from typer.testing import CliRunner

from topas_bench.cell.stored import check_cell
from topas_bench.cli import app
from topas_bench.runners.sglang.metadata import KEY, encode
from topas_bench.runners.sglang.tracker import Tracker
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import dumps_workload

DATA = Path(__file__).parent / "data" / "metagpt"
OUTCOMES = ("ok", "rejected", "fallback", "crash")


# -- JSON values and mutations ---------------------------------------------------------------------
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "s0", "A", "agent:A", "t0000/s0/out", "c0", "\u00e9\u4e2d\U0001f600"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(v: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, (*at, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _paths(x, (*at, i))
    return out


def _set(v: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(v, dict):
        return {**v, head: _set(v[head], rest, new)}
    return [_set(x, rest, new) if i == head else x for i, x in enumerate(v)]


def _drop(v: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        if isinstance(v, dict):
            return {k: x for k, x in v.items() if k != path[0]}
        return [x for i, x in enumerate(v) if i != path[0]]
    head = path[0]
    if isinstance(v, dict):
        return {**v, head: _drop(v[head], path[1:])}
    return [_drop(x, path[1:]) if i == head else x for i, x in enumerate(v)]


@st.composite
def mutated_json(draw: st.DrawFn, value: Any) -> Any:
    """`value` with one to three of its nodes replaced by random JSON or dropped."""
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(value)))
        if draw(st.booleans()) and path:
            value = _drop(value, path)
        else:
            value = _set(value, path, draw(JSON))
    return value


#: JSON nested deeper than Python's recursion limit: `json.loads` raises RecursionError on it
DEEP = '{"id": ' + "[" * 100_000 + "]" * 100_000 + "}"


def _parsed(line: str) -> Any:
    """`line` as JSON if it is (an earlier mutation may have garbled it), else None."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


@st.composite
def mutated_lines(draw: st.DrawFn, lines: list[str]) -> str:
    """JSONL text with lines mutated as JSON, or the text cut, spliced or garbled."""
    lines = list(lines)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(["json", "json", "cut", "dup", "drop", "garble", "swap", "deep"])
        )
        i = draw(st.integers(0, len(lines) - 1))
        if how == "deep":
            lines[i] = DEEP
        elif how == "json" and (obj := _parsed(lines[i])) is not None:
            lines[i] = json.dumps(draw(mutated_json(obj)), allow_nan=True)
        elif how == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif how == "dup":
            lines.insert(i, lines[i])
        elif how == "drop" and len(lines) > 1:
            del lines[i]
        elif how == "garble":
            lines[i] = draw(st.text(max_size=40))
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n", "\r\n"]))


# -- classifying a CLI outcome -------------------------------------------------------------------
def classify(result: Any) -> str:
    if "Traceback" in result.output:
        return "crash"
    if result.exit_code == 0 and result.exception is None:
        return "ok"
    if result.exit_code == 2 and isinstance(result.exception, SystemExit):
        lines = result.stderr.strip().splitlines()
        if lines and (lines[0].startswith("error: ") or "Usage:" in result.stderr):
            return "rejected"
    return "crash"


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def leftovers(root: Path) -> list[Path]:
    """Half-written things under `root`: temporary files or cell directories, and cells that
    do not verify."""
    bad = [p for p in root.rglob("*") if p.name.endswith(".tmp") or ".tmp-" in p.name]
    bad += [p.parent for p in root.rglob("run.json") if check_cell(p.parent) is not None]
    return bad


# -- workload trace files ------------------------------------------------------------------------
VALID_TRACE = dumps_workload(generate("dag4", num_tasks=2, seed=0, prefix_tokens=64))
workload_files = mutated_lines(VALID_TRACE.splitlines())


def check_workload_file(text: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.jsonl"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        return classify(invoke("workloads", "validate", path, "--kv-budget", "20000"))


# -- recorded call traces ------------------------------------------------------------------------
RECORDED = (DATA / "sop-2048-offline.jsonl").read_text().splitlines()[:8]
recorded_traces = mutated_lines(RECORDED)


def check_recorded_trace(text: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "calls.jsonl", Path(tmp) / "out" / "w.jsonl"
        src.write_text(text, encoding="utf-8", errors="surrogatepass")
        out.parent.mkdir()
        outcome = classify(invoke("trace", "import", src, "-o", out, "-n", "2", "--rate", "0.1"))
        if (outcome != "ok" and out.exists()) or leftovers(out.parent):
            return "crash"  # a half-written (or written-though-rejected) file
        return outcome


# -- command-line flags --------------------------------------------------------------------------
JUNK = st.text(max_size=10)
NUMBERS = st.one_of(
    st.integers(-3, 8).map(str), st.sampled_from(["0", "-0", "1e9", "nan", "inf", "-inf", "0.0",
    "1e-300", "3.5", "", " ", "0x10"]), JUNK,
)  # fmt: skip
FLAGS: dict[str, st.SearchStrategy[str]] = {
    "--tasks": st.one_of(st.integers(-2, 6).map(str), JUNK),
    "--rate": NUMBERS,
    "--seed": st.one_of(st.integers(-2, 3).map(str), JUNK),
    "--kv-budget": st.one_of(st.sampled_from(["1", "300", "5000", "18692", "0", "-5"]), JUNK),
    "--host-tier-tokens": st.one_of(st.sampled_from(["0", "1000", "-1"]), JUNK),
    "--length-hint": st.one_of(st.sampled_from(["none", "oracle"]), JUNK),
    "--preset": st.one_of(
        st.sampled_from(["a100-qwen32b", "h100-llama8b", "nope", "/nonexistent.toml", "tests"]),
        JUNK,
    ),
    "--workload-param": st.one_of(
        st.builds(
            "{}={}".format,
            st.sampled_from(
                ["prefix_tokens", "input_tokens", "output_tokens", "delay_s", "nope", ""]
            ),
            NUMBERS,
        ),
        JUNK,
    ),
    "--scheduler-param": st.one_of(
        st.builds(
            "{}.{}={}".format,
            st.sampled_from(["topas", "lpm", "autellix", "fcfs", "x"]),
            st.sampled_from(["beta", "rho", "K", "fallback_above", "levels", "nope"]),
            NUMBERS,
        ),
        JUNK,
    ),
}


def _mostly(valid: list[str], invalid: list[str]) -> st.SearchStrategy[str]:
    """Three draws in four valid, so that many runs get past the first check."""
    good = st.sampled_from(valid)
    return st.one_of(good, good, good, st.one_of(st.sampled_from(invalid), JUNK))


WORKLOADS = _mostly(["chain3", "dag4", "metagpt-sop"], ["nope", "", "metagpt-replay"])
SCHEDULERS = _mostly(
    ["fcfs", "lpm,topas", "all", "baselines", "autellix,spf"], ["fcfs,fcfs", ",", "nope", ""]
)


@st.composite
def run_args(draw: st.DrawFn) -> list[str]:
    """`run` or `sweep` with a few random flags; small task counts (`--tasks` is drawn from
    -2..6) so every accepted run finishes in well under a second."""
    command = draw(st.sampled_from(["run", "sweep"]))
    args = [command, "-w", draw(WORKLOADS), "-s", draw(SCHEDULERS), "-n", "3"]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=3, unique=True)):
        value = draw(FLAGS[flag])
        args += ["--seeds" if command == "sweep" and flag == "--seed" else flag, value]
    if command == "sweep":
        args += ["-j", "1"]
    return args


def check_run_args(args: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runs"
        outcome = classify(invoke(*args, "--out", out))
        if out.exists() and leftovers(out):
            return "crash"
        return outcome


# -- task metadata in custom_params -------------------------------------------------------------
_TASK = generate("dag4", num_tasks=1, seed=0, prefix_tokens=30, input_tokens=5, output_tokens=4)
VALID_RECORD = json.loads(encode(_TASK.tasks[0], _TASK.tasks[0].stages[3], 1000.0, 30)[KEY])
custom_params = st.one_of(
    JSON,
    st.builds(lambda r: {KEY: r}, JSON),
    st.builds(lambda r: {KEY: json.dumps(r, allow_nan=True)}, mutated_json(VALID_RECORD)),
    st.builds(lambda r: {KEY: r}, mutated_json(VALID_RECORD)),
    st.builds(
        lambda n, s: {KEY: json.dumps(VALID_RECORD)[:n] + s},
        st.integers(0, 400),
        st.text(max_size=5),
    ),
    st.sampled_from([{KEY: DEEP}, {KEY: "9" * 5000}, {KEY: '{"v": 1' + "}" * 9}]),
)


@dataclass
class PluginState:
    """One tracker fed every drawn request, as one server would be."""

    tracker: Tracker = field(
        default_factory=lambda: Tracker(
            ServiceEstimator(CostModel(load_preset("a100-qwen32b"))),
            clock=lambda: 100.0,
            unix_clock=lambda: 1100.0,
        )
    )
    n: int = 0


@dataclass
class _Params:
    custom_params: Any
    max_new_tokens: int = 4


@dataclass
class _Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: _Params
    output_ids: list[int] = field(default_factory=list)

    def finished(self) -> bool:
        return False


def check_custom_params(state: PluginState, custom: Any) -> str:
    state.n += 1
    before = sum(state.tracker.untagged.values())
    try:
        state.tracker.sync([_Req(f"r{state.n}", list(range(64)), _Params(custom))], [])
    except Exception:
        return "crash"
    return "fallback" if sum(state.tracker.untagged.values()) > before else "ok"


TARGETS: dict[str, tuple[st.SearchStrategy[Any], Callable[..., str]]] = {
    "workload files": (workload_files, check_workload_file),
    "recorded traces": (recorded_traces, check_recorded_trace),
    "CLI flags": (run_args(), check_run_args),
    "custom_params": (custom_params, check_custom_params),
}
