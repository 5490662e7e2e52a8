"""The fuzz suite (issue 13): hostile workload files, recorded traces, command-line flags and
task metadata. Every bad input gets a one-line error and exit code 2 (or, in the SGLang plugin,
a counted fallback): never a traceback, never a half-written file. The inputs and their
classification are in `fuzz_targets.py`; `benchmarks/fuzz_census.py` runs the same targets at
scale and counts the outcomes. Issue 30 added stored results damaged at random (never a silent
change) and the sweep and preset files in hostile encodings (`fuzz_stored.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz_stored import (
    check_encoded_preset,
    check_encoded_sweep,
    check_stored_damage,
    damages,
    encoded_presets,
    encoded_sweeps,
)
from fuzz_targets import (
    RECORDED,
    VALID_TRACE,
    PluginState,
    check_custom_params,
    check_recorded_trace,
    check_run_args,
    check_workload_file,
    custom_params,
    invoke,
    recorded_traces,
    run_args,
    workload_files,
)


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@fuzz(200)
@given(workload_files)
def test_workload_files(text: str) -> None:
    assert check_workload_file(text) != "crash", text


@fuzz(150)
@given(recorded_traces)
def test_recorded_traces(text: str) -> None:
    assert check_recorded_trace(text) != "crash", text


@fuzz(60)
@given(run_args())
def test_cli_flags(args: list[str]) -> None:
    assert check_run_args(args) != "crash", args


PLUGIN = PluginState()


@fuzz(400)
@given(custom_params)
def test_custom_params(custom: Any) -> None:
    assert check_custom_params(PLUGIN, custom) != "crash", custom
    # reasons come from a fixed set: hundreds of hostile requests, a handful of log lines
    assert len(PLUGIN.tracker.untagged) < 40, sorted(PLUGIN.tracker.untagged)


@fuzz(120)
@given(damages())
def test_stored_results_never_change_silently(damage: list[Any]) -> None:
    assert check_stored_damage(damage) != "crash", damage


@fuzz(60)
@given(encoded_sweeps)
def test_sweep_files_in_any_encoding(data: bytes) -> None:
    assert check_encoded_sweep(data) != "crash", data[:300]


@fuzz(60)
@given(encoded_presets)
def test_preset_files_in_any_encoding(data: bytes) -> None:
    assert check_encoded_preset(data) != "crash", data[:300]


# -- regressions the fuzzing found -------------------------------------------------------------
DEEP_JSON = "[" * 100_000 + "]" * 100_000


def test_json_nested_past_the_recursion_limit_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    from topas_bench.workloads.metagpt_calls import parse_calls
    from topas_bench.workloads.trace import TraceError, loads_workload

    lines = VALID_TRACE.splitlines()
    for text, parse in (
        ("\n".join([lines[0], DEEP_JSON, lines[2]]), loads_workload),
        ("\n".join([*RECORDED[:2], DEEP_JSON]), parse_calls),
        ("\n".join([lines[0], "9" * 5000]), loads_workload),
    ):
        with pytest.raises(TraceError) as e:
            parse(text)
        assert any(p.line in (2, 3) and "invalid JSON" in p.message for p in e.value.problems)
    (tmp_path / "run.json").write_text(DEEP_JSON)
    from topas_bench.cell.stored import check_cell

    assert "unreadable run.json" in (check_cell(tmp_path) or "")


def test_an_unexpected_exception_is_one_line_and_exit_70(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from topas_bench import experiment

    def bug(*_: Any, **__: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(experiment, "run_cell", bug)
    result = invoke("run", "-w", "chain3", "-s", "fcfs", "-n", "2", "--out", tmp_path)
    assert result.exit_code == 70 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("internal error: ZeroDivisionError: division by zero (")
    assert "TOPAS_BENCH_DEBUG=1" in line
    monkeypatch.setenv("TOPAS_BENCH_DEBUG", "1")
    result = invoke("run", "-w", "chain3", "-s", "fcfs", "-n", "2", "--out", tmp_path)
    assert isinstance(result.exception, ZeroDivisionError)
