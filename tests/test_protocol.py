"""The evaluation protocol (issue 29): paired margins, Holm's correction, verdicts, and the
tables built on them (analysis/verdict.py, analysis/protocol.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pytest

from topas_bench.analysis.protocol import (
    GROUP_KEY,
    best_others,
    levers,
    representatives,
    tuning_table,
    versus,
    with_variants,
)
from topas_bench.analysis.verdict import MIN_SEEDS, holm, paired, verdicts


def test_paired_margin_interval_and_p() -> None:
    focus = np.array([90.0, 80.0, 100.0, 95.0, 85.0, 88.0, 92.0, 97.0, 83.0, 91.0])
    other = focus * 1.1  # 10% slower on every seed
    c = paired(focus, other)
    assert c.margin == pytest.approx(1 - 1 / 1.1)
    assert c.lo == pytest.approx(c.margin) and c.hi == pytest.approx(c.margin)
    assert c.p == 0.0 and c.ahead == 10 and c.n_seeds == 10
    same = paired(focus, focus)
    assert same.margin == 0.0 and same.p == 1.0 and same.ahead == 0  # identical: never a verdict


def test_the_interval_excludes_zero_exactly_when_p_is_below_the_level() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        a = rng.uniform(50, 100, 10)
        b = a * rng.normal(1.03, 0.05, 10)
        c = paired(a, b)
        assert (c.lo > 0 or c.hi < 0) == (c.p < 0.05) or math.isclose(c.p, 0.05, abs_tol=2e-4)


def test_paired_is_deterministic_and_refuses_what_it_cannot_pair() -> None:
    a, b = [1.0, 2.0, 3.0], [1.5, 2.5, 2.9]
    assert paired(a, b) == paired(a, b)
    for bad in (([], []), ([1.0], [1.0, 2.0]), ([math.nan, 1.0], [1.0, 1.0])):
        assert not paired(*bad).usable


def test_holm_step_down() -> None:
    # textbook: p = 0.01, 0.04, 0.03, 0.005 -> sorted 0.005 x4, 0.01 x3, 0.03 x2, 0.04 x1
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == []
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1, monotone


def test_a_family_of_noise_makes_a_lone_significant_cell_a_tie() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(80, 100, 10)
    # ahead on 8 of 10 seeds by a small margin: significant alone, not among 200 cells
    b = a * np.array([1.02, 1.03, 1.01, 1.02, 0.99, 1.03, 1.02, 0.995, 1.02, 1.01])
    cell = paired(a, b)
    assert 0 < cell.p < 0.05
    assert verdicts([cell]) == [(pytest.approx(cell.p), "win")]
    noise = [paired(a, a * rng.normal(1.0, 0.05, 10)) for _ in range(199)]
    (p_adj, word), *_ = verdicts([cell, *noise])
    assert word == "tie" and p_adj > 0.05


def test_too_few_seeds_is_a_tie_outside_the_family() -> None:
    few = paired([1.0, 1.0], [2.0, 2.0])  # every resample says 50% faster, on 2 seeds
    assert few.n_seeds < MIN_SEEDS and not few.usable
    clear = paired([1.0] * 5, [2.0] * 5)
    assert verdicts([few, clear]) == [(1.0, "tie"), (0.0, "win")]


def test_a_loss_is_a_loss() -> None:
    c = paired([2.0, 2.1, 1.9, 2.0], [1.0, 1.1, 0.9, 1.0])
    assert c.margin < 0 and verdicts([c])[0][1] == "loss"


# -- tables from runs ------------------------------------------------------------------------


class FakeTuned:
    def __init__(self, params: dict[str, dict[str, Any]]) -> None:
        self.params = params

    def params_for(self, name: str) -> dict[str, Any]:
        if name in self.params:
            return dict(self.params[name])
        if name.startswith("topas-"):  # an ablation inherits TOPAS's
            return dict(self.params.get("topas", {}))
        return {}

    def is_tuned(self, name: str, params: Mapping[str, Any]) -> bool:
        covered = name in self.params or (name.startswith("topas-") and "topas" in self.params)
        return covered and dict(params) == self.params_for(name)


def _runs(spec: dict[tuple[str, str], list[float]], workload: str = "dag4") -> pd.DataFrame:
    """Per (name, params JSON): per-seed mean JCT (p99 = 1.5 x mean)."""
    rows = []
    for (name, params), values in spec.items():
        p = json.loads(params)
        label = name + ("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in p.items()) + "]"
                        if p else "")  # fmt: skip
        for seed, v in enumerate(values):
            rows.append({"workload": workload, "engine": "sim", "group_label": "load 0.8",
                         "scheduler": label, "scheduler_name": name,
                         "scheduler_params": params, "seed": seed, "mean_jct_s": v,
                         "p99_jct_s": 1.5 * v})  # fmt: skip
    return pd.DataFrame(rows)


SEEDS = 10
BASE = [100.0 + 3 * i for i in range(SEEDS)]


def _scaled(x: float) -> list[float]:
    return [v * x for v in BASE]


def test_representatives_prefer_the_tuned_variant_and_keep_defaults_visible() -> None:
    tuned = FakeTuned({"lpm-aging": {"k": 8}, "topas": {"beta": 0.5}})
    runs = _runs({
        ("topas", "{}"): _scaled(0.95), ("topas", '{"beta": 0.5}'): _scaled(0.9),
        ("lpm-aging", "{}"): _scaled(1.2), ("lpm-aging", '{"k": 8}'): _scaled(1.0),
        ("fcfs", "{}"): _scaled(1.1), ("topas-no-pins", '{"beta": 0.5}'): _scaled(0.92),
        ("topas-no-pins", "{}"): _scaled(0.97),
    })  # fmt: skip
    v = with_variants(runs, tuned)
    assert dict(zip(v["scheduler"], v["variant"], strict=False))["lpm-aging[k=8]"] == "tuned"
    reps = representatives(v)
    assert reps == {"topas": "topas[beta=0.5]", "lpm-aging": "lpm-aging[k=8]", "fcfs": "fcfs",
                    "topas-no-pins": "topas-no-pins[beta=0.5]"}  # fmt: skip
    table = versus(runs, "topas", tuned)
    # TOPAS's variants are levers, not others; each other once per metric
    assert sorted(set(table["other"])) == ["fcfs", "lpm-aging[k=8]"]
    assert len(table) == 4 and set(table["metric"]) == {"mean", "p99"}
    row = table[(table["other"] == "lpm-aging[k=8]") & (table["metric"] == "mean")].iloc[0]
    assert row["margin"] == pytest.approx(0.1) and row["verdict"] == "win"
    assert row["other_variant"] == "tuned" and row["focus"] == "topas[beta=0.5]"
    lev = levers(runs, ["topas-no-pins", "topas-no-joint"], "topas", tuned)
    assert set(lev["other"]) == {"topas-no-pins[beta=0.5]"}  # the tuned ablation, present only
    assert lev.iloc[0]["margin"] == pytest.approx(1 - 0.9 / 0.92)
    tun = tuning_table(runs, tuned)
    assert set(tun["other_name"]) == {"topas", "lpm-aging", "topas-no-pins"}
    # a scheduler whose tuning kept its defaults: its default run is its tuned form
    kept = FakeTuned({"fcfs": {}})
    assert with_variants(runs, kept).set_index("scheduler")["variant"]["fcfs"].iloc[0] == "tuned"
    aging = tun[(tun["other_name"] == "lpm-aging") & (tun["metric"] == "mean")].iloc[0]
    assert aging["margin"] == pytest.approx(1 - 1.0 / 1.2) and aging["verdict"] == "win"


def test_without_a_tuned_file_every_parameterised_run_is_custom() -> None:
    runs = _runs({("topas", "{}"): _scaled(0.9), ("lpm-aging", '{"k": 8}'): _scaled(1.0)})
    v = with_variants(runs, None)
    assert list(v.drop_duplicates("scheduler")["variant"]) == ["default", "custom"]
    assert representatives(v)["lpm-aging"] == "lpm-aging[k=8]"  # the only form it ran in


def test_versus_pairs_by_seed_and_counts_the_best_other() -> None:
    noisy = [v * (1.0 + (0.3 if i == 0 else -0.01)) for i, v in enumerate(BASE)]
    runs = pd.concat([
        _runs({("topas", "{}"): BASE, ("lpm", "{}"): noisy, ("fcfs", "{}"): _scaled(1.2)}),
        _runs({("topas", "{}"): BASE, ("lpm", "{}"): _scaled(1.01)}, workload="chain3"),
    ])  # fmt: skip
    table = versus(runs)
    dag4 = table[(table["workload"] == "dag4") & (table["metric"] == "mean")]
    lpm = dag4[dag4["other"] == "lpm"].iloc[0]
    # one seed carries the mean margin: ahead on 1 of 10, never a win
    assert lpm["margin"] > 0 and lpm["ahead"] == 1 and lpm["verdict"] != "win"
    best = best_others(table)
    assert len(best) == 4  # two groups x two metrics
    first = best[(best["workload"] == "dag4") & (best["metric"] == "mean")].iloc[0]
    assert first["other"] == "lpm" and first["n_others"] == 2 and first["n_win"] == 1
    assert list(best.columns[: len(GROUP_KEY)]) == GROUP_KEY
