"""The unloaded JCT's memo (`unloaded.Memo`): a cell of a group reuses the FCFS-alone run of the
group's sample, and nothing it returns differs from a fresh computation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from topas_bench.cell.identity import workload_digest
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import load_preset
from topas_bench.unloaded import Memo, unloaded_jct
from topas_bench.workloads.registry import generate


@pytest.fixture(scope="module")
def sample() -> tuple[Any, Any, SimConfig]:
    w = generate("dag4", num_tasks=6, seed=3)
    preset = load_preset("a100-qwen32b")
    return w, preset, SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens)


def test_the_memo_returns_what_a_fresh_run_gives(
    sample: tuple[Any, Any, SimConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    import topas_bench.unloaded as unloaded

    w, preset, sim = sample
    fresh = unloaded_jct(w, preset, sim)
    calls = []
    real = unloaded.unloaded_jct
    monkeypatch.setattr(unloaded, "unloaded_jct", lambda *a: calls.append(a) or real(*a))
    memo = Memo(size=2)
    digest = workload_digest(w)
    assert memo.get(digest, w, preset, sim) == fresh
    assert memo.get(digest, w, preset, replace(sim, record_timeline=False)) == fresh
    assert len(calls) == 1  # the timeline setting does not change an FCFS-alone run
    other = generate("dag4", num_tasks=6, seed=4)
    assert memo.get(workload_digest(other), other, preset, sim) == unloaded_jct(other, preset, sim)
    smaller = replace(sim, kv_budget_tokens=9_000)  # another engine setting: its own run
    assert memo.get(digest, w, preset, smaller) == unloaded_jct(w, preset, smaller)
    assert len(calls) == 3 and len(memo._kept) == 2  # bounded: the oldest went
    memo.get(digest, w, preset, sim)
    assert len(calls) == 4
