"""Lockstep comparison of the simulator with SGLang's own scheduler (runs in the SGLang venv).

Both engines serve the same workload and record every iteration as it starts (`engine.Step`):
the prefill batch's requests in order with their cached and new tokens (or the decode batch's
size), the free KV tokens, the evictable cache and the queue length. `first_divergence` finds
the first iteration where they differ. `random_workload` draws request streams that exercise
what decides outcomes: shared agent prefixes and append-only histories (prefix hits, node
splits, LRU eviction), outputs that end by EOS well below `max_new_tokens` (so admission
over-commits and decode retracts), long prompts (chunked prefill), a small KV budget.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from topas_bench.runners.sglang_cpu.job import ServerSettings
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.engine import Simulator, Step
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key, output_key


@dataclass(frozen=True)
class Divergence:
    index: int
    sim: Step | None
    ref: Step | None

    def __str__(self) -> str:
        return f"iteration {self.index}: sim {self.sim} != sglang {self.ref}"


def first_divergence(sim: list[Step], ref: list[Step]) -> Divergence | None:
    for i in range(max(len(sim), len(ref))):
        a = sim[i] if i < len(sim) else None
        b = ref[i] if i < len(ref) else None
        if a != b:
            return Divergence(i, a, b)
    return None


def random_workload(seed: int, tasks: int = 40, rate_per_s: float = 2.0) -> Workload:
    """Random multi-agent tasks (chains and fan-outs over 4 agents) arriving as a Poisson
    stream, sized for a few-thousand-token KV budget."""
    rng = random.Random(seed)
    agents = tuple(Agent(f"a{i}", rng.choice([64, 200, 480, 900])) for i in range(4))
    out: list[Task] = []
    t = 0.0
    for ti in range(tasks):
        t += rng.expovariate(rate_per_s)
        tid = f"t{ti:03d}"
        stages: list[Stage] = []
        history: list[Segment] = []
        agent = rng.choice(agents)
        for si in range(rng.randint(1, 4)):
            same = rng.random() < 0.5  # the same agent again: its memory may continue
            agent = agent if same else rng.choice(agents)
            deps: tuple[str, ...] = ()
            prompt = [Segment(agent_key(agent.name), agent.prefix_tokens)]
            if stages and rng.random() < 0.8:
                dep = rng.choice(stages)
                deps = (dep.id,)
                if same and dep is stages[-1] and sum(x.tokens for x in history) < 1200:
                    prompt = [*history]  # append-only memory: the previous call, extended
                else:
                    prompt.append(Segment(output_key(tid, dep.id), dep.output_tokens))
            prompt.append(Segment(f"{tid}/in{si}", rng.randint(1, 700)))
            output = rng.randint(1, 90)
            max_new = output if rng.random() < 0.3 else output + rng.randint(1, 400)
            st = Stage(f"s{si}", agent.name, tuple(prompt), output, deps,
                       delay_s=rng.choice([0.0, 0.0, 0.05]), max_new_tokens=max_new)  # fmt: skip
            stages.append(st)
            history = [*prompt, Segment(output_key(tid, st.id), output)]
        out.append(Task(tid, "random", t, tuple(stages)))
    return Workload("random", agents, tuple(out), seed=seed)


def budget_flip_workload() -> Workload:
    """Two calls where a decision's bound is exact: a long call runs, reserving decode room
    at the decaying `new_token_ratio` (it is not an exact-length call), and a second call
    arrives that fits only once the ratio has decayed enough: with nothing else happening,
    TOPAS admits it at the one step where the admission budget first exceeds its need, which
    a decision's standing (`schedulers.base.Standing`) must not cover. For an 8,000-token KV
    budget (`budget_flip_config`)."""
    agents = (Agent("a", 512), Agent("b", 512))
    long_call = Stage("s0", "a", (Segment(agent_key("a"), 512), Segment("t0/in", 488)), 3000,
                      max_new_tokens=4000)  # fmt: skip
    late_call = Stage("s0", "b", (Segment(agent_key("b"), 512), Segment("t1/in", 4000)), 100,
                      max_new_tokens=100)  # fmt: skip
    tasks = (Task("t0", "flip", 0.0, (long_call,)), Task("t1", "flip", 0.1, (late_call,)))
    return Workload("budget-flip", agents, tasks)


def budget_flip_config() -> SimConfig:
    return SimConfig(kv_budget_tokens=8000, record_timeline=False)


def lockstep_config(kv_budget_tokens: int = 2600) -> SimConfig:
    return SimConfig(
        kv_budget_tokens=kv_budget_tokens, chunked_prefill_size=512, max_prefill_tokens=1024,
        max_running_requests=8, record_timeline=False,
    )  # fmt: skip


def trace_sim(
    w: Workload, scheduler: str, cfg: SimConfig, preset: str, params: dict[str, Any] | None = None
) -> list[Step]:
    from topas_bench.runners.sim.cost import CostModel, load_preset
    from topas_bench.schedulers.registry import make_policy

    trace: list[Step] = []
    policy = make_policy(scheduler, **(params or {}))
    Simulator(w, policy, CostModel(load_preset(preset)), cfg, trace=trace).run()
    return trace


def trace_reference(
    w: Workload, scheduler: str, cfg: SimConfig, preset: str, params: dict[str, Any] | None = None
) -> list[Step]:
    """SGLang's scheduler over `w`. The SGLang environment must already be set for `cfg`
    (`driver.set_env`), since SGLang reads it at import."""
    from topas_bench.runners.sglang_cpu.driver import reference_loop
    from topas_bench.runners.sglang_cpu.fakes import model_dir
    from topas_bench.runners.sglang_cpu.tokens import TokenIds

    server = ServerSettings.of(cfg)
    path = model_dir(TokenIds.of(w).vocab_size, server.context_length)
    loop = reference_loop(w, scheduler, dict(params or {}), preset, server, path)
    trace: list[Step] = []
    loop.trace = trace
    loop.run()
    return trace


def compare(
    seed: int,
    scheduler: str,
    *,
    tasks: int = 40,
    kv: int = 2600,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One random stream through both engines: the first divergence (None if they agree),
    and what the stream exercised."""
    w = random_workload(seed, tasks)
    cfg = lockstep_config(kv)
    preset = "h100-llama8b"
    sim = trace_sim(w, scheduler, cfg, preset, params)
    ref = trace_reference(w, scheduler, cfg, preset, params)
    div = first_divergence(sim, ref)
    prefills = [s for s in ref if s[0] == "prefill"]
    return {
        "divergence": None if div is None else str(div),
        "iterations": len(ref),
        "prefills": len(prefills),
        "admissions": sum(len(s[1]) for s in prefills),
        "hits": sum(1 for s in prefills for _, cached, _ in s[1] if cached > 0),
        "retractions": _retractions(ref),
    }


def _retractions(trace: list[Step]) -> int:
    """Decode batches that shrank without a finish-free explanation: a lower bound."""
    return sum(
        1 for a, b in itertools.pairwise(trace)
        if a[0] == b[0] == "decode" and b[1] < a[1] and b[4] > a[4]
    )  # fmt: skip
