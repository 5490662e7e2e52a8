"""The regime map (issue 21): its units (KV budget multiples of the agent-prefix working set,
loads against the best reference scheduler, output scales), their validation in sweep files
and flags, and (slow) the heat map, table and site slot drawn from a tiny sweep of a 2 x 2 grid."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from topas_bench.analysis.collect import collect
from topas_bench.analysis.regime import regime_markdown, regime_table
from topas_bench.analysis.report import build_report
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.spec import RunSpec
from topas_bench.sweep import load_specs
from topas_bench.sweep.run import CAPACITY_FILE
from topas_bench.units import (
    ONE_AGENT,
    check_multiple,
    load_rate,
    reference_rate,
    working_set,
)
from topas_bench.workloads.model import output_key
from topas_bench.workloads.registry import generate

# chain3's defaults: three agents of 4,096-token prefixes; a call reads 256 tokens (the input or
# its dependency's output) and writes 256; check_fits's least budget adds 2 spare tokens.
W, C = 3 * 4096, 256 + 256 + 2


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


# -- units ---------------------------------------------------------------------------------------
def test_budget_multiples_of_the_working_set() -> None:
    ws = working_set("chain3")
    assert (ws.prefix_tokens, ws.largest_prefix_tokens, ws.call_tokens) == (W, 4096, C)
    assert ws.budget_tokens(1.0) == W + C  # all fit, and one call
    assert ws.budget_tokens(ONE_AGENT) == 4096 + C  # one agent fits
    assert ws.budget_tokens(0.5) == W // 2 + C
    assert ws.budget_tokens(1.5) == math.ceil(1.5 * W) + C
    assert ws.multiple_of(ws.budget_tokens(2.0)) == pytest.approx(2.0)
    assert ws.multiple(ONE_AGENT) == pytest.approx(1 / 3)
    # dag10-wide: ten agents; its joiner reads eight outputs, its largest call
    wide = working_set("dag10-wide")
    assert wide.prefix_tokens == 10 * 4096 and wide.call_tokens == 8 * 256 + 256 + 2
    # longer outputs need more room per call (it reads one and writes one); prefixes unchanged
    assert working_set("chain3", {"output_scale": 2}).call_tokens == 512 + 512 + 2


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, "two", True, None])
def test_bad_budget_multiples(bad: object) -> None:
    with pytest.raises(TopasError, match="positive number or 'one-agent'"):
        check_multiple(bad)


def test_load_is_a_fraction_of_the_best_reference_saturation() -> None:
    caps = {"fcfs": 0.05, "lpm": 0.08, "spf": 0.07}
    assert reference_rate(caps) == ("lpm", 0.08)
    assert load_rate(0.5, caps) == pytest.approx(0.04)
    with pytest.raises(TopasError, match="at least one reference"):
        load_rate(0.5, {})


def test_output_scale_scales_every_output_and_what_reads_it() -> None:
    plain = generate("dag4", num_tasks=3, seed=1)
    half = generate("dag4", num_tasks=3, seed=1, output_scale=0.5)
    assert "output_scale" not in plain.params and half.params["output_scale"] == 0.5
    for a, b in zip(plain.tasks, half.tasks, strict=True):
        assert a.arrival_s == b.arrival_s
        outs = {output_key(a.id, s.id) for s in a.stages}
        for sa, sb in zip(a.stages, b.stages, strict=True):
            assert sb.output_tokens == sa.output_tokens // 2 == sb.max_new_tokens
            for ga, gb in zip(sa.prompt, sb.prompt, strict=True):
                assert gb.tokens == (ga.tokens // 2 if ga.key in outs else ga.tokens)
    # the MetaGPT workloads' drawn lengths scale too, the client's cap is unchanged
    tl = generate("metagpt-tl", num_tasks=2, seed=0, output_scale=2)
    base = generate("metagpt-tl", num_tasks=2, seed=0)
    assert [s.output_tokens for s in tl.tasks[0].stages] == [
        2 * s.output_tokens for s in base.tasks[0].stages
    ]
    assert {s.max_new_tokens for s in tl.tasks[0].stages} == {4096}
    with pytest.raises(TopasError, match="output_scale must be a number > 0"):
        generate("chain3", num_tasks=1, output_scale=0)


def test_run_spec_checks_its_load_reference() -> None:
    with pytest.raises(TopasError, match="unknown scheduler 'zzz'"):
        RunSpec("chain3", ("fcfs",), load=0.8, load_reference=("zzz",))
    with pytest.raises(TopasError, match="distinct schedulers"):
        RunSpec("chain3", ("fcfs",), load=0.8, load_reference=())


# -- sweep files and flags -----------------------------------------------------------------------
def test_sweep_axes_in_regime_units() -> None:
    doc = {"workloads": ["chain3"], "schedulers": "fcfs,topas", "loads": [0.5, 1.0],
           "kv_budget_multiples": ["one-agent", 1.0], "output_scales": [0.5, 1],
           "load_reference": "baselines", "tasks": 5}  # fmt: skip
    [(spec, _)] = load_specs(doc, {}, "t.toml")
    runs = spec.runs(Path("o"))
    assert len(runs) == 2 * 2 * 2  # output scales x budgets x loads
    assert spec.load_reference == ("fcfs", "lpm", "spf", "parrot", "autellix")
    half = working_set("chain3", {"output_scale": 0.5})
    by_scale = {(r.workload_params.get("output_scale", 1.0), r.kv_budget_tokens) for r in runs}
    assert by_scale == {
        (0.5, half.budget_tokens(ONE_AGENT)), (0.5, half.budget_tokens(1.0)),
        (1.0, 4096 + C), (1.0, W + C),
    }  # fmt: skip
    # x1 names no parameter: its cells keep the identities of cells made without it
    assert all(r.workload_params == {} for r in runs if r.kv_budget_tokens in (4096 + C, W + C))
    # a flag's kv budgets replace the file's multiples
    [(spec, _)] = load_specs(doc, {"kv_budgets": [20000]}, "t.toml")
    assert spec.kv_budget_multiples == () and spec.kv_budgets == (20000,)
    # a flag's rates replace the file's loads, and their reference with them
    [(spec, _)] = load_specs(doc, {"rates": [0.1]}, "t.toml")
    assert spec.rates == (0.1,) and spec.load_reference == ("fcfs",)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kv_budget_multiples": ["two"]}, "takes positive numbers or 'one-agent', got 'two'"),
        ({"kv_budget_multiples": [0]}, "`kv_budget_multiples`: a KV budget multiple must be"),
        ({"kv_budget_multiples": [1, 1]}, "`kv_budget_multiples` lists a value twice"),
        ({"kv_budget_multiples": [1], "kv_budgets": [20000]}, "either kv_budgets or kv_budget_"),
        ({"output_scales": [0.5, -1]}, "`output_scales` must be positive numbers"),
        ({"output_scales": ["x2"]}, "`output_scales` has a value of the wrong type"),
        ({"output_scales": [2], "workload_params": {"chain3": {"output_scale": 2}}},
         "sets output_scale, which `output_scales` sets"),
        ({"load_reference": "zzz"}, "`load_reference`: unknown scheduler 'zzz'"),
        ({"load_reference": "baselines", "loads": [], "rates": [0.1]},
         "`load_reference` needs `loads`"),
    ],
)  # fmt: skip
def test_bad_regime_axes(extra: dict[str, object], message: str) -> None:
    doc = {"workloads": ["chain3"], "schedulers": "fcfs", "loads": [0.8]} | extra
    with pytest.raises(TopasError) as e:
        load_specs(doc, {}, "t.toml")
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-budget-multiples", "one-agent,x"], "--kv-budget-multiples: not a list"),
        (["--kv-budget-multiples", "1", "--kv-budget", "9000"], "either kv_budgets or"),
        (["--output-scales", "0"], "`output_scales` must be positive numbers"),
        (["--load-reference", "fcfs,nope"], "unknown scheduler 'nope'"),
        (["--load-reference", "lpm", "--rate", "0.1"], "`load_reference` needs `loads`"),
    ],
)
def test_bad_regime_flags(tmp_path: Path, args: list[str], message: str) -> None:
    code, output = invoke("sweep", "-w", "chain3", "-s", "fcfs", *args, "--out", tmp_path / "o")
    assert code == 2, output
    assert message in output and "Traceback" not in output and len(output.splitlines()) == 1


def test_the_committed_regime_map_sweep_file_is_valid() -> None:
    from topas_bench.sweep import read_toml

    path = Path(__file__).resolve().parents[1] / "results" / "regime-map.toml"
    [(spec, _)] = load_specs(read_toml(path), {}, str(path), base=path.parent)
    assert len(spec.workloads) == 5 and len(spec.seeds) >= 10  # the protocol's 10 seeds
    assert {"topas", "topas-no-pins", "topas-no-joint", "topas-no-preempt"} <= set(spec.schedulers)
    assert spec.output_scales == (0.5, 1.0, 2.0) and spec.kv_budget_multiples[0] == ONE_AGENT
    assert spec.tuned is not None and spec.tuned_only  # each scheduler once, tuned
    runs = spec.runs(Path("o"))  # every group a valid run specification
    levels = len(spec.kv_budget_multiples) * len(spec.loads) * 3
    groups = {(r.workload, r.kv_budget_tokens, r.load, r.seed, str(r.workload_params))
              for r in runs}  # fmt: skip
    assert len(groups) == 5 * levels * len(spec.seeds)
    assert len({(r.workload, r.kv_budget_tokens) for r in runs}) == 5 * 3 * 3
    committed = pd.read_csv(path.parent / "regime-map" / "runs.csv.gz")
    assert set(spec.schedulers) == set(committed["scheduler_name"])  # the file is what ran


def test_the_tool_workloads_regime_map_sweep_file_is_valid() -> None:
    from topas_bench.sweep import read_toml

    path = Path(__file__).resolve().parents[1] / "results" / "regime-map-tools.toml"
    [(spec, _)] = load_specs(read_toml(path), {}, str(path), base=path.parent)
    assert spec.workloads == ("code-agent", "deep-research") and len(spec.seeds) >= 10
    assert {"topas", "topas-no-preempt", "tokencake", "astraea", "cachesage", "kairos",
            "sglang-ttl"} <= set(spec.schedulers)  # fmt: skip
    assert spec.tuned is not None and spec.tuned_only
    runs = spec.runs(Path("o"))
    # code-agent has one agent: its "one agent fits" budget is its "all fit" one
    budgets = {(r.workload, r.kv_budget_tokens) for r in runs}
    assert len([b for b in budgets if b[0] == "code-agent"]) == 2
    assert len([b for b in budgets if b[0] == "deep-research"]) == 3
    names = {s for r in runs for s in r.schedulers}
    assert names == set(spec.schedulers)  # tuned instead of, not beside, the defaults
    assert not set(spec.seeds) & set(spec.tuned.budget.seeds)


# -- the map from a tiny sweep -------------------------------------------------------------------
@pytest.mark.slow
def test_heat_map_and_table_from_a_two_by_two_sweep(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    out.mkdir()
    # the reference saturations are given (measuring them is the capacity probe's business,
    # test_sweep): lpm's is the best, so a load L runs at L x 0.1 tasks/s
    caps = [
        {"workload": "chain3", "workload_params": {}, "preset": "a100-qwen32b",
         "kv_budget_tokens": b, "scheduler": s, "capacity_tps": c}
        for b in (4096 + C, W + C) for s, c in (("fcfs", 0.06), ("lpm", 0.1))
    ]  # fmt: skip
    (out / CAPACITY_FILE).write_text(json.dumps({"capacities": caps}))
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'workloads = ["chain3"]\nschedulers = ["fcfs", "lpm", "topas", "topas-no-pins"]\n'
        'kv_budget_multiples = ["one-agent", 1.0]\nloads = [0.5, 1.0]\n'
        'load_reference = ["fcfs", "lpm"]\nseeds = [0, 1]\ntasks = 8\n'
    )
    code, output = invoke("sweep", "-c", sweep, "--out", out, "-j", "1")
    assert code == 0, output
    assert "32 cells: 32 ran" in output
    metas = [json.loads(p.read_text()) for p in out.rglob("run.json")]
    assert {tuple(m["load_reference"]) for m in metas} == {("fcfs", "lpm")}
    assert {m["identity"]["rate_per_s"] for m in metas} == {0.05, 0.1}
    coll = collect(out)
    assert coll.problems == []
    assert coll.runs["group_label"].str.startswith("load ").all()
    assert coll.runs["group_label"].str.contains("x best of fcfs/lpm").all()
    table = regime_table(build_report(coll).runs)
    assert len(table) == 4
    assert sorted(table["kv_multiple"].round(4).unique()) == [round(1 / 3, 4), 1.0]
    assert set(table["best_other_mean"]) <= {"fcfs", "lpm"}
    assert table["residency_pays"].dtype == bool
    assert set(table["verdict_mean"]) <= {"win", "loss", "tie"}
    assert set(table["residency"]) <= {"pays", "hurts", "tie"}
    assert table["vs_topas-no-pins_mean"].notna().all()
    assert (table["topas_decode_batch"] >= 1).all() and table["topas_hit_rate"].between(0, 1).all()
    md = regime_markdown(table)
    assert "## chain3" in md and "x0.33 (4,610)" in md and "x1.00 (12,802)" in md
    code, output = invoke("figures", out, "--out", tmp_path / "fig", "--strict")
    assert code == 0, output
    svg = (tmp_path / "fig" / "regime_margin_chain3.svg").read_text()
    assert "regime map" in svg and "outputs x1: mean JCT" in svg and "residency pays" in svg
    assert (tmp_path / "fig" / "regime.md").read_text() == md
    assert regime_markdown(table.iloc[0:0]).startswith("No regime grid")
    # the site's page of the sweep gives every cell of the grid TOPAS's verdict against the
    # strongest other (the committed report directories add their drawn margin maps)
    code, output = invoke("site", out, "--out", tmp_path / "site")
    assert code == 0, output
    page = (tmp_path / "site" / f"source-{out.name}.html").read_text()
    assert "Every setting: TOPAS against the strongest other" in page
    assert "4 settings" in page


def regime_cell(
    margin_mean: tuple[float, float, float] = (0.1, 0.05, 0.15),
    margin_p99: tuple[float, float, float] = (0.1, 0.05, 0.15),
    **given: object,
) -> dict[str, object]:
    """One cell of a regime table (`analysis.regime`): TOPAS's margins (point, low, high) over
    the strongest other at one setting; `given` sets the setting's columns."""
    cell: dict[str, object] = {
        "workload": "dag4", "output_scale": 1.0, "kv_budget_tokens": 16384, "kv_multiple": 1.0,
        "load": 0.8, "rate_per_s": 0.1, "seeds": "0,1", "residency_pays": False,
    }  # fmt: skip
    for name, (point, lo, hi) in (("margin_mean", margin_mean), ("margin_p99", margin_p99)):
        cell.update({name: point, f"{name}_lo": lo, f"{name}_hi": hi})
    return {**cell, **given}


def test_heat_map_outlines_the_cells_where_residency_pays() -> None:
    import pandas as pd

    from topas_bench.analysis.figures import pyplot
    from topas_bench.analysis.regime import regime_margin

    cells = [
        regime_cell(
            workload="chain3", kv_budget_tokens=budget, kv_multiple=multiple, load=math.nan,
            rate_per_s=rate, margin_p99=(-0.2, -0.3, 0.1),
            residency_pays=budget == 12802 and rate == 0.1,
        )
        for budget, multiple in ((4610, 1 / 3), (12802, 1.0))
        for rate in (0.05, 0.1)  # a rate grid: no loads
    ]  # fmt: skip
    plt = pyplot()
    fig = regime_margin(plt, pd.DataFrame(cells))
    try:
        mean, p99 = fig.axes[0], fig.axes[1]
        outlined = [p for p in mean.patches if p.get_linewidth() > 2]
        assert len(outlined) == 1 and len([p for p in p99.patches if p.get_linewidth() > 2]) == 1
        x, y = outlined[0].get_xy()
        assert (round(x + 0.48), round(y + 0.48)) == (1, 1)  # rate 0.1, KV 12,802
        assert [t.get_text() for t in mean.get_xticklabels()] == ["0.05", "0.1"]
        assert [t.get_text() for t in mean.get_yticklabels()] == ["x0.33", "x1.00"]
        texts = [t.get_text() for t in p99.texts]
        assert "-20.0%\n[-30, +10]\n12,802 tok" in texts
        assert "rate (tasks/s)" in fig.get_supxlabel()
    finally:
        plt.close(fig)


def test_heat_map_rows_are_multiples_shared_across_output_scales() -> None:
    """One call's need grows with the outputs, so the same multiple of W is a different number
    of tokens at x0.5 and x2: a row is the multiple, not the tokens (no empty "not run" rows)."""
    import pandas as pd

    from topas_bench.analysis.figures import pyplot
    from topas_bench.analysis.regime import regime_margin

    cells = [
        regime_cell(output_scale=scale, kv_budget_tokens=int(16384 * m) + need, kv_multiple=m)
        for scale, need in ((0.5, 386), (2.0, 1538)) for m in (0.25, 1.0)
    ]  # fmt: skip
    plt = pyplot()
    fig = regime_margin(plt, pd.DataFrame(cells))
    try:
        left, right = fig.axes[0], fig.axes[2]  # x0.5 and x2 (one row each), mean JCT
        assert [t.get_text() for t in left.get_yticklabels()] == ["x0.25", "x1.00"]
        for ax, need in ((left, 386), (right, 1538)):
            texts = [t.get_text() for t in ax.texts]
            assert "not run" not in texts
            assert f"{4096 + need:,} tok" in "".join(texts)
    finally:
        plt.close(fig)


def test_a_regime_sized_tree_keeps_the_load_figure_drawable() -> None:
    import pandas as pd

    from topas_bench.analysis.curves import MAX_LOAD_ROWS, vs_load
    from topas_bench.analysis.figures import pyplot

    def setting(i: int) -> tuple[str, pd.DataFrame]:
        rows = [{"scheduler": s, "load": x, "rate_per_s": x / 10, "n_seeds": 2,
                 **{f"{c}{e}": 10.0 + i for c in ("mean_jct_s", "p99_jct_s") for e in
                    ("", "_lo", "_hi")}, "goodput_tps": math.nan}
                for s in ("fcfs", "topas") for x in (0.5, 1.0)]  # fmt: skip
        return f"chain3\nKV {i}", pd.DataFrame(rows)

    plt = pyplot()
    fig = vs_load(plt, [setting(i) for i in range(45)], {"fcfs": "C0", "topas": "C1"}, "slo")
    try:
        assert len(fig.axes) == 2 * MAX_LOAD_ROWS  # two panels a row (no goodput)
        assert f"the first {MAX_LOAD_ROWS} settings, {45 - MAX_LOAD_ROWS} more not drawn" in (
            fig._suptitle.get_text().replace("\n", " ")
        )
    finally:
        plt.close(fig)


@pytest.mark.parametrize("workload", ["metagpt-sop", "metagpt-tl"])
def test_one_calls_need_bounds_every_seeds_calls(workload: str) -> None:
    """C is read with every drawn length at its range's high end, so no call of another seed
    needs more beyond its prefix (read from a plain sample, C was up to 2% short on these two) and
    every call fits the grid's smallest budget (the sweep plans every group before any cell
    runs: one call too large would stop it)."""
    from topas_bench.runners.sim.config import check_fits, least_tokens
    from topas_bench.workloads.model import agent_key

    for scale in (0.5, 1.0, 2.0):
        params = {"output_scale": scale} if scale != 1.0 else {}
        ws = working_set(workload, params)
        for seed in range(5):
            w = generate(workload, num_tasks=80, seed=seed, **params)
            for _, s in w.stages():
                own = s.prompt[0].tokens if s.prompt[0].key == agent_key(s.agent) else 0
                assert least_tokens(s) - own <= ws.call_tokens, (scale, seed, s.id)
            check_fits(w, ws.budget_tokens(ONE_AGENT))
