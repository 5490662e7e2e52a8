"""Each workload's default rate is DEFAULT_LOAD x its capacity, re-measured (workloads/registry.py).
(`trace`, a file, runs at the file's own rate.)

If a generator, the cost model or the simulator changes a workload's capacity, this fails and the
capacity passed to `_add` in workloads/registry.py must be re-measured.
"""

from __future__ import annotations

import pytest

from topas_bench.experiment import measure_capacity
from topas_bench.runners.sim.cost import load_preset
from topas_bench.workloads.registry import DEFAULT_LOAD, WORKLOADS

PRESET = "a100-qwen32b"


@pytest.mark.slow
@pytest.mark.parametrize("workload", [w for w in WORKLOADS.names() if w != "trace"])
def test_default_rate_is_default_load_times_measured_capacity(workload: str) -> None:
    preset = load_preset(PRESET)
    assert preset.derived_kv_budget_tokens == 18_692  # the budget the registry comment cites
    capacity = measure_capacity(workload, (), preset, preset.derived_kv_budget_tokens)
    rate = WORKLOADS.get(workload).default_rate_per_s
    assert DEFAULT_LOAD == 0.8
    assert rate == pytest.approx(DEFAULT_LOAD * capacity, rel=0.10), (
        f"{workload}: default rate {rate} vs {DEFAULT_LOAD} x measured capacity {capacity:.4g}"
    )
