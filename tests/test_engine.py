"""End-to-end simulations of hand-built workloads: SGLang 0.5.23's scheduling mechanics, each
test naming the SGLang function it pins, timed against `CostModel` directly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from topas_bench.runners.sim.config import SimConfig, check_fits
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import SimResult, SimulationError, Simulator, Step
from topas_bench.schedulers.base import Capabilities, Decision, Policy, ServerNeeds
from topas_bench.schedulers.fcfs import FCFS
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.spf import SPF
from topas_bench.schedulers.view import EngineView
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key, output_key

COST = CostModel(load_preset("h100-llama8b"))


def seg(key: str, tokens: int) -> Segment:
    return Segment(key, tokens)


def call(
    sid: str,
    agent: str,
    prompt: tuple[Segment, ...],
    out: int,
    deps: tuple[str, ...] = (),
    delay_s: float = 0.0,
    kind: str = "",
    max_new: int | None = None,
) -> Stage:
    """A call; by default exact-length (the client sends max_new_tokens == output)."""
    return Stage(sid, agent, prompt, out, deps, delay_s, kind,
                 max_new_tokens=out if max_new is None else max_new)  # fmt: skip


def workload(agents: dict[str, int], *tasks: Task) -> Workload:
    return Workload("hand", tuple(Agent(n, p) for n, p in agents.items()), tasks)


def sim(w: Workload, policy: Policy | None = None, **cfg: Any) -> Simulator:
    cfg.setdefault("kv_budget_tokens", 20_000)
    cfg.setdefault("check_invariants", True)
    return Simulator(w, policy or FCFS(), COST, SimConfig(**cfg))


def run(w: Workload, policy: Policy | None = None, **cfg: Any) -> SimResult:
    return sim(w, policy, **cfg).run()


def by_stage(res: SimResult) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["task_id"], r["stage_id"]): r for r in res.requests.to_dict("records")}


def decode_s(batch: int, context: int, steps: int) -> float:
    """`steps` decode iterations summed one by one (not via `decode_steps_s`)."""
    return sum(COST.decode_step_s(batch, context + batch * j) for j in range(steps))


class Counting(FCFS):
    """FCFS that counts how often the engine consults it."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []

    def decide(self, view: EngineView) -> Decision:
        self.calls.append((view.now_s, len(view.waiting)))
        return super().decide(view)


# -- one request -------------------------------------------------------------------------------
def test_single_request_timeline() -> None:
    st = call("s", "a", (seg("agent:a", 100), seg("t/in", 400)), 10)
    res = run(workload({"a": 100}, Task("t", "wf", 0.5, (st,))))
    prefill = COST.prefill_s([(0, 500)])
    jct = prefill + decode_s(1, 501, 9)  # the first token comes with the prefill
    (row,) = res.requests.to_dict("records")
    assert (row["ready_s"], row["admitted_s"], row["first_admitted_s"]) == (0.5, 0.5, 0.5)
    assert row["first_token_s"] == pytest.approx(0.5 + prefill, rel=1e-12)
    assert row["finish_s"] == pytest.approx(0.5 + jct, rel=1e-12)
    assert (row["output_tokens"], row["cached_tokens"], row["preemptions"]) == (10, 0, 0)
    assert res.tasks["jct_s"].tolist() == pytest.approx([jct], rel=1e-12)
    assert res.iterations == 1 + 9
    tl = res.timeline
    assert (tl["kind"].tolist(), tl["steps"].tolist()) == (["prefill", "decode"], [1, 9])


def test_one_token_output_finishes_with_the_prefill() -> None:
    st = call("s", "a", (seg("agent:a", 64),), 1)
    res = run(workload({"a": 64}, Task("t", "wf", 0.0, (st,))))
    assert res.tasks["jct_s"].tolist() == pytest.approx([COST.prefill_s([(0, 64)])], rel=1e-12)
    assert res.timeline["kind"].tolist() == ["prefill"]


# -- what joins the tree -----------------------------------------------------------------------
def test_finished_request_caches_prompt_and_all_outputs_but_the_last() -> None:
    """`release_kv_cache(checkpoint=True)` inserts `fill_ids[:kv_committed_len]`: the last
    output token's KV was never computed. The next call of an append-only history hits all of
    it but that token, and a fully cached prompt recomputes one token."""
    a = ("agent:a", 100)
    s1 = call("s1", "a", (seg(*a), seg("t1/in", 50)), 20)
    history = (seg(*a), seg("t1/in", 50), seg(output_key("t1", "s1"), 20), seg("t1/in2", 30))
    s2 = call("s2", "a", history, 5, deps=("s1",))
    later = call("s1", "a", (seg(*a), seg("t2/in", 40)), 5)
    w = workload({"a": 100}, Task("t1", "wf", 0.0, (s1, s2)), Task("t2", "wf", 5.0, (later,)))
    rows = by_stage(run(w))
    assert rows["t1", "s1"]["cached_tokens"] == 0
    assert rows["t1", "s2"]["cached_tokens"] == 150 + 19
    assert rows["t2", "s1"]["cached_tokens"] == 100
    same = call("s1", "a", (seg(*a),), 5)
    again = call("s1", "a", (seg(*a),), 5)
    w2 = workload({"a": 100}, Task("x", "wf", 0.0, (same,)), Task("y", "wf", 5.0, (again,)))
    assert by_stage(run(w2))["y", "s1"]["cached_tokens"] == 99  # at most prompt - 1


def test_evicted_prefix_is_recomputed() -> None:
    calls = [("t1", "a", 0.0), ("t2", "b", 1.0), ("t3", "a", 2.0)]
    tasks = [
        Task(t, "wf", at, (call("s", ag, (seg(agent_key(ag), 300), seg(f"{t}/in", 10)), 5),))
        for t, ag, at in calls
    ]
    w = workload({"a": 300, "b": 300}, *tasks)
    tight = {
        r["task_id"]: r["cached_tokens"]
        for r in run(w, kv_budget_tokens=400).requests.to_dict("records")
    }
    assert tight == {"t1": 0, "t2": 0, "t3": 0}
    roomy = {
        r["task_id"]: r["cached_tokens"]
        for r in run(w, kv_budget_tokens=1000).requests.to_dict("records")
    }
    assert roomy == {"t1": 0, "t2": 0, "t3": 300}


# -- the batch_is_full latch -------------------------------------------------------------------
def latch_workload() -> Workload:
    """A runs long; B cannot fit beside it; C (small) arrives later and would fit."""
    a = call("s", "a", (seg("agent:a", 400),), 200)
    b = call("s", "b", (seg("agent:b", 600),), 50)
    c = call("s", "c", (seg("agent:c", 20),), 5)
    return workload(
        {"a": 400, "b": 600, "c": 20},
        Task("A", "wf", 0.0, (a,)), Task("B", "wf", 0.1, (b,)), Task("C", "wf", 0.2, (c,)),
    )  # fmt: skip


def test_a_full_batch_latches_until_a_request_leaves() -> None:
    """`_get_new_batch_prefill_raw`: NO_TOKEN sets `batch_is_full`; no prefill is tried again
    (arrivals included) until a running request leaves the batch. C would fit at once, but
    waits for A to finish, behind B in the queue."""
    policy = Counting()
    res = run(latch_workload(), policy, kv_budget_tokens=1000)
    rows = by_stage(res)
    a_done = rows["A", "s"]["finish_s"]
    assert rows["B", "s"]["first_admitted_s"] == pytest.approx(a_done)
    assert rows["C", "s"]["first_admitted_s"] == pytest.approx(a_done)
    # consulted at A's arrival, at B's (refused: latch), then only once A has left
    assert [n for _, n in policy.calls] == [1, 1, 2]
    assert policy.calls[2][0] == pytest.approx(a_done)


class ShortestFirst(FCFS):
    """Admits the shortest prompt first; `door` opens SGLang's door for acting while the batch
    is full (`ServerNeeds.acts_while_full`)."""

    def __init__(self, door: bool) -> None:
        self.door = door
        self.calls: list[float] = []

    @property
    def needs(self) -> ServerNeeds:
        return ServerNeeds(acts_while_full=self.door)

    def decide(self, view: EngineView) -> Decision:
        self.calls.append(view.now_s)
        return Decision(admit=sorted(view.waiting, key=lambda r: (r.prompt_tokens, r.rid)))


def test_acts_while_full_opens_a_prefill_attempt_every_step() -> None:
    """`enable_priority_preemption` clears the latch before every attempt: the policy is asked
    at every iteration while requests wait, so it can put C (which fits) before B (which does
    not) while A runs. Behind the latch, the same policy only sees C once A has left."""
    door, latched = ShortestFirst(door=True), ShortestFirst(door=False)
    with_door = by_stage(run(latch_workload(), door, kv_budget_tokens=1000))
    behind = by_stage(run(latch_workload(), latched, kv_budget_tokens=1000))
    assert with_door["C", "s"]["first_admitted_s"] < with_door["A", "s"]["finish_s"]
    assert behind["C", "s"]["first_admitted_s"] == pytest.approx(behind["A", "s"]["finish_s"])
    assert len(door.calls) > 100 > len(latched.calls)  # about one per decode step while B waits


def test_an_empty_running_batch_takes_the_prefill_batchs_fresh_latch() -> None:
    """`get_next_batch_to_run`: with an empty running batch the prefill batch becomes it
    (`running_batch = last_batch`), a new batch whose latch is clear. Two tasks arrive
    together; the first pass fills memory (NO_TOKEN, latch set), but after that prefill the
    next step tries again and admits the third request into the freed room."""
    tasks = [
        Task(f"T{i}", "wf", 0.0, (call("s", "a", (seg("agent:a", 10), seg(f"T{i}/in", 290)), 3),))
        for i in range(3)
    ]
    policy = Counting()
    rows = by_stage(run(workload({"a": 10}, *tasks), policy, kv_budget_tokens=700))
    first = rows["T0", "s"]["first_admitted_s"]
    assert rows["T1", "s"]["first_admitted_s"] == first == 0.0
    assert [n for _, n in policy.calls][:2] == [3, 1]  # tried again right after the prefill


# -- chunked prefill ---------------------------------------------------------------------------
def test_chunked_prefill_of_a_long_prompt() -> None:
    st = call("s", "a", (seg("agent:a", 100), seg("t/in", 900)), 3)
    res = run(workload({"a": 100}, Task("t", "wf", 0.0, (st,))), chunked_prefill_size=256)
    pre = res.timeline[res.timeline["kind"] == "prefill"]
    assert pre["new_tokens"].tolist() == [256, 256, 256, 232]
    chunks = [(0, 256), (256, 256), (512, 256), (768, 232)]
    expected = [COST.prefill_s([c]) for c in chunks]
    assert pre["duration_s"].tolist() == pytest.approx(expected, rel=1e-12)


def test_a_short_request_joins_the_last_chunk() -> None:
    long = call("s", "a", (seg("agent:a", 100), seg("t1/in", 300)), 2)
    short = call("s", "b", (seg("agent:b", 20),), 2)
    w = workload(
        {"a": 100, "b": 20}, Task("t1", "wf", 0.0, (long,)), Task("t2", "wf", 0.0, (short,))
    )
    pre = run(w, chunked_prefill_size=256).timeline
    pre = pre[pre["kind"] == "prefill"]
    assert pre["new_tokens"].tolist() == [256, 144 + 20]
    assert pre["batch"].tolist() == [1, 2]


# -- retraction ----------------------------------------------------------------------------------
def retraction_workload() -> Workload:
    """Sampled calls reserve only ratio * max_new, so a low ratio over-admits and decode runs
    out of memory."""

    def task(tid: str, arrival: float, prompt: int) -> Task:
        st = Stage("s", tid, (seg(f"{tid}/in", prompt),), 350, max_new_tokens=400)
        return Task(tid, "wf", arrival, (st,))

    return workload({"r1": 1, "r2": 1, "r3": 1}, task("r1", 0.0, 200), task("r2", 0.1, 150),
                    task("r3", 0.1, 120))  # fmt: skip


def test_retraction_releases_requeues_and_reestimates_the_ratio() -> None:
    """`update_running_batch` / `retract_decode`: retract in `length` order (fewest outputs,
    then longest input; the latest of equals first) until the step fits, requeue at the end,
    set `new_token_ratio` to (decoded + 20 * n) / (sum max_new + 1) over those left; a
    retracted request recomputes its prompt and outputs."""
    s = sim(retraction_workload(), kv_budget_tokens=1000, init_new_token_ratio=0.1)
    seen: list[tuple[list[str], float]] = []
    retract = s._retract

    def spy() -> None:
        order = [r.task_id for r in s.policy.retraction_order(SimpleNamespace(running=s.running))]  # type: ignore[arg-type]
        retract()
        left = s.running
        est = (sum(r.generated for r in left) + 20 * len(left)) / (
            sum(r.max_new_tokens for r in left) + 1
        )
        assert s.ratio == pytest.approx(min(1.0, est))
        assert s.waiting[-1].task_id == order[0]  # requeued at the end
        seen.append((order, s.ratio))

    s._retract = spy  # type: ignore[method-assign]
    res = s.run()
    assert res.preemptions >= 1 and seen
    assert seen[0][0] == ["r2", "r1"]  # r3 waits behind the latch; r2 has fewer outputs
    rows = {r["task_id"]: r for r in res.requests.to_dict("records")}
    assert all(r["output_tokens"] == 350 for r in rows.values())
    assert sum(r["preemptions"] for r in rows.values()) == res.preemptions


def test_policy_retraction_order_is_sglang_length_order() -> None:
    running = [
        SimpleNamespace(generated=g, prompt_tokens=p, rid=rid)
        for rid, g, p in [(0, 5, 100), (1, 3, 50), (2, 3, 80), (3, 9, 10), (4, 3, 80)]
    ]
    order = FCFS().retraction_order(SimpleNamespace(running=running))  # type: ignore[arg-type]
    # equals (2 and 4) go latest-in-batch first: SGLang sorts indices stably in reverse, pops
    assert [r.rid for r in order] == [4, 2, 1, 0, 3]


def test_release_evicts_room_for_the_requests_left() -> None:
    """`release_req`: after freeing a retracted request, evict cache until
    remaining * SGLANG_RETRACT_DECODE_STEPS tokens are free."""
    s = sim(retraction_workload(), kv_budget_tokens=1000, init_new_token_ratio=0.1)
    frees: list[tuple[int, int]] = []
    release = s._release

    def spy(req: Any, remaining: int) -> None:
        release(req, remaining)
        frees.append((s.free_tokens + 0, remaining))

    s._release = spy  # type: ignore[method-assign]
    s.run()
    assert frees and all(free >= 20 * left or s.cache.evictable_tokens == 0 for free, left in frees)


# -- the closed-form decode fast path ----------------------------------------------------------
def random_workload(seed: int, n_tasks: int = 8, max_new_extra: int = 300) -> Workload:
    """Tasks of 1-3 stages on 3 agents; half the calls are sampled (max_new > output)."""
    rng = np.random.default_rng(seed)
    agents = tuple(Agent(f"A{i}", int(rng.integers(20, 300))) for i in range(3))
    tasks = []
    t = 0.0
    for i in range(n_tasks):
        t += float(rng.exponential(0.05))
        stages: list[Stage] = []
        for j in range(int(rng.integers(1, 4))):
            ag = agents[int(rng.integers(0, len(agents)))]
            deps = tuple(f"s{k}" for k in range(j) if rng.random() < 0.5)
            prompt = [
                seg(agent_key(ag.name), ag.prefix_tokens),
                seg(f"t{i}/in{j}", int(rng.integers(1, 400))),
            ]
            prompt += [seg(output_key(f"t{i}", d), stages[int(d[1:])].output_tokens) for d in deps]
            out = int(rng.integers(1, 200))
            max_new = out + int(rng.integers(1, max_new_extra)) if rng.random() < 0.5 else out
            stages.append(Stage(f"s{j}", ag.name, tuple(prompt), out, deps,
                                float(rng.uniform(0, 0.02)), max_new_tokens=max_new))  # fmt: skip
        tasks.append(Task(f"t{i}", "wf", t, tuple(stages)))
    return Workload("random", agents, tuple(tasks))


#: Policies whose state moves inside a run of decode steps: context pins expire (continuum),
#: hrrn's prefill-token counter grows with every decode step.
STEPPED = [
    ("fcfs", {}), ("continuum", {"memory_price": 0.05}), ("hrrn", {}), ("kvflow", {}),
]  # fmt: skip


@pytest.mark.parametrize("scheduler", STEPPED, ids=[s for s, _ in STEPPED])
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("budget", [1500, 3000, 20_000])
def test_closed_form_decode_equals_stepping(
    seed: int, budget: int, scheduler: tuple[str, dict[str, Any]]
) -> None:
    """Runs of decode steps advanced as one event give the same result as one step per event
    (the trace mode), because nothing could have happened in between."""
    w = random_workload(seed, max_new_extra=800)
    cfg = SimConfig(kv_budget_tokens=budget, check_invariants=True)
    name, params = scheduler
    fast = Simulator(w, make_policy(name, **params), COST, cfg).run()
    trace: list[Step] = []
    step = Simulator(w, make_policy(name, **params), COST, cfg, trace=trace).run()
    cols = ["task_id", "stage_id", "cached_tokens", "first_admitted_s", "finish_s", "preemptions"]
    a = fast.requests[cols].sort_values(["task_id", "stage_id"]).reset_index(drop=True)
    b = step.requests[cols].sort_values(["task_id", "stage_id"]).reset_index(drop=True)
    assert a.equals(b)
    assert fast.iterations == step.iterations == len(trace)


# -- the server's view of time -----------------------------------------------------------------
class Recording(FCFS):
    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def decide(self, view: EngineView) -> Decision:
        for r in view.waiting:
            self.seen.setdefault(r.task_id, r.ready_s)
        return super().decide(view)


def test_requests_sent_mid_iteration_are_received_at_the_next_step() -> None:
    """`process_input_requests` runs at the top of an iteration: a request sent during one is
    queued as of the step boundary that follows; the record keeps the client's send time."""
    a = call("s", "a", (seg("agent:a", 100),), 50)
    b = call("s", "b", (seg("agent:b", 10),), 5)
    policy = Recording()
    res = run(
        workload({"a": 100, "b": 10}, Task("A", "wf", 0.0, (a,)), Task("B", "wf", 0.01, (b,))),
        policy,
    )
    rows = by_stage(res)
    tl = res.timeline
    ends = (tl["t_s"] + tl["duration_s"]).tolist()
    assert rows["B", "s"]["ready_s"] == 0.01
    assert policy.seen["B"] == min(e for e in ends if e >= 0.01) > 0.01


def test_the_server_clips_max_new_tokens_to_fit_the_budget() -> None:
    """`Scheduler.init_req_max_new_tokens`: min(max_new, max_req_len - input - 1), with
    max_req_len = min(context_length - 1, kv_budget - 1)."""
    st = call("s", "a", (seg("agent:a", 900),), 20, max_new=4096)
    w = workload({"a": 900}, Task("t", "wf", 0.0, (st,)))
    s = sim(w, kv_budget_tokens=1000)
    s.run()
    assert s.rec.result(0, 0).requests["output_tokens"].tolist() == [20]
    # clipped to 1000 - 900 - 2 = 98 >= 20: admitted alone although 900 + 4096 > 1000
    check_fits(w, 922)
    with pytest.raises(Exception, match="at least 922"):
        check_fits(w, 921)


# -- policies acting -----------------------------------------------------------------------------
class PreemptFirst(FCFS):
    """Preempts every running request once, at the first decision that sees two waiting."""

    capabilities = Capabilities(acts_while_full=True, preempts=True)

    @property
    def needs(self) -> ServerNeeds:
        return ServerNeeds(acts_while_full=True)

    def __init__(self) -> None:
        self.done = False

    def decide(self, view: EngineView) -> Decision:
        d = super().decide(view)
        if not self.done and view.running and len(view.waiting) >= 1:
            self.done = True
            return Decision(admit=d.admit, preempt=list(view.running))
        return d


def test_policy_preemption_releases_and_requeues_after_the_pass() -> None:
    """The plugin's adder releases the policy's preemptions (`preempt_to_schedule`'s
    `release_req`) before admitting; preempted requests rejoin the queue after the pass."""
    res = run(latch_workload(), PreemptFirst(), kv_budget_tokens=1000)
    rows = by_stage(res)
    assert rows["A", "s"]["preemptions"] == 1 and res.preemptions == 1
    assert rows["B", "s"]["first_admitted_s"] < rows["A", "s"]["admitted_s"]
    assert all(r["output_tokens"] > 0 for r in rows.values())


class AdmitNothing(Policy):
    name = "nothing"

    def decide(self, view: EngineView) -> Decision:
        return Decision()


def test_idle_server_with_a_policy_that_admits_nothing_raises() -> None:
    st = call("s", "a", (seg("agent:a", 10),), 5)
    with pytest.raises(SimulationError, match="admitted nothing while the server was idle"):
        run(workload({"a": 10}, Task("t", "wf", 0.0, (st,))), AdmitNothing())


class PinA(Policy):
    """FCFS that always asks to keep agent A's prefix on the GPU."""

    name = "pin-a"

    def decide(self, view: EngineView) -> Decision:
        return Decision(admit=list(view.waiting), keep_prefixes=frozenset({"A"}))


def test_pins_that_block_an_idle_server_are_released() -> None:
    first = call("s", "A", (seg("agent:A", 300), seg("t1/in", 10)), 1)
    other = call("s", "B", (seg("agent:B", 100), seg("t2/in", 100)), 50)  # needs 251
    w = workload(
        {"A": 300, "B": 100}, Task("t1", "wf", 0.0, (first,)), Task("t2", "wf", 1.0, (other,))
    )
    rows = by_stage(run(w, PinA(), kv_budget_tokens=500))  # pinning A leaves 200 for B
    assert rows["t2", "s"]["first_admitted_s"] == 1.0
    assert by_stage(run(w, PinA(), kv_budget_tokens=800))["t2", "s"]["first_admitted_s"] == 1.0


# -- length hints and DAGs -----------------------------------------------------------------------
def two_tasks(out_a: int, out_b: int) -> Workload:
    a = call("s", "a", (seg("agent:a", 50), seg("A/in", 50)), out_a, kind="k")
    b = call("s", "b", (seg("agent:b", 50), seg("B/in", 50)), out_b, kind="k")
    return workload({"a": 50, "b": 50}, Task("A", "wf", 0.0, (a,)), Task("B", "wf", 0.0, (b,)))


def test_oracle_lets_spf_run_the_short_task_first() -> None:
    w = two_tasks(500, 10)  # the budget fits one call at a time
    blind = run(w, SPF(), kv_budget_tokens=650)
    seer = run(w, SPF(), kv_budget_tokens=650, length_hint="oracle")
    blind_jct = dict(zip(blind.tasks["task_id"], blind.tasks["jct_s"], strict=True))
    seer_jct = dict(zip(seer.tasks["task_id"], seer.tasks["jct_s"], strict=True))
    assert blind_jct["A"] < blind_jct["B"]
    assert seer_jct["B"] < seer_jct["A"]


def test_stages_start_after_all_dependencies_plus_delay() -> None:
    outs = {"s": 9, "s1": 10, "s22": 11, "s333": 3}

    def st(sid: str, deps: tuple[str, ...], delay: float) -> Stage:
        quoted = tuple(seg(output_key("t", d), outs[d]) for d in deps)
        return call(
            sid, "a", (seg("agent:a", 30), seg(f"t/{sid}", 20), *quoted), outs[sid], deps, delay
        )

    stages = (
        st("s", (), 0.01),
        st("s1", ("s",), 0.2),
        st("s22", ("s",), 0.0),
        st("s333", ("s1", "s22"), 0.05),
    )
    rows = {
        r["stage_id"]: r
        for r in run(workload({"a": 30}, Task("t", "wf", 1.0, stages))).requests.to_dict("records")
    }
    for s in stages:
        ready = max((rows[d]["finish_s"] for d in s.deps), default=1.0) + s.delay_s
        assert rows[s.id]["ready_s"] == pytest.approx(ready, abs=1e-12)
        assert rows[s.id]["first_admitted_s"] >= rows[s.id]["ready_s"]
    assert rows["s22"]["first_admitted_s"] < rows["s1"]["first_admitted_s"]


@pytest.mark.parametrize(
    ("name", "clip"), [("dag4", 4096), ("metagpt-tl", 4096), ("metagpt-tl", 300)]
)
def test_view_admission_costs_are_need_plus_lock_cost(name: str, clip: int) -> None:
    """`SimView.admission_costs` (one pass over a queue) gives `admission_need + lock_cost` of
    every waiting request, at every decision of a contended TOPAS run (pins, running agents,
    partly cached prompts, retracted requests)."""
    from topas_bench.workloads.registry import generate

    w = generate(name, num_tasks=30, rate_per_s=1.0, seed=3)
    policy = make_policy("topas")
    decide = policy.decide
    checked = 0

    def checking(view: EngineView) -> Decision:
        nonlocal checked
        waiting = list(view.waiting)
        expected = [view.admission_need(r) + view.lock_cost(r) for r in waiting]
        assert view.admission_costs(waiting) == expected
        checked += len(waiting)
        return decide(view)

    policy.decide = checking  # type: ignore[method-assign]
    budget = max(a.prefix_tokens for a in w.agents) * 3 + 8000
    run(w, policy, kv_budget_tokens=budget, clip_max_new_tokens=clip)
    assert checked > 100
