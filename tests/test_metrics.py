"""Request-level metrics, goodput and per-stage latencies against hand-computed values."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from topas_bench.analysis.metrics import RunTables, Slo, stage_summary, summarize
from topas_bench.errors import TopasError
from topas_bench.runners.records import REQUEST_COLUMNS
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import load_preset
from topas_bench.unloaded import unloaded_jct
from topas_bench.workloads.registry import generate


def request(kind: str, ready: float, admitted: float, first: float, finish: float, out: int,
            status: str = "ok") -> dict[str, object]:  # fmt: skip
    return dict.fromkeys(REQUEST_COLUMNS, 0) | {
        "kind": kind, "ready_s": ready, "first_admitted_s": admitted, "admitted_s": admitted,
        "first_token_s": first, "finish_s": finish, "output_tokens": out, "status": status,
    }  # fmt: skip


REQUESTS = pd.DataFrame(
    [
        request("plan", 0.0, 1.0, 2.0, 12.0, 11),  # TTFT 2, TPOT 1.0 s, queue 1, latency 12
        request("plan", 10.0, 10.0, 10.5, 12.5, 5),  # TTFT 0.5, TPOT 0.5 s, queue 0, latency 2.5
        request("code", 20.0, 24.0, 25.0, 25.0, 1),  # TTFT 5, no TPOT (one token), queue 4
        request("code", 30.0, 31.0, 40.0, 50.0, 9, status="failed"),  # not finished: left out
    ]
)
TASKS = pd.DataFrame({
    "task_id": ["a", "b"], "arrival_s": [0.0, 10.0], "finish_s": [12.5, 25.0],
    "jct_s": [12.5, 15.0], "unloaded_jct_s": [10.0, 5.0],
})  # fmt: skip


def test_request_metrics_by_hand() -> None:
    m = summarize(RunTables(TASKS, REQUESTS, pd.DataFrame(), {}))
    assert m["ttft_mean_s"] == pytest.approx((2 + 0.5 + 5) / 3)
    assert m["tpot_mean_ms"] == pytest.approx((1.0 + 0.5) / 2 * 1e3)
    assert m["itl_mean_ms"] == pytest.approx((10 + 2) / (10 + 4) * 1e3)  # token-weighted
    assert m["queue_mean_s"] == pytest.approx((1 + 0 + 4) / 3)
    assert m["latency_mean_s"] == pytest.approx((12 + 2.5 + 5) / 3)
    assert m["request_tps"] == pytest.approx(3 / 25.0)  # span: first arrival -> last finish
    assert m["output_tok_s"] == pytest.approx(17 / 25.0)
    # SLO 2x unloaded: a (12.5 <= 20) met, b (15 > 10) missed
    assert m["slo_attainment"] == 0.5 and m["goodput_tps"] == pytest.approx(1 / 25.0)
    fixed = summarize(RunTables(TASKS, REQUESTS, pd.DataFrame(), {}, Slo(seconds=20)))
    assert fixed["slo_attainment"] == 1.0 and fixed["goodput_tps"] == pytest.approx(2 / 25.0)


def test_goodput_needs_unloaded_jcts_for_a_multiple() -> None:
    old = TASKS.drop(columns=["unloaded_jct_s"])  # a run recorded before goodput
    m = summarize(RunTables(old, REQUESTS, pd.DataFrame(), {}))
    assert math.isnan(m["goodput_tps"]) and math.isnan(m["slo_attainment"])
    assert (
        summarize(RunTables(old, REQUESTS, pd.DataFrame(), {}, Slo(seconds=13)))["slo_attainment"]
        == 0.5
    )


def test_stage_summary() -> None:
    s = stage_summary(REQUESTS)
    assert s["plan"] == {
        "calls": 2.0, "mean_latency_s": 7.25, "p99_latency_s": pytest.approx(2.5 + 0.99 * 9.5),
        "mean_queue_s": 0.5, "mean_ttft_s": 1.25,
    }  # fmt: skip
    assert s["code"]["calls"] == 1.0


def test_slo_parse() -> None:
    assert Slo.parse("3x") == Slo(multiple=3.0)
    assert Slo.parse("300s") == Slo(seconds=300.0) == Slo.parse("300")
    assert Slo.parse("2.5X").describe() == "JCT <= 2.5 x the task's unloaded JCT"
    for bad in ("fast", "-1x", "0s", "x"):
        with pytest.raises(TopasError):
            Slo.parse(bad)


def test_unloaded_jct_is_each_task_alone() -> None:
    preset = load_preset("a100-qwen32b")
    w = generate("chain3", num_tasks=5, rate_per_s=100.0)  # arriving at once: heavily loaded
    solo = unloaded_jct(w, preset, SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens))
    assert sorted(solo) == sorted(t.id for t in w.tasks)
    # chain3's tasks are identical: alone (warm cache after the first), each takes the same
    later = [solo[t.id] for t in sorted(w.tasks, key=lambda t: t.arrival_s)[1:]]
    assert max(later) == pytest.approx(min(later))
    assert solo[min(w.tasks, key=lambda t: t.arrival_s).id] >= later[0]  # cold prefix cache
