"""TOPAS's resident set R' reaches the engine as pins, and `topas-no-pins` pins nothing.

A recording subclass notes each decision's `keep_prefixes` and, at the next decision, which
prefixes the engine's view shows as kept: R' must be applied (every kept agent was asked
for, and pins that fit were made), and the ablation must never ask for or hold one.
"""

from __future__ import annotations

from typing import Any

import pytest

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.base import Decision
from topas_bench.schedulers.registry import ABLATIONS, SCHEDULERS, make_policy
from topas_bench.schedulers.view import EngineView, PrefixLocation
from topas_bench.workloads.registry import generate, run_defaults

PRESET = load_preset("a100-qwen32b")


def run_recorded(scheduler: str, workload: str = "dag4", kv: int = 20_000) -> dict[str, Any]:
    """Runs `scheduler` on a loaded, memory-bound sample; what it asked and what it held."""
    asked: list[frozenset[str]] = []
    held: list[frozenset[str]] = []
    resident_asked: list[frozenset[str]] = []
    inner = make_policy(scheduler)
    base = type(inner)

    class Recorder(base):  # type: ignore[valid-type, misc]
        def decide(self, view: EngineView) -> Decision:
            prefixes = {p.agent: p for p in view.prefixes()}
            held.append(frozenset(a for a, p in prefixes.items() if p.kept))
            d: Decision = super().decide(view)
            if d.keep_prefixes is not None:
                asked.append(d.keep_prefixes)
                resident_asked.append(
                    frozenset(a for a in d.keep_prefixes if prefixes[a].where == PrefixLocation.GPU)
                )
            return d

    inner.__class__ = Recorder
    rate = run_defaults(workload, {})[1] * 2.0
    w = generate(workload, num_tasks=16, rate_per_s=rate, seed=1, max_tokens="cap")
    cfg = SimConfig(kv_budget_tokens=kv)
    result = Simulator(w, inner, CostModel(PRESET), cfg, stand=False).run()
    return {"asked": asked, "held": held, "resident": resident_asked, "result": result}


def test_topas_resident_set_reaches_the_engine_as_pins() -> None:
    """R' is applied: some decisions pin resident prefixes and the next view shows them kept;
    and nothing is ever kept that the last decision did not ask for. (With `keep_prefixes`
    replaced by an empty set in `Topas.decide` this fails: nothing is ever asked or held.)"""
    rec = run_recorded("topas")
    assert any(rec["resident"]), "TOPAS never asked to pin a resident prefix"
    held = rec["held"]
    assert any(held), "no pin reached the engine"
    applied = 0
    for i, keep in enumerate(rec["asked"]):
        if i + 1 < len(held):
            nxt = held[i + 1]
            assert nxt <= keep, f"the engine kept {sorted(nxt - keep)} that R' left out"
            applied += bool(nxt & rec["resident"][i])
    assert applied > 0


def test_topas_no_pins_pins_nothing() -> None:
    rec = run_recorded("topas-no-pins")
    assert rec["asked"], "the ablation must still answer with an (empty) pin set"
    assert all(keep == frozenset() for keep in rec["asked"])
    assert not any(rec["held"])


@pytest.mark.parametrize(
    "name",
    [
        "topas-no-pins",
        "topas-no-joint",
        "topas-no-move-stall",
        "topas-no-preempt",
        "topas-prev-score",
    ],
)
def test_ablations_are_registered(name: str) -> None:
    assert name in ABLATIONS and name in SCHEDULERS
