"""Length information (issue 21): what the client sends as max_tokens (`workloads.lengths`), and
that no policy learns a true output length it was not given.

A policy sees the engine view (`schedulers.base.EngineView`), its requests and tasks
(`RequestView`, `StageView`, `TaskView`), the shared estimator, and what a server sees of a
request (its `max_new_tokens`). The test of record runs each policy on two workloads that differ
only in their true output lengths and checks that everything reachable through those views is
identical up to the first finished call: in `cap` mode, without the oracle hint, a policy cannot
tell the two apart. The same comparison in `exact` mode, and with the oracle hint, must tell
them apart (so the comparison itself can fail).
"""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from topas_bench.analysis.collect import collect, group_label
from topas_bench.cell.identity import RunIdentity, cell_identity
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.base import RequestView
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.view import EngineView
from topas_bench.spec import RunSpec
from topas_bench.workloads import lengths
from topas_bench.workloads.metagpt_import import import_trace
from topas_bench.workloads.model import Workload
from topas_bench.workloads.registry import WORKLOADS, generate, identity_params
from topas_bench.workloads.trace import dump_workload

DATA = Path(__file__).parent / "data" / "metagpt"
SCHEDULERS = Path(__file__).resolve().parents[1] / "src" / "topas_bench" / "schedulers"
GENERATORS = [n for n in WORKLOADS.names() if n != "trace"]
POLICIES = ["fcfs", "lpm", "spf", "parrot", "autellix", "topas", "lof"]


def _outputs(w: Workload) -> list[int]:
    return [s.output_tokens for _, s in w.stages()]


# -- the setting ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GENERATORS)
def test_cap_mode_sends_the_cap_and_keeps_true_outputs(name: str) -> None:
    exact = generate(name, num_tasks=4, seed=3, max_tokens="exact")
    cap = generate(name, num_tasks=4, seed=3, max_tokens="cap")
    other = generate(name, num_tasks=4, seed=3, max_tokens="cap", max_tokens_cap=5000)
    for (_, e), (_, c), (_, o) in zip(exact.stages(), cap.stages(), other.stages(), strict=True):
        assert e.max_new_tokens == e.output_tokens
        assert c.max_new_tokens == 4096 and o.max_new_tokens == 5000
        assert c.output_tokens == o.output_tokens == e.output_tokens  # unchanged true lengths
        assert replace(c, max_new_tokens=e.max_new_tokens) == e  # nothing else differs
    assert [t.arrival_s for t in cap.tasks] == [t.arrival_s for t in exact.tasks]
    assert (cap.params["max_tokens"], cap.params["max_tokens_cap"]) == ("cap", 4096)
    assert exact.params["max_tokens"] == "exact"


@pytest.mark.parametrize("name", GENERATORS)
def test_family_defaults(name: str) -> None:
    """The MetaGPT family and the agentic workloads send an agent client's cap by default, the
    synthetic DAGs exact lengths; the registry's record of the default is the generator's."""
    w = generate(name, num_tasks=2, seed=0)
    agent_clients = name.startswith("metagpt") or name in ("code-agent", "deep-research")
    want = "cap" if agent_clients else "exact"
    assert w.params["max_tokens"] == WORKLOADS.get(name).max_tokens == want


def test_bad_settings_are_one_line_errors() -> None:
    with pytest.raises(TopasError, match="max_tokens must be one of exact, cap, got 'capped'"):
        generate("metagpt-tl", num_tasks=1, max_tokens="capped")
    with pytest.raises(TopasError, match="max_tokens_cap applies only to max_tokens=cap"):
        generate("metagpt-tl", num_tasks=1, max_tokens="exact", max_tokens_cap=5000)
    with pytest.raises(TopasError, match=r"max_tokens_cap 1,000 is below a call's output"):
        generate("metagpt-tl", num_tasks=3, max_tokens_cap=1000)
    with pytest.raises(TopasError, match="max_tokens_cap must be a positive integer"):
        generate("dag4", num_tasks=1, max_tokens="cap", max_tokens_cap=0)
    res = CliRunner().invoke(app, ["run", "-w", "dag4", "-n", "2", "-s", "fcfs",
                                   "--workload-param", "max_tokens=ignore"])  # fmt: skip
    assert res.exit_code == 2 and "max_tokens must be one of" in res.output
    assert "Traceback" not in res.output


def test_trace_files_keep_their_caps_unless_told(tmp_path: Path) -> None:
    source = generate("dag4", num_tasks=3, seed=1)
    path = tmp_path / "w.jsonl"
    dump_workload(replace(source, tasks=lengths.apply_tasks(source.tasks, "cap", 1000)), path)
    as_written = generate(str(path), num_tasks=3)
    assert {s.max_new_tokens for _, s in as_written.stages()} == {1000}
    assert as_written.params["max_tokens"] == "file"
    exact = generate(str(path), num_tasks=3, max_tokens="exact")
    assert all(s.max_new_tokens == s.output_tokens == 256 for _, s in exact.stages())
    cap = generate(str(path), num_tasks=3, max_tokens="cap", max_tokens_cap=2048)
    assert {s.max_new_tokens for _, s in cap.stages()} == {2048}
    assert _outputs(cap) == _outputs(exact)


def test_trace_import_and_replay_take_the_setting() -> None:
    path = DATA / "sop-2048-offline.jsonl"
    cap, exact = import_trace(path), import_trace(path, max_tokens="exact")
    assert {s.max_new_tokens for _, s in cap.stages()} == {4096}
    assert all(s.max_new_tokens == s.output_tokens for _, s in exact.stages())
    assert _outputs(cap) == _outputs(exact)
    assert cap.params["max_tokens"] == "cap" and exact.params["max_tokens"] == "exact"
    replay = generate("metagpt-replay", num_tasks=2, max_tokens="exact")
    assert all(s.max_new_tokens == s.output_tokens for _, s in replay.stages())


def test_trace_import_cli_flags(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    src = str(DATA / "sop-2048-offline.jsonl")
    res = CliRunner().invoke(app, ["trace", "import", src, "-o", str(out), "--max-tokens", "exact"])
    assert res.exit_code == 0, res.output
    assert "max_tokens exact" in res.output
    res = CliRunner().invoke(app, ["trace", "import", src, "-o", str(out), "--max-tokens-cap", "8"])
    assert res.exit_code == 2 and "below a call's output" in res.output
    res = CliRunner().invoke(app, ["trace", "import", src, "-o", str(out), "--max-tokens", "exact",
                                   "--max-tokens-cap", "5000"])  # fmt: skip
    assert res.exit_code == 2 and "--max-tokens-cap applies only to --max-tokens cap" in res.output


# -- identity and report ---------------------------------------------------------------------------
def test_identity_names_the_setting_unless_legacy(tmp_path: Path) -> None:
    def ident(name: str, **params: Any) -> dict[str, Any]:
        plan = plan_run(RunSpec(workload=name, schedulers=("fcfs",), num_tasks=2,
                                workload_params=params, out=tmp_path))  # fmt: skip
        got = dict(cell_identity(plan, "fcfs").workload_params)
        # the sweep's capacity key (the same function, without generating) agrees
        assert got == identity_params(plan.workload_name, plan.workload_params)
        return got

    cap = {"max_tokens": "cap", "max_tokens_cap": 4096}
    assert ident("metagpt-tl") == cap == ident("metagpt-tl", max_tokens_cap=4096)
    assert ident("metagpt-tl", max_tokens="exact") == {}  # as every cell made before
    assert ident("metagpt-tl", max_tokens_cap=6000) == {**cap, "max_tokens_cap": 6000}
    assert ident("dag4") == {} == ident("dag4", max_tokens="exact")
    assert ident("dag4", max_tokens="cap") == cap
    path = tmp_path / "d.jsonl"
    dump_workload(generate("dag4", num_tasks=2), path)
    assert ident(str(path)) == {"file": str(path)}
    assert ident(str(path), max_tokens="exact") == {"file": str(path), "max_tokens": "exact"}


def test_old_cells_read_as_exact() -> None:
    base = dict(workload="metagpt-tl", num_tasks=60, rate_per_s=0.0047, seed=0, scheduler="fcfs",
                preset="a100-qwen32b", kv_budget_tokens=18692)  # fmt: skip
    old = RunIdentity(**base)  # type: ignore[arg-type]
    assert group_label(old, 0.8).endswith("60 tasks, max_tokens=exact")
    new = RunIdentity(**base, workload_params={"max_tokens": "cap", "max_tokens_cap": 4096})  # type: ignore[arg-type]
    assert group_label(new, 0.8).endswith("60 tasks, max_tokens=cap 4096")
    assert old.digest != new.digest
    trace = RunIdentity(**{**base, "workload": "trace"}, workload_params={"file": "x.jsonl"})  # type: ignore[arg-type]
    assert "max_tokens=file" in group_label(trace, None)


def test_committed_reference_is_labelled_exact() -> None:
    runs = collect(Path(__file__).resolve().parents[1] / "results" / "reference").runs
    assert set(runs["max_tokens"]) == {"max_tokens=exact"}
    assert runs["group_label"].str.contains("max_tokens=exact").all()


def test_run_prints_and_stores_the_setting(tmp_path: Path) -> None:
    args = ["run", "-w", "metagpt-sop", "-s", "fcfs", "-n", "3", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "lengths: max_tokens=cap (every call sends max_tokens 4,096" in res.output
    res = CliRunner().invoke(app, [*args, "--workload-param", "max_tokens=exact"])
    assert res.exit_code == 0, res.output
    assert "lengths: max_tokens=exact" in res.output
    cells = sorted(tmp_path.glob("metagpt-sop/fcfs/*/run.json"))
    assert len(cells) == 2  # two settings, two cells
    params = sorted(json.dumps(json.loads(p.read_text())["identity"]["workload_params"])
                    for p in cells)  # fmt: skip
    assert params == ['{"max_tokens": "cap", "max_tokens_cap": 4096}', "{}"]


# -- what a policy sees ----------------------------------------------------------------------------
class _Stop(Exception):
    """Raised by the recorder at the first decision after a call finished."""


def _req(view: EngineView, r: RequestView) -> tuple[Any, ...]:
    est = view.estimator
    key = (r.task_id, r.stage_id)
    return (
        r.rid, r.task_id, r.stage_id, r.agent, r.kind, tuple(r.prompt), r.prompt_tokens,
        r.generated, r.ready_s, r.queued_s, r.admitted_s, r.preemptions, r.service_s,
        cast(Any, r).max_new_tokens,  # what a server sees of the output: the cap
        view.cached_tokens(r), view.admission_need(r), view.lock_cost(r),
        est.residual_tokens(r.agent, r.kind, r.generated, key), est.residual_service_s(r),
    )  # fmt: skip


def snapshot(view: EngineView) -> tuple[Any, ...]:
    """Everything a policy can read through the view protocols (and a request's cap)."""
    est = view.estimator
    tasks = []
    for tid, t in sorted(view.tasks.items()):
        stages = tuple(
            (s.id, s.agent, s.kind, s.deps, s.children, s.prompt_tokens, s.pending_outputs,
             s.delay_s, s.state, s.request.rid if s.request is not None else None,
             est.residual_tokens(s.agent, s.kind, 0, (tid, s.id)), est.stage_service_s(tid, s),
             est.prompt_estimate(tid, s))
            for s in t.stages.values()
        )  # fmt: skip
        tasks.append((tid, t.id, t.workflow, t.arrival_s, t.attained_s, t.version, stages))
    agents = sorted({r.agent for r in (*view.waiting, *view.running)})
    return (
        view.now_s, view.kv_budget_tokens, view.running_tokens, view.locked_tokens,
        view.evictable_tokens, view.free_tokens, view.host_capacity_tokens, view.reserved_tokens,
        tuple(_req(view, r) for r in view.waiting), tuple(_req(view, r) for r in view.running),
        tuple(tasks), tuple(view.prefixes()), est.tpot_s, est.version, est.oracle,
        tuple((a, view.reload_s(a), view.absent_reload_s(a)) for a in agents),
    )  # fmt: skip


def views_until_first_finish(
    w: Workload, policy: str, hint: str = "none", kv: int = 18692
) -> list[Any]:
    inner = make_policy(policy)
    seen: list[Any] = []
    base = type(inner)

    class Recorder(base):  # type: ignore[valid-type, misc]
        def decide(self, view: EngineView) -> Any:
            if view.estimator.version > 0:  # a call finished: lengths are observable from here
                raise _Stop
            seen.append(snapshot(view))
            return super().decide(view)

    inner.__class__ = Recorder
    cfg = SimConfig(kv_budget_tokens=kv, length_hint=hint, record_timeline=False)  # type: ignore[arg-type]
    with pytest.raises(_Stop):
        Simulator(w, inner, CostModel(load_preset("a100-qwen32b")), cfg).run()
    return seen


def _other_lengths(w: Workload) -> Workload:
    """`w` with every true output length changed (halved), nothing else: prompts, caps and
    arrivals stay (downstream prompts keep the old lengths, which no call reaches before the
    first finish)."""
    tasks = tuple(
        replace(t, stages=tuple(replace(s, output_tokens=max(1, s.output_tokens // 2))
                                for s in t.stages))
        for t in w.tasks
    )  # fmt: skip
    return replace(w, tasks=tasks)


def _pair(mode: str) -> tuple[Workload, Workload]:
    """Sixteen metagpt-tl tasks arriving about a second apart, in `mode`; and the same with
    other true lengths (in exact mode the caps follow the lengths, as a client sends them)."""
    a = generate("metagpt-tl", num_tasks=16, rate_per_s=1.0, seed=5, max_tokens=mode)
    b = _other_lengths(a)
    if mode == "exact":
        b = replace(b, tasks=lengths.apply_tasks(b.tasks, "exact", 0))
    return a, b


@pytest.mark.parametrize("kv", [18692, 40000])
@pytest.mark.parametrize("policy", POLICIES)
def test_cap_mode_views_do_not_depend_on_true_lengths(policy: str, kv: int) -> None:
    """At the default budget the batch fills (SGLang then asks no policy until a call ends);
    at 40,000 tokens every arrival is a decision, with up to 11 calls in the batch."""
    a, b = _pair("cap")
    va, vb = views_until_first_finish(a, policy, kv=kv), views_until_first_finish(b, policy, kv=kv)
    n = min(len(va), len(vb))
    assert n >= 5  # several decisions before anything finished, some with a queue and a batch
    assert any(v[8] and v[9] for v in va[:n])
    assert va[:n] == vb[:n]


@pytest.mark.parametrize("policy", ["fcfs", "topas"])
def test_exact_mode_and_the_oracle_hint_do_reveal_them(policy: str) -> None:
    """The comparison above can fail: exact caps (the admission need, the reservation) and the
    oracle hint (the estimator) each make the two workloads look different before any finish."""
    a, b = _pair("exact")
    va, vb = views_until_first_finish(a, policy), views_until_first_finish(b, policy)
    assert va[: min(len(va), len(vb))] != vb[: min(len(va), len(vb))]
    a, b = _pair("cap")
    va = views_until_first_finish(a, policy, "oracle")
    vb = views_until_first_finish(b, policy, "oracle")
    assert va[: min(len(va), len(vb))] != vb[: min(len(va), len(vb))]


def test_no_policy_reaches_behind_the_views() -> None:
    """The engines' objects behind the views hold the true lengths (the simulator's request
    under a private name, its stages and tasks as `.stage` / `.task`): no policy module names
    them, nor reads attributes by computed name on the view (the one `getattr` reads a policy's
    own parameters)."""
    behind = {"output_tokens", "_true_output", "output_target", "remaining_output", "task",
              "stage", "_stage", "_stages", "workload", "engine"}  # fmt: skip
    found = []
    for path in sorted(SCHEDULERS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in behind:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
            if not isinstance(node, ast.Call) or getattr(node.func, "id", "") != "getattr":
                continue
            if not (path.name == "params.py" and ast.unparse(node.args[0]) == "self"):
                found.append(f"{path.name}:{node.lineno} getattr")
    assert found == []


@pytest.mark.parametrize("policy", ["spf", "topas", "continuum"])
def test_cap_mode_views_with_consistent_prompts(policy: str) -> None:
    """As the test above, but the second workload is sampled with other output ranges, so its
    downstream prompts carry its own outputs, as a real client's would once they exist: a
    stage not yet sent shows only what exists of its prompt (`StageView.pending_outputs`; the
    estimator adds its expected upstream outputs), so the views still agree (issue 21: they
    used to show the whole prompt, true upstream outputs included)."""
    halved = {"plan_tokens": [225, 325], "route_tokens": [100, 150], "status_tokens": [40, 60],
              "prd_tokens": [400, 1000], "design_tokens": [400, 1000],
              "tasks_tokens": [75, 200], "code_tokens": [150, 750]}  # fmt: skip
    a = generate("metagpt-tl", num_tasks=16, rate_per_s=1.0, seed=5)
    b = generate("metagpt-tl", num_tasks=16, rate_per_s=1.0, seed=5, **halved)
    assert [t.arrival_s for t in a.tasks] == [t.arrival_s for t in b.tasks]
    va, vb = views_until_first_finish(a, policy), views_until_first_finish(b, policy)
    n = min(len(va), len(vb))
    assert n >= 5 and va[:n] == vb[:n]


@pytest.mark.parametrize("policy", ["spf", "topas", "continuum"])
def test_dag_views_do_not_show_upstream_outputs(policy: str) -> None:
    """dag4 in cap mode with other true output lengths (its downstream prompts carry them):
    before the first call ends, every stage to come shows the same prompt size."""
    a = generate("dag4", num_tasks=16, rate_per_s=1.0, seed=5, max_tokens="cap")
    b = generate("dag4", num_tasks=16, rate_per_s=1.0, seed=5, max_tokens="cap",
                 output_tokens=100)  # fmt: skip
    assert _outputs(a) != _outputs(b)
    va, vb = views_until_first_finish(a, policy), views_until_first_finish(b, policy)
    n = min(len(va), len(vb))
    assert n >= 5 and va[:n] == vb[:n]
    pending = [s for v in va[:n] for t in v[10] for s in t[6] if s[6]]
    assert pending  # stages whose upstream outputs are not made yet were seen
