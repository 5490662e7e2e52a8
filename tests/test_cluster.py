"""The simulated cluster (`runners.cluster`): one replica is the single-server simulator row for
row; a replica that gets every request is too, decode runs cut where requests reach it; every
router x scheduler finishes deterministically with the memory accounting checked after every
event; the cells it writes (replica columns, per-replica summaries, identities)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from topas_bench.cell.identity import cell_identity
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.runners.cluster.config import ClusterConfig
from topas_bench.runners.cluster.routers import ROUTERS, Cluster, Route, Router, make_router
from topas_bench.runners.cluster.sim import ClusterResult, ClusterSim
from topas_bench.runners.sglang_cpu.options import ReferenceOptions
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import SimulationError, Simulator
from topas_bench.schedulers.registry import SCHEDULERS, make_policy
from topas_bench.spec import RunSpec
from topas_bench.workloads.model import Workload
from topas_bench.workloads.registry import generate

PRESET = load_preset("a100-qwen32b")
COST = CostModel(PRESET)
BUDGET = PRESET.derived_kv_budget_tokens


def _workload(name: str, n: int, rate_scale: float = 1.0) -> Workload:
    from topas_bench.workloads.registry import run_defaults

    return generate(name, num_tasks=n, rate_per_s=run_defaults(name, {})[1] * rate_scale, seed=1)


def _cluster(w: Workload, n: int) -> Cluster:
    prefixes = {a.name: a.prefix_tokens for a in w.agents}
    return Cluster(n, kv_budget_tokens=BUDGET, prefix_tokens=prefixes, cost=COST)


def _run(w: Workload, scheduler: str, router: Router, **cfg: Any) -> ClusterResult:
    config = SimConfig(kv_budget_tokens=BUDGET, **cfg)
    policies = [make_policy(scheduler) for _ in range(router.n)]
    return ClusterSim(w, policies, COST, config, router).run()


class First(Router):
    """Every request to replica 0: the others stay idle."""

    name = "first"

    def choose(self, req: Route, now_s: float) -> int:
        return 0


@pytest.mark.parametrize("scheduler", SCHEDULERS.names())
@pytest.mark.parametrize("workload", ["metagpt-tl", "dag4"])
def test_one_replica_is_the_single_server(workload: str, scheduler: str) -> None:
    """`--replicas 1`: the same events in the same order, so every table is identical (and a
    run the single server stops, as shortest-prefill-first's out-of-memory on metagpt-tl in
    docs/schedulers.md, stops the same way)."""
    w = _workload(workload, 25)
    try:
        one = Simulator(w, make_policy(scheduler), COST, SimConfig(kv_budget_tokens=BUDGET)).run()
    except SimulationError as e:
        with pytest.raises(SimulationError) as got:
            _run(w, scheduler, make_router("cache-aware", _cluster(w, 1)))
        assert str(got.value) == str(e)
        return
    res = _run(w, scheduler, make_router("cache-aware", _cluster(w, 1)))
    for name in ("requests", "tasks", "timeline"):
        pd.testing.assert_frame_equal(
            getattr(one, name), res.table(name).drop(columns="replica"), check_exact=True
        )
    decisions = res.table("decisions").drop(columns=["replica", "wall_s"])
    pd.testing.assert_frame_equal(one.decisions.drop(columns="wall_s"), decisions)
    assert res.sim_time_s == one.sim_time_s


@pytest.mark.parametrize("scheduler", ["fcfs", "lpm", "parrot", "topas"])
@pytest.mark.parametrize("workload", ["metagpt-tl", "chain3", "dag10-wide"])
def test_cut_runs_reproduce_the_single_server(workload: str, scheduler: str) -> None:
    """Replica 0 of two gets every request: it does not know when the next one comes, runs
    decode steps on and is cut when one is routed to it; its requests must end exactly when
    the single server's do (which stops its runs at the next client event instead)."""
    w = _workload(workload, 30, rate_scale=0.7)
    one = Simulator(w, make_policy(scheduler), COST, SimConfig(kv_budget_tokens=BUDGET)).run()
    sim = ClusterSim(
        w, [make_policy(scheduler), make_policy(scheduler)], COST,
        SimConfig(kv_budget_tokens=BUDGET, check_invariants=True), First(Cluster(2)),
    )  # fmt: skip
    res = sim.run()
    assert sim.replicas[0].cuts > 0  # the mechanism under test ran
    assert len(res.replicas[1].requests) == 0
    req = res.table("requests")
    assert list(req["request_id"]) == list(one.requests["request_id"])
    for col in ("first_admitted_s", "first_token_s", "finish_s", "preemptions", "cached_tokens"):
        assert req[col].tolist() == one.requests[col].tolist(), col
    assert res.replicas[0].iterations == one.iterations


@pytest.mark.parametrize("router", ROUTERS.names())
@pytest.mark.parametrize("scheduler", ["fcfs", "spf", "topas"])
def test_every_router_finishes_deterministically(router: str, scheduler: str) -> None:
    w = _workload("metagpt-tl", 40, rate_scale=3.0)

    def once() -> tuple[ClusterResult, Router]:
        r = make_router(router, _cluster(w, 3))
        return _run(w, scheduler, r, check_invariants=True), r

    a, ra = once()
    b, _ = once()
    req = a.table("requests")
    assert len(a.table("tasks")) == len(w.tasks)
    assert len(req) == sum(len(t.stages) for t in w.tasks)
    assert req["request_id"].is_unique
    assert ra.loads == [0, 0, 0]  # every routed request was counted out again
    assert sum(a.routed) == len(req)
    for name in ("requests", "tasks", "timeline"):
        pd.testing.assert_frame_equal(a.table(name), b.table(name))


def test_routers_spread_load_differently() -> None:
    """On MetaGPT-TL every call starts with its agent's long prefix, so sglang-router's
    cache_aware sends every call of an agent to the replica its first call went to (the match
    rate is far above 0.3) until 64 more requests are in flight there than elsewhere: the
    TeamLeader's replica serves 5 calls of 9. Round-robin spreads evenly; least-load keeps
    the in-flight counts even; agent-affinity places agents on fewer replicas than that. (With
    exact lengths at 4x their default rate of 0.0047 tasks/s, where this was worked out; with
    MetaGPT's cap another agent's first call lands on the TeamLeader's replica too.)"""
    w = generate("metagpt-tl", num_tasks=60, rate_per_s=4 * 0.0047, seed=1, max_tokens="exact")
    res = {r: _run(w, "fcfs", make_router(r, _cluster(w, 4))) for r in ROUTERS.names()}
    per_agent = res["cache-aware"].table("requests").groupby("agent")["replica"].nunique()
    assert (per_agent == 1).all()
    assert max(res["cache-aware"].routed) == 5 * 60
    rr = res["round-robin"].routed
    assert max(rr) - min(rr) <= 1
    assert min(res["least-load"].routed) > 0.15 * sum(res["least-load"].routed)

    def placements(router: str) -> int:  # (agent, replica) pairs that served a call
        return int(res[router].table("requests").groupby("agent")["replica"].nunique().sum())

    assert placements("agent-affinity") < placements("least-load")


def test_oracle_lengths_reach_every_replica() -> None:
    w = _workload("dag4", 20, rate_scale=2.0)
    res = _run(w, "spf", make_router("round-robin", _cluster(w, 2)), length_hint="oracle")
    assert len(res.table("tasks")) == 20


# -- cells --------------------------------------------------------------------------------------
def _spec(**kw: Any) -> RunSpec:
    """A run spec of `kw`, with `replicas`, `router` and `router_params` as the CLI takes them."""
    flags = [kw.pop(k, None) for k in ("replicas", "router", "router_params")]
    cluster = ClusterConfig.from_flags(flags[0], flags[1], flags[2] or {})
    return RunSpec(**kw, cluster=cluster)


def _plan(tmp_path: Path, **kw: Any) -> Any:
    base: dict[str, Any] = dict(
        workload="metagpt-tl", schedulers=("fcfs",), num_tasks=30, seed=0, out=tmp_path
    )
    return plan_run(_spec(**(base | kw)))


def test_cell_files_and_identity(tmp_path: Path) -> None:
    plan = _plan(tmp_path, replicas=3, router="round-robin")
    single = _plan(tmp_path)
    assert plan.rate_per_s == pytest.approx(3 * single.rate_per_s)  # the default rate per replica
    cell = run_cell(plan, "fcfs")
    meta = json.loads((cell.run_dir / "run.json").read_text())
    assert meta["identity"]["engine"] == "sim"
    assert meta["identity"]["engine_params"] == {
        "cluster_version": 1, "replicas": 3, "router": "round-robin",
    }  # fmt: skip
    rows = meta["cluster"]["per_replica"]
    assert [r["replica"] for r in rows] == [0, 1, 2]
    assert sum(r["requests"] for r in rows) == meta["rows"]["requests"]
    assert sum(r["tasks_finished"] for r in rows) == 30
    for name in ("requests", "tasks", "timeline", "decisions"):
        df = pd.read_parquet(cell.run_dir / f"{name}.parquet")
        assert "replica" in df and set(df["replica"]) <= {0, 1, 2}
    tasks = pd.read_parquet(cell.run_dir / "tasks.parquet")
    assert tasks["replicas_used"].between(1, 3).all()
    # every setting has its own cell; the single server's identity is untouched
    dirs = {
        run_cell(_plan(tmp_path, replicas=n, router=r), "fcfs").run_dir
        for n, r in ((3, "round-robin"), (2, "round-robin"), (3, "least-load"))
    }
    dirs.add(run_cell(single, "fcfs").run_dir)
    assert len(dirs) == 4
    assert "engine_params" in json.loads((cell.run_dir / "run.json").read_text())["identity"]
    assert cell_identity(single, "fcfs").engine_params == {}
    again = run_cell(plan, "fcfs")
    assert again.cached and again.run_dir == cell.run_dir


def test_bad_cluster_input() -> None:
    with pytest.raises(TopasError, match="unknown router 'nope'"):
        _spec(workload="dag4", schedulers=("fcfs",), num_tasks=5, replicas=2, router="nope")
    with pytest.raises(TopasError, match="need --replicas"):
        _spec(workload="dag4", schedulers=("fcfs",), num_tasks=5, router="round-robin")
    with pytest.raises(TopasError, match="positive integer"):
        _spec(workload="dag4", schedulers=("fcfs",), num_tasks=5, replicas=0)
    with pytest.raises(TopasError, match="unknown parameter 'x'; valid: cache_threshold"):
        _spec(workload="dag4", schedulers=("fcfs",), num_tasks=5, replicas=2,
              router_params={"x": 1})  # fmt: skip
    with pytest.raises(TopasError, match="cache_threshold must be a number"):
        _spec(workload="dag4", schedulers=("fcfs",), num_tasks=5, replicas=2,
              router_params={"cache_threshold": "high"})  # fmt: skip
    with pytest.raises(TopasError, match="sglang-cpu runs one server"):
        _spec(workload="dag4", schedulers=("fcfs",), num_tasks=5, replicas=2,
              engine=ReferenceOptions())  # fmt: skip


def test_cli_run_cluster(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["run", "-w", "dag4", "-s", "fcfs,lpm", "-n", "12", "--replicas", "2", "--router",
            "agent-affinity", "--router-param", "balance_abs_threshold=1",
            "--out", str(tmp_path)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (
        "cluster: 2 replicas behind router agent-affinity (balance_abs_threshold=1)" in res.output
    )
    assert "fcfs: 2 replicas (min/median/max): requests" in res.output
    meta = json.loads(next(tmp_path.rglob("run.json")).read_text())
    assert meta["identity"]["engine_params"]["router_params"] == {"balance_abs_threshold": 1}
    assert "replicas_per_agent" in meta["cluster"]["router_stats"]
    bad = runner.invoke(app, ["run", "-w", "dag4", "-n", "3", "--router", "round-robin"])
    assert bad.exit_code == 2 and "need --replicas" in bad.output
    bad = runner.invoke(app, ["run", "-w", "dag4", "-n", "3", "--replicas", "2", "--router", "x"])
    assert bad.exit_code == 2 and "unknown router 'x'; known: round-robin" in bad.output


def test_sweep_over_replicas_and_routers(tmp_path: Path) -> None:
    from topas_bench.sweep.run import run_sweep
    from topas_bench.sweep.spec import SweepSpec

    spec = SweepSpec(
        workloads=("dag4",), schedulers=("fcfs",), num_tasks=10, replicas=(1, 2),
        routers=("round-robin", "workflow-aware"), tasks_per_replica=True,
    )  # fmt: skip
    result = run_sweep([spec], tmp_path, jobs=1)
    assert result.cells == 4 and not result.failed
    seen = set()
    for path in tmp_path.rglob("run.json"):
        meta = json.loads(path.read_text())
        ident = meta["identity"]
        n = ident["engine_params"]["replicas"]
        assert ident["num_tasks"] == 10 * n  # tasks_per_replica
        seen.add((n, ident["engine_params"]["router"]))
    assert seen == {(1, "round-robin"), (2, "round-robin"), (1, "workflow-aware"),
                    (2, "workflow-aware")}  # fmt: skip
    with pytest.raises(TopasError, match="need `replicas`"):
        SweepSpec(workloads=("dag4",), schedulers=("fcfs",), routers=("round-robin",))


@pytest.mark.slow
def test_cluster_sweep_on_ray(tmp_path: Path) -> None:
    """Cluster cells on a local Ray cluster: the same cells, and results, as in this process."""
    import subprocess
    import sys

    ray = pytest.importorskip("ray", reason="the `ray` extra (make test installs it)")
    from topas_bench.analysis.collect import collect

    flags = ["sweep", "-w", "metagpt-tl", "-s", "fcfs", "-n", "24", "--replicas", "2,4",
             "--router", "cache-aware,workflow-aware"]  # fmt: skip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        cli = [sys.executable, "-c", "from topas_bench.cli import main; main()"]
        done = subprocess.run(
            [*cli, *flags, "--executor", "ray", "--address", address, "--out", str(tmp_path / "r")],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "4 cells: 4 ran, 0 already finished, 0 failed" in done.stdout
    finally:
        ray.shutdown()
    local = CliRunner().invoke(app, [*flags, "-j", "1", "--out", str(tmp_path / "l")])
    assert local.exit_code == 0, local.output
    cols = ["group", "scheduler", "seed", "workload_digest", "mean_jct_s", "p99_jct_s"]
    on_ray, here = collect(tmp_path / "r").runs, collect(tmp_path / "l").runs
    assert len(on_ray) == 4 and on_ray[cols].equals(here[cols])


def test_cluster_figure_and_table(tmp_path: Path) -> None:
    """`figures` draws JCT against replicas and writes its numbers: the report's, per router."""
    from topas_bench.analysis.collect import collect
    from topas_bench.analysis.report import build_report
    from topas_bench.sweep.run import run_sweep
    from topas_bench.sweep.spec import SweepSpec

    spec = SweepSpec(
        workloads=("dag4",), schedulers=("fcfs", "lpm"), num_tasks=8, replicas=(1, 2),
        routers=("round-robin", "cache-aware"), tasks_per_replica=True, seeds=(0, 1),
    )  # fmt: skip
    run_sweep([spec], tmp_path / "runs", jobs=1)
    res = CliRunner().invoke(
        app, ["figures", str(tmp_path / "runs"), "--out", str(tmp_path / "f"), "--strict"]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "f" / "cluster_jct_vs_replicas.png").is_file()
    table = pd.read_csv(tmp_path / "f" / "cluster.csv")
    assert len(table) == 2 * 2 * 2  # routers x replicas x schedulers
    rep = build_report(collect(tmp_path / "runs"))
    row = table[(table["router"] == "cache-aware") & (table["replicas"] == 2)
                & (table["scheduler"] == "lpm")].iloc[0]  # fmt: skip
    want = rep.rows[rep.rows["group"].str.contains('"router": "cache-aware"')
                    & rep.rows["group"].str.contains('"replicas": 2')
                    & (rep.rows["scheduler"] == "lpm")].iloc[0]  # fmt: skip
    assert row["mean_jct_s"] == pytest.approx(want["mean_jct_s"], rel=1e-5)
    assert row["n_seeds"] == 2 and 0.5 <= row["busiest_share"] <= 1.0
    one = table[table["replicas"] == 1]
    assert (one["busiest_share"] == 1.0).all()
