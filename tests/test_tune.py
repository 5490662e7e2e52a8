"""`topas-bench tune`: the grids, budget parity, a tiny multi-workload search end to end, the
tuned file and its reader, sweeps with tuned variants, and the seed separation."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import BASELINES, SCHEDULERS, make_policy
from topas_bench.sweep.run import CAPACITY_FILE
from topas_bench.tune import EVAL_SEEDS, GRIDS, TUNING_SEEDS, TuneSpec, plots, tune
from topas_bench.tune.grids import ONLY_WITH, TOPAS_VARIANTS, points, size
from topas_bench.tuned import Budget, Score, Tuned, TunedSet, dumps_tuned, load_tuned, write_tuned
from topas_bench.workloads.registry import identity_params

runner = CliRunner()
#: Parameters that are not knobs: a tunable scheduler is one with any other.
NOT_KNOBS = {"random": {"seed"}}
CAPS = {"chain3": 0.3, "dag4": 0.12}


def given_capacities(out: Path) -> None:
    """The reference saturations, given (measuring them is the capacity probe's business)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {"workload": w, "workload_params": identity_params(w, {}), "preset": "a100-qwen32b",
         "kv_budget_tokens": 18692, "scheduler": s, "capacity_tps": c}
        for w, c in CAPS.items() for s in BASELINES
    ]  # fmt: skip
    (out / CAPACITY_FILE).write_text(json.dumps({"capacities": rows}))


def tiny(out: Path, **kw: object) -> TuneSpec:
    given_capacities(out)
    base: dict[str, object] = {"workloads": ("chain3", "dag4"), "num_tasks": 6,
                               "seeds": (101,), "trials": 2, "jobs": 1, "out": out}  # fmt: skip
    return TuneSpec(**(base | kw))  # type: ignore[arg-type]


def cells(out: Path, scheduler: str) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in out.glob(f"*/{scheduler}/*/run.json")]


# -- the grids ------------------------------------------------------------------------------


def test_every_scheduler_with_a_knob_has_a_grid_and_every_value_builds() -> None:
    for name in SCHEDULERS.names():
        knobs = set(make_policy(name).params) - NOT_KNOBS.get(name, set())
        assert (name in GRIDS) == bool(knobs), name
    for name, grid in GRIDS.items():
        defaults = make_policy(name).params
        assert set(grid) <= set(defaults) - NOT_KNOBS.get(name, set()), name
        for param, values in grid.items():
            assert defaults[param] in values, (name, param)  # a study starts from the defaults
            assert len(set(map(repr, values))) == len(values), (name, param)
            for v in values:
                make_policy(name, **{param: v})
    assert set(TOPAS_VARIANTS) <= set(GRIDS)
    assert "lpm-lfu" not in GRIDS and "fcfs" not in GRIDS


def test_a_threshold_without_slru_is_one_policy() -> None:
    assert ONLY_WITH == {"slru_protected_threshold": ("eviction", "slru")}
    got = points("hrrn", GRIDS["hrrn"])
    assert got[0] == {"eviction": "lru", "slru_protected_threshold": 2}  # the defaults first
    assert size("hrrn", GRIDS["hrrn"]) == len(got) == 3 + 3  # lru, lfu, priority; slru x 3
    assert {p["slru_protected_threshold"] for p in got if p["eviction"] != "slru"} == {2}


# -- budget parity, the objective, resuming ---------------------------------------------------


def test_every_scheduler_gets_the_same_budget_and_a_small_grid_is_enumerated(
    tmp_path: Path,
) -> None:
    grids = {"kvflow": {"hold_steps": (2, 4)}, "continuum": {"memory_price": (0.5, 1.0, 2.0)}}
    spec = tiny(tmp_path, schedulers=("kvflow", "continuum"), grids=grids, trials=2)
    results, tuned = tune(spec)
    kv, co = results
    assert len(kv.trials) == 2 and kv.grid_points == 2  # enumerated: each point once
    assert sorted(json.dumps(t.params) for t in kv.trials) == ['{"hold_steps": 2}', "{}"]
    assert len(co.trials) == 2 and co.grid_points == 3  # capped at the budget
    assert co.trials[0].params == {}  # the defaults first
    for name in ("kvflow", "continuum"):  # the same samples for both: workloads x seeds
        got = {(m["identity"]["workload"], m["identity"]["seed"]) for m in cells(tmp_path, name)}
        assert got == {("chain3", 101), ("dag4", 101)}
    assert tuned.budget == spec.budget() and set(tuned.entries) == {"kvflow", "continuum"}
    assert tuned.entries["kvflow"].trials == 2 and tuned.entries["continuum"].trials == 2
    # the same command resumes the studies, which are at their budget: nothing more runs
    again, _ = tune(spec)
    assert [len(r.trials) for r in again] == [2, 2]
    assert [r.study for r in again] == [kv.study, co.study]
    # another budget is refused beside the file's; without it, a larger budget resumes the
    # study and enumerates the rest of a grid that now fits
    grids.pop("kvflow")
    larger = tiny(tmp_path, schedulers=("continuum",), grids=grids, trials=3)
    with pytest.raises(TopasError, match=r"another budget \(trials 2 -> 3\)"):
        tune(larger)
    (tmp_path / "tuned.toml").unlink()
    more, _ = tune(larger)
    assert len(more[0].trials) == 3 and len({json.dumps(t.params) for t in more[0].trials}) == 3


def test_the_objective_averages_workloads_and_seeds_against_the_best_baseline(
    tmp_path: Path,
) -> None:
    spec = tiny(tmp_path, schedulers=("topas",), grids={"topas": {"preempt_margin_s": (20.0,)}},
                seeds=(101, 102))  # fmt: skip
    (result,), tuned = tune(spec)
    assert len(result.trials) == 1 and result.best.params == {} == result.default.params

    def jct(name: str, w: str, seed: int, key: str) -> float:
        (m,) = [m for m in cells(tmp_path, name)
                if (m["identity"]["workload"], m["identity"]["seed"]) == (w, seed)]  # fmt: skip
        return float(m["summary"][key])

    ratios = {
        key: statistics.mean(
            jct("topas", w, s, key) / min(jct(b, w, s, key) for b in BASELINES)
            for w in ("chain3", "dag4") for s in (101, 102)
        )
        for key in ("mean_jct_s", "p99_jct_s")
    }  # fmt: skip
    d = result.default
    assert d.mean_ratio == pytest.approx(ratios["mean_jct_s"])
    assert d.p99_ratio == pytest.approx(ratios["p99_jct_s"])
    assert d.objective == pytest.approx((d.mean_ratio + d.p99_ratio) / 2)
    # the cells run at the load of the best baseline's given saturation
    rates = {m["identity"]["workload"]: m["identity"]["rate_per_s"]
             for m in cells(tmp_path, "topas")}  # fmt: skip
    assert rates == pytest.approx({w: 0.8 * c for w, c in CAPS.items()})
    assert tuned.entries["topas"].tuned == d.score


def test_worker_processes_run_a_trials_cells_and_plots(tmp_path: Path) -> None:
    spec = tiny(tmp_path, trials=3, jobs=2,
                grids={"topas": {"beta": (0.0, 0.5, 1.0), "rho": (0.0, 1.0, 2.0)}})  # fmt: skip
    (result,), _ = tune(spec)
    assert len(result.trials) == 3  # distinct settings: a repeated sample does not count
    assert len({json.dumps(t.params) for t in result.trials}) == 3
    files = plots(result, tmp_path / "plots")
    assert {f.name for f in files} >= {"history.png", "history.svg"}


# -- the tuned file -------------------------------------------------------------------------


def budget(**kw: object) -> Budget:
    base: dict[str, object] = {
        "trials": 30, "seeds": TUNING_SEEDS, "workloads": ("chain3", "dag4"), "tasks": 80,
        "load": 0.8, "load_reference": BASELINES, "preset": "a100-qwen32b",
        "kv_budget_tokens": 18692, "kv_budget_derived": True,
    }  # fmt: skip
    return Budget(**(base | kw))  # type: ignore[arg-type]


def entry(name: str, params: dict[str, object], grid: dict[str, tuple[object, ...]]) -> Tuned:
    return Tuned(name, params, Score(1.0, 0.9, 1.1), Score(0.95, 0.9, 1.0), 30, 99, grid, name)


def test_a_tuned_file_round_trips_and_merges(tmp_path: Path) -> None:
    path = tmp_path / "tuned.toml"
    grid = {"horizon_s": (None, 5.0), "move_charge": ("affected", "running"), "density": (True,)}
    one = TunedSet(budget(), {"topas": entry("topas", {"horizon_s": 5.0}, grid)}, str(path))
    write_tuned(path, one)
    back = load_tuned(path)
    assert back == one and dumps_tuned(back) == path.read_text()
    assert back.entries["topas"].grid["horizon_s"] == (None, 5.0)  # null as "null"
    assert "trials per scheduler" in back.describe_budget()
    assert "tuning seeds 101-103" in back.describe_budget()
    two = back.merged(TunedSet(budget(), {"lpm": entry("lpm", {}, {"fallback_above": (128,)})}))
    write_tuned(path, two)
    assert set(load_tuned(path).entries) == {"topas", "lpm"}
    with pytest.raises(TopasError, match=r"another budget \(trials 30 -> 60\)"):
        two.merged(TunedSet(budget(trials=60), {}))


def test_missing_or_malformed_tuned_files_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    cases = [
        ("", "no such tuned file"),
        ("[budget\n", "invalid TOML"),
        ("x = 1\n", "unknown key 'x'"),
        ("[schedulers]\n", "not a tuned file: `budget` is missing"),
        ("budget = 1\nschedulers = 2\n", "`budget` must be a table"),
        (dumps_tuned(TunedSet(budget(), {})).replace("tasks = 80", "tasks = 'many'"),
         "`tasks` has a value of the wrong type"),
        (dumps_tuned(TunedSet(budget(), {"lpm": entry("lpm", {"fallback_above": 1}, {})}))
         .replace("fallback_above = 1", "fallback_above = -1"), "fallback_above must be"),
    ]  # fmt: skip
    for text, needle in cases:
        path = tmp_path / "missing.toml" if not text else bad
        if text:
            bad.write_text(text)
        with pytest.raises(TopasError, match=needle) as e:
            load_tuned(path)
        assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_an_ablation_takes_tuned_topas_params_it_accepts() -> None:
    topas = {"beta": 0.5, "move_charge": "running", "reuse_users": "next"}
    tuned = TunedSet(budget(), {"topas": entry("topas", topas, {}),
                                "lpm": entry("lpm", {}, {})})  # fmt: skip
    assert tuned.params_for("topas") == topas
    # topas-no-move-stall fixes move_charge (its lever); topas-prev-score both terms
    assert tuned.params_for("topas-no-move-stall") == {"beta": 0.5, "reuse_users": "next"}
    assert tuned.params_for("topas-prev-score") == {"beta": 0.5}
    assert tuned.params_for("topas-no-pins") == topas
    assert tuned.is_tuned("topas-no-pins", topas) and not tuned.is_tuned("topas-no-pins", {})
    assert tuned.is_tuned("lpm", {}) and tuned.is_tuned("lpm", {"fallback_above": 128})
    assert not tuned.is_tuned("kvflow", {}) and tuned.params_for("kvflow") == {}
    mine = entry("topas-no-pins", {"rho": 2.0}, {})
    own = TunedSet(budget(), {"topas": entry("topas", topas, {}), "topas-no-pins": mine})
    assert own.params_for("topas-no-pins") == {"rho": 2.0}  # its own entry wins
    assert own.variants(["fcfs", "topas", "topas-no-joint"]) == {
        "topas": topas, "topas-no-joint": topas,
    }  # fmt: skip


# -- sweeps and runs with tuned variants ------------------------------------------------------


def test_a_sweep_with_tuned_adds_exactly_the_tuned_variants(tmp_path: Path) -> None:
    from topas_bench.analysis.collect import collect

    tuned = TunedSet(budget(), {"lpm": entry("lpm", {"fallback_above": 64}, {}),
                                "kvflow": entry("kvflow", {}, {})})  # fmt: skip
    (tmp_path / "conf").mkdir()
    write_tuned(tmp_path / "conf" / "tuned.toml", tuned)
    out = tmp_path / "runs"
    given_capacities(out)
    sweep = tmp_path / "conf" / "s.toml"  # `tuned` relative to the sweep file's directory
    sweep.write_text('workloads = ["chain3"]\nschedulers = ["fcfs", "lpm", "kvflow"]\n'
                     'loads = [0.8]\nload_reference = "baselines"\nseeds = [0, 1]\ntasks = 5\n'
                     'tuned = "tuned.toml"\n')  # fmt: skip
    res = runner.invoke(app, ["sweep", "-c", str(sweep), "--out", str(out), "-j", "1"])
    assert res.exit_code == 0, res.output
    assert "8 cells: 8 ran" in res.stdout  # 3 defaults + lpm's tuned one, x 2 seeds
    coll = collect(out)
    assert coll.problems == []
    assert set(coll.runs["scheduler"]) == {"fcfs", "lpm", "kvflow", "lpm[fallback_above=64]"}
    # the tuned variant is in its default's group, on the same sample
    assert coll.runs.groupby(["group", "seed"])["workload_digest"].nunique().max() == 1
    assert coll.runs["group"].nunique() == 1
    again = runner.invoke(app, ["sweep", "-c", str(sweep), "--out", str(out), "-j", "1"])
    assert "8 cells: 0 ran, 8 already finished" in again.stdout  # nothing runs twice


def test_tuned_only_runs_each_scheduler_once_in_its_tuned_form(tmp_path: Path) -> None:
    from topas_bench.analysis.collect import collect

    tuned = TunedSet(budget(), {"lpm": entry("lpm", {"fallback_above": 64}, {}),
                                "kvflow": entry("kvflow", {}, {})})  # fmt: skip
    write_tuned(tmp_path / "tuned.toml", tuned)
    out = tmp_path / "runs"
    given_capacities(out)
    args = ["sweep", "-w", "chain3", "-s", "fcfs,lpm,kvflow", "--load", "0.8",
            "--load-reference", "baselines", "--seeds", "0", "-n", "5", "--out", str(out),
            "-j", "1", "--tuned", str(tmp_path / "tuned.toml"), "--tuned-only"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "3 cells: 3 ran" in res.stdout  # lpm tuned instead of default; kvflow kept its own
    assert set(collect(out).runs["scheduler"]) == {"fcfs", "kvflow", "lpm[fallback_above=64]"}
    bad = runner.invoke(app, [*args[:-3], "--tuned-only"])
    assert bad.exit_code == 2 and "`tuned_only` needs `tuned`" in bad.output


def test_run_with_tuned_prints_both_rows(tmp_path: Path) -> None:
    path = tmp_path / "tuned.toml"
    write_tuned(path, TunedSet(budget(), {"lpm": entry("lpm", {"fallback_above": 64}, {})}))
    args = ["run", "-w", "chain3", "-s", "fcfs,lpm", "-n", "4", "--rate", "0.1"]
    res = runner.invoke(app, [*args, "--tuned", str(path), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "lpm[fallback_above=64]" in res.stdout


# -- refusals -----------------------------------------------------------------------------------


def test_tuning_and_evaluation_seeds_are_disjoint() -> None:
    assert tuple(range(10)) == EVAL_SEEDS
    assert not set(TUNING_SEEDS) & set(EVAL_SEEDS)
    with pytest.raises(TopasError, match=r"tuning seeds \[9\] overlap the evaluation seeds 0-9"):
        TuneSpec(seeds=(9, 101))
    tuned = TunedSet(budget(), {"lpm": entry("lpm", {"fallback_above": 64}, {})}, "t.toml")
    from topas_bench.sweep import SweepSpec

    with pytest.raises(TopasError, match=r"seeds \[101\] are the tuning seeds of t.toml"):
        SweepSpec(workloads=("chain3",), schedulers=("lpm",), seeds=(0, 101), tuned=tuned)
    with pytest.raises(TopasError, match=r"`scheduler_params` for 'lpm', which t\.toml tunes"):
        SweepSpec(workloads=("chain3",), schedulers=("lpm",), tuned=tuned,
                  scheduler_params={"lpm": {"fallback_above": 32}})  # fmt: skip


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    tuned = tmp_path / "t.toml"
    tuned.write_text("[budget]\n")
    cases = [
        (["tune", "--seeds", "0,101"], "overlap the evaluation seeds"),
        (["tune", "--seeds", "a,b"], "--seeds: not a list of ints"),
        (["tune", "--param", "beta=-1"], "beta must be >= 0"),
        (["tune", "--param", "gamma=1"], "topas"),
        (["tune", "--param", "beta"], "--param expects [scheduler.]name=v1,v2"),
        (["tune", "-s", "topas,lpm", "--param", "beta=1"], "name the scheduler"),
        (["tune", "--trials", "0"], "--trials, --jobs and --tasks must be >= 1"),
        (["tune", "-s", "fcfs"], "fcfs has no parameters to tune; tunable: lpm, autellix"),
        (["tune", "-s", "baselines,nope"], "unknown scheduler 'nope'"),
        (["sweep", "-w", "chain3", "--tuned", str(tmp_path / "no.toml")], "no such tuned file"),
        (["sweep", "-w", "chain3", "--tuned", str(tuned)], "not a tuned file"),
        (["run", "-w", "chain3", "--tuned", str(tuned)], "not a tuned file"),
    ]
    for args, needle in cases:
        res = runner.invoke(app, [*args, "-n", "4", "--out", str(tmp_path / "o")])
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.output and len(res.stderr.splitlines()) == 1


def test_groups_keep_their_tunable_schedulers_and_grids_are_listed() -> None:
    from topas_bench.cli_tune import _schedulers

    assert _schedulers("all") == (
        "lpm", "autellix", "topas", "kvflow", "continuum", "lpm-aging", "tokencake", "astraea",
        "cachesage", "kairos", "dfs-weight", "lof", "random", "hrrn", "routing-key", "lpm-slru",
    )  # fmt: skip
    assert _schedulers("peers-2026") == (
        "tokencake", "astraea", "cachesage", "kairos", "sglang-ttl", "astraea-oracle",
    )  # fmt: skip
    assert _schedulers("paper,lpm,kvflow") == ("lpm", "autellix", "topas", "kvflow")
    res = runner.invoke(app, ["tune", "--grids"])
    assert res.exit_code == 0
    assert "kvflow (5 points): hold_steps=2,3,4,6,8" in res.stdout
    assert "topas (983,040 points):" in res.stdout


def test_the_docs_list_every_grid() -> None:
    """docs/topas.md's table of grids is `GRIDS` (TOPAS's variants are described apart)."""
    from topas_bench.tune.grids import describe

    doc = (Path(__file__).resolve().parents[1] / "docs" / "topas.md").read_text()
    table = doc.split("| scheduler | points | grid | where it comes from |")[1].split("\n\n")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    listed: dict[str, tuple[int, str]] = {}
    for names, count, grid, _ in rows:
        for name in names.strip("| ").split(", "):
            listed[name.strip("`")] = (int(count.replace(",", "")), grid.strip("`"))
    expected = {n: (size(n, g), describe(g)) for n, g in GRIDS.items() if n not in TOPAS_VARIANTS}
    assert listed == expected
