"""The figures say their setting and separate what they compare: hand-built trees, hand numbers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from results_fixture import JCTS, write_fixture, write_one
from topas_bench.analysis.collect import collect
from topas_bench.analysis.curves import identical_groups, regime_grids
from topas_bench.analysis.figures import write_figures
from topas_bench.analysis.history import load, plot
from topas_bench.analysis.plotting import common_setting, leaders, split_label
from topas_bench.analysis.report import build_report
from topas_bench.analysis.timeline import binned, busiest_window, in_system


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture tree plus spf with lpm's JCTs (identical CDFs) and a second KV budget at both
    loads (a load x KV grid), drawn."""
    root = write_fixture(tmp_path_factory.mktemp("tree"))
    for seed, jcts in enumerate(JCTS["lpm"]):
        write_one(root, "spf", seed, [float(j) for j in jcts])
        write_one(root, "spf", seed, [0.8 * j for j in jcts], load=0.6)
    for at in (0.8, 0.6):
        for name in ("fcfs", "lpm", "spf", "topas"):
            for seed, jcts in enumerate(JCTS["lpm" if name == "spf" else name]):
                write_one(root, name, seed, [0.9 * j for j in jcts], load=at, kv=28_000)
    coll = collect(root)
    out = root / "figures"
    write_figures(coll, build_report(coll), out)
    return out


def svg(out: Path, name: str) -> str:
    """The figure's text, its lines (wrapped titles break over several) joined by spaces."""
    found = re.findall(r"<text[^>]*>([^<]*)</text>", (out / f"{name}.svg").read_text())
    return " ".join(" ".join(found).split())


def test_identical_schedulers_share_one_line(drawn: Path) -> None:
    a = np.array([1.0, 2.0, 3.0])
    groups = identical_groups({"lpm": a, "spf": a.copy(), "topas": a + 1, "x": a + 1e-6})
    assert groups == [["lpm", "spf"], ["topas"], ["x"]]
    text = svg(drawn, "jct_cdf_chain3")
    assert "lpm = spf (identical JCTs)" in text and "share one line" in text
    # one legend entry for both: spf is never named on its own
    assert "spf" not in text.replace("lpm = spf", "")


def test_relative_names_its_setting_and_what_it_leaves_out(drawn: Path) -> None:
    text = svg(drawn, "jct_relative")
    assert "a100-qwen32b" in text and "4 tasks" in text and "engine sim" in text
    assert "Not shown (other settings)" in text and "load 0.6" in text


def test_tuned_settings_are_drawn_beside_their_defaults(tmp_path: Path) -> None:
    """A `sweep --tuned` tree labels a tuned setting `name[k=v,...]`: it is still one of the
    paper's schedulers (drawn in the relative and CDF figures), TOPAS's tuned setting is always
    kept, and a tuned best baseline the title names has its row."""
    root = write_fixture(tmp_path / "tree")
    for seed, jcts in enumerate(JCTS["topas"]):
        write_one(root, "topas", seed, [1.1 * j for j in jcts], params={"beta": 2.0})
        write_one(root, "fcfs", seed, [0.5 * j for j in jcts], params={"x": 1})
    coll = collect(root)
    out = tmp_path / "figures"
    write_figures(coll, build_report(coll), out, strict=True)
    relative, cdf = svg(out, "jct_relative"), svg(out, "jct_cdf_chain3")
    assert "best baseline's (fcfs[x=1])" in relative
    for text in (relative, cdf):
        labels = text.split()  # each text element a word or more: a label stands alone
        assert {"topas[beta=2.0]", "fcfs[x=1]", "topas", "fcfs"} <= set(labels)


def test_always_shown_schedulers_bring_one_tuned_setting_each() -> None:
    """Ten settings of TOPAS (a tuning study's tree) are not all always shown: TOPAS's default
    and its best other setting are, then the leaders on the metric, to the limit."""
    rows = pd.DataFrame(
        [{"group": "g", "scheduler": f"topas[beta={b}]", "mean_jct_s": 10.0 + b} for b in range(10)]
        + [{"group": "g", "scheduler": s, "mean_jct_s": j}
           for s, j in (("topas", 12.0), ("fcfs", 30.0), ("lpm", 25.0), ("parrot", 11.5))]
    )  # fmt: skip
    shown, _ = leaders(rows, limit=6)
    assert shown[:2] == ["topas[beta=0]", "topas[beta=1]"]  # names' order: the rows'
    assert set(shown) == {"topas", "topas[beta=0]", "topas[beta=1]", "parrot", "topas[beta=2]",
                          "topas[beta=3]"}  # fmt: skip
    shown, _ = leaders(rows, limit=6, always=("topas", "lpm"))
    assert {"topas", "topas[beta=0]", "lpm"} <= set(shown) and len(shown) == 6


def test_goodput_names_its_slo(drawn: Path) -> None:
    text = svg(drawn, "jct_vs_load")
    assert "met the SLO, JCT &lt;= 2 x the task's unloaded JCT" in text


def test_regime_map_from_a_load_by_budget_grid(drawn: Path, tmp_path: Path) -> None:
    text = svg(drawn, "regime_chain3")
    # topas vs lpm at load 0.8 and KV 18,692: 1 - 20 / 27.5
    assert "+27.3%" in text and "28,000" in text and "where TOPAS wins" in text
    rows = build_report(collect(write_fixture(tmp_path / "plain"))).rows
    assert regime_grids(rows) == []  # two loads, one budget: no grid, no map


def test_setting_labels_split_outside_brackets() -> None:
    label = "rate 0.0175/s, a100-qwen32b, KV 18,692, code_tokens=[150, 750], engine_x=1"
    assert split_label(label) == [
        "rate 0.0175/s", "a100-qwen32b", "KV 18,692", "code_tokens=[150, 750]", "engine_x=1",
    ]  # fmt: skip
    rows = pd.DataFrame({
        "group": ["a", "b"], "engine": ["sim", "sim"],
        "group_label": ["load 0.8, a100-qwen32b, KV 18,692", "load 0.6, a100-qwen32b, KV 18,692"],
    })  # fmt: skip
    shared, own = common_setting(rows)
    assert shared == "a100-qwen32b, KV 18,692, engine sim"
    assert own == {"a": "load 0.8", "b": "load 0.6"}


def test_binned_spreads_a_long_iteration_over_every_bin_it_covers() -> None:
    # a 4 s decode run at value 10 from t=0, idle until 6, then 2 s at value 4
    tl = pd.DataFrame({"t_s": [0.0, 6.0], "duration_s": [4.0, 2.0]})
    edges = np.arange(0.0, 9.0, 1.0)
    values = np.array([10.0, 4.0])
    activity = binned(tl, values, edges, state=False)
    assert activity.tolist() == [10, 10, 10, 10, 0, 0, 4, 4]
    state = binned(tl, values, edges, state=True)  # what the cache holds stays while idle
    assert state.tolist() == [10, 10, 10, 10, 10, 10, 4, 4]
    half = binned(tl, values, np.array([3.0, 7.0]), state=False)  # 1 s at 10, 1 s at 4
    assert half.tolist() == [7.0]


def test_tasks_in_system_and_the_busiest_window() -> None:
    tasks = pd.DataFrame({"arrival_s": [0.0, 1.0, 5.0], "finish_s": [4.0, 2.0, 9.0]})
    assert in_system(tasks, np.array([0.5, 1.5, 3.0, 4.5, 6.0])).tolist() == [1, 2, 1, 0, 1]
    times = np.arange(10.0)
    gap = np.array([0, 0, 0, 0, 0, 0, 3, 3, 0, 0], dtype=float)
    assert busiest_window(times, gap, 0.2) == (6.0, 8.0)


def test_history_margins_in_percent(drawn: Path, tmp_path: Path) -> None:
    from topas_bench.analysis.history import append

    rep = build_report(collect(drawn.parent))
    append(rep, tmp_path / "series", "2026-12-01", "a1")
    append(rep, tmp_path / "series", "2026-12-02", "b2")
    files = plot(load(tmp_path / "series"), tmp_path / "trend", formats=("svg",))
    assert [f.name for f in files] == ["chain3.svg"]
    text = svg(files[0].parent, "chain3")
    assert "25% 30%" in text  # the mean margin, 27.3%, on a percent axis
    assert "load 0.8, rate 0.2/s, a100-qwen32b, KV 18,692, 4 tasks" in text  # titled, whole
