"""Decision overhead of a scheduler against waiting-queue size and active agents.

For each (waiting, agents) cell, a simulator is brought to a state with that many waiting
requests spread over that many agents (each agent has a 2,048-token prefix; some requests are
running, the cache holds prefixes), then the policy's `decide` is timed on that state
`--repeats` times. Reports median and p99 decision time in ms and decisions per second.

`--state admitting` (the default) is the state after the first iterations, where TOPAS admits;
`--state full` runs on until the server is full and TOPAS's decision admits nothing, so each
decision also proves how long it stands (`schedulers.topas.standing`): the decisions the
engine asks for between events.

    python benchmarks/bench_decisions.py [--scheduler topas] [--waiting 16,64,256,1024,4096]
                                         [--agents 2,4,10,16] [--repeats 200] [--json FILE]
                                         [--state admitting|full]

Wall times (median, p99) and this thread's CPU time per decision (what a decision costs when
other processes share the cores). Targets (issue 3): median <= 1 ms and p99 <= 5 ms at 256
waiting and 10 agents; p99 <= 20 ms at 4096 waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import ARRIVE, Simulator
from topas_bench.runners.sim.view import SimView
from topas_bench.schedulers.registry import make_policy
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key, output_key

PREFIX_TOKENS = 2048


def workload(waiting: int, agents: int) -> Workload:
    """`waiting` two-stage tasks arriving at once; stage agents cycle over `agents` agents."""
    names = [f"agent{i:02d}" for i in range(agents)]
    tasks = []
    for i in range(waiting):
        tid = f"t{i:05d}"
        a, b = names[i % agents], names[(i * 7 + 3) % agents]
        s0 = Stage("s0", a, (Segment(agent_key(a), PREFIX_TOKENS), Segment(f"{tid}/in", 200)), 300,
                   max_new_tokens=300)  # fmt: skip
        s1 = Stage(
            "s1", b, (Segment(agent_key(b), PREFIX_TOKENS), Segment(output_key(tid, "s0"), 300)),
            300, deps=("s0",), max_new_tokens=300,
        )  # fmt: skip
        tasks.append(Task(tid, "bench", 0.0, (s0, s1)))
    return Workload("bench", tuple(Agent(n, PREFIX_TOKENS) for n in names), tuple(tasks))


def loaded_state(scheduler: str, waiting: int, agents: int) -> Simulator:
    """A simulator right after its first iterations: requests running, about `waiting` wait."""
    preset = load_preset("a100-qwen32b")
    sim = Simulator(
        workload(waiting + 24, agents),
        make_policy(scheduler),
        CostModel(preset),
        SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens, record_timeline=False),
    )
    for task in sim.workload.tasks:
        sim._push(task.arrival_s, ARRIVE, task)
    heap = sim._heap
    iterations = 0
    while heap and iterations < 2:  # the loop of `Simulator.run`, stopped after 2 iterations
        iterations += sim._advance()
        if not sim._busy and iterations < 2:
            sim._step()
    sim._receive()  # the top of the next iteration: what was sent joins the queue
    return sim


def full_state(scheduler: str, waiting: int, agents: int) -> Simulator:
    """`loaded_state`, then iteration by iteration until the policy admits nothing while
    requests run (at most 5,000 iterations)."""
    sim = loaded_state(scheduler, waiting, agents)
    for _ in range(5000):
        if not sim._busy:
            if sim.running and sim.waiting:
                d = sim.policy.decide(SimView(sim))
                if not d.admit and not d.preempt:
                    return sim
            sim._step()
        sim._advance()
        sim._receive()
    raise SystemExit(f"no full state within 5,000 iterations ({waiting} waiting, {agents} agents)")


def time_cell(
    scheduler: str, waiting: int, agents: int, repeats: int, state: str = "admitting"
) -> dict[str, float]:
    sim = (full_state if state == "full" else loaded_state)(scheduler, waiting, agents)
    policy = sim.policy
    samples, cpu = [], []
    for _ in range(repeats):
        view = SimView(sim)
        t0, c0 = time.perf_counter(), time.thread_time()
        policy.decide(view)
        samples.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    samples.sort()
    cpu.sort()
    med = statistics.median(samples)
    p99 = min(len(samples) - 1, int(0.99 * len(samples)))
    stands = getattr(policy.decide(SimView(sim)), "stands", None)  # (older revisions: none)
    if callable(stands):  # a lazy proof (`base.ProvesStanding`): asked for up to 1,024 steps
        stands = stands(1024)
    return {
        "waiting": float(len(sim.waiting)),
        "running": float(len(sim.running)),
        "stands_steps": float(stands.steps if stands is not None else 0),
        "median_ms": med * 1e3,
        "p99_ms": samples[p99] * 1e3,
        "decisions_per_s": 1.0 / med,
        # this thread's CPU time: what a decision costs when the machine is shared
        "median_cpu_ms": statistics.median(cpu) * 1e3,
        "p99_cpu_ms": cpu[p99] * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scheduler", default="topas")
    ap.add_argument("--waiting", default="16,64,256,1024,4096")
    ap.add_argument("--agents", default="2,4,10,16")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--state", choices=("admitting", "full"), default="admitting")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    print(
        f"{args.scheduler}, {args.state} server: decision time (ms), median / p99 over "
        f"{args.repeats} decisions"
    )
    print(
        f"{'waiting':>8} {'agents':>6} {'running':>7} {'median':>8} {'p99':>8} {'dec/s':>9} "
        f"{'stands':>6} {'cpu med':>8} {'cpu p99':>8}"
    )
    for w in (int(x) for x in args.waiting.split(",")):
        for a in (int(x) for x in args.agents.split(",")):
            repeats = args.repeats if w <= 1024 else args.repeats // 4
            cell = time_cell(args.scheduler, w, a, repeats, args.state)
            rows.append({"requested_waiting": w, "agents": a, **cell})
            print(
                f"{cell['waiting']:>8.0f} {a:>6} {cell['running']:>7.0f} {cell['median_ms']:>8.3f} "
                f"{cell['p99_ms']:>8.3f} {cell['decisions_per_s']:>9,.0f} "
                f"{cell['stands_steps']:>6.0f} {cell['median_cpu_ms']:>8.3f} "
                f"{cell['p99_cpu_ms']:>8.3f}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"scheduler": args.scheduler, "state": args.state,
               "load_average": os.getloadavg()[0], "cells": rows}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
