"""The fuzz suite (issue 13): hostile workload files, recorded traces, command-line flags and
task metadata. Every bad input gets a one-line error and exit code 2 (or, in the SGLang plugin,
a counted fallback): never a traceback, never a half-written file. The inputs and their
classification are in `fuzz_targets.py`; `benchmarks/fuzz_census.py` runs the same targets at
scale and counts the outcomes."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from fuzz_targets import (
    PluginState,
    check_custom_params,
    check_recorded_trace,
    check_run_args,
    check_workload_file,
    custom_params,
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
