"""`kvflow`: workflow-aware eviction by steps-to-execution, with overlapped host prefetch.

KVFlow (Pan et al., "KVFlow: Efficient Prefix Caching for Accelerating LLM-Based Multi-Agent
Workflows", arXiv 2507.07400, NeurIPS 2025; code PanZaifeng/KVFlow; the eviction part also as
SGLang PR #33674): the workflow is an Agent Step Graph, each agent has a steps-to-execution
value (0: running now), and the radix cache evicts an agent's KV later the sooner the agent
runs; a node shared by several agents takes the soonest (tree-aware). With a host tier, the
KV of agents due within a few steps is loaded back to the GPU in the background. Admission is
SGLang's default (FCFS); KVFlow changes only what is kept.

Mirrored from the code (`managers/agent_manager.py`, `mem_cache/hiradix_cache.py`,
`mem_cache/radix_cache.py`, `managers/scheduler_output_processor_mixin.py`):
- an agent's hold priority is `min(steps, hold_steps + 1)`, an agent outside the graph
  `hold_steps + 1` (`get_agent_hold_priority`); a node carries the agents whose requests
  used it (a new node inherits its parent's) and takes the smallest of theirs;
- eviction runs passes with `steps = hold_steps - 1, ..., 1`, each evicting only nodes whose
  priority is at least `steps`, then one that evicts anything (`HiRadixCache.evict`): so nodes
  are evicted in classes `min(priority, hold_steps - 1)`, farthest class first;
- prefetch loads, step by step from 0 to `prefetch_steps` (`load_ahead_step`, default 2),
  the evicted KV of those steps' agents when GPU memory (free + evictable) holds it, stopping
  at the first that does not fit (`DispatchLoadTasks`, `load_back(check_reserve=True)`).

Here: the steps-to-execution of a stage of a live task is 0 when it waits or runs, 1 when its
dependencies are done and the client's tool time runs, else 1 + the most of its unfinished
dependencies'; an agent's is the smallest over every live task's unfinished stages. The
classes become SGLang `priority`-eviction priorities of the nodes of each agent's prefix (its
fixed prompt, which the paper's policy is about; `Decision.prefix_priority`), above SGLang's own
0 for outputs and 1 for prompts, so both engines evict outputs, then prompts, then prefixes
class by class, LRU within each (KVFlow's passes pop leaves in tree order). KVFlow's code also
tags every node of an agent's requests with the agent; tried here, that kept old tasks' dead
contexts under a busy agent and lost prefix hits (metagpt-tl with a host tier: 57% against 75%),
so only prefixes are tagged. Prefetch is of the agent's prefix (KVFlow's: of the agent's last
request paths). Defaults are KVFlow's server defaults (`evict_pri_level` 4, `load_ahead_step`
2); not tuned.
"""

from __future__ import annotations

import math

from topas_bench.schedulers.base import Decision, Policy, ServerNeeds, StageState
from topas_bench.schedulers.validate import integer
from topas_bench.schedulers.view import EngineView, PrefixLocation, TaskView

#: The priority of the farthest class; SGLang's own nodes are 0 (outputs) and 1 (prompts).
BASE_PRIORITY = 2


def steps_to_execution(task: TaskView) -> dict[str, int]:
    """Per agent of `task`'s unfinished stages: the fewest steps before one of them runs."""
    depth: dict[str, int] = {}
    out: dict[str, int] = {}
    for sid, st in task.stages.items():  # topological order
        if st.state == StageState.DONE:
            continue
        if st.state in (StageState.WAITING, StageState.RUNNING):
            d = 0
        elif st.state == StageState.DELAYED:
            d = 1
        else:
            d = 1 + max((depth[x] for x in st.deps if x in depth), default=0)
        depth[sid] = d
        out[st.agent] = min(out.get(st.agent, d), d)
    return out


class KVFlow(Policy):
    """FCFS admission; eviction by steps-to-execution classes; prefetch of agents due next."""

    name = "kvflow"

    hold_steps = integer(4, 2)
    prefetch_steps = integer(2, 0)

    def setup(self) -> None:
        self._memo: dict[str, tuple[int, dict[str, int]]] = {}

    @property
    def needs(self) -> ServerNeeds:
        """SGLang's `priority` eviction, whose node priorities it sets (`prefix_priority`):
        the Python tree core, where they are within reach."""
        return ServerNeeds(eviction="priority", tree_core="python")

    def steps(self, view: EngineView) -> dict[str, int]:
        """Steps-to-execution per agent over every live task."""
        out: dict[str, int] = {}
        memo: dict[str, tuple[int, dict[str, int]]] = {}
        for tid, task in view.tasks.items():
            hit = self._memo.get(tid)
            per = hit[1] if hit is not None and hit[0] == task.version else None
            if per is None:
                per = steps_to_execution(task)
            memo[tid] = (task.version, per)
            for agent, d in per.items():
                out[agent] = min(out.get(agent, d), d)
        self._memo = memo
        return out

    def decide(self, view: EngineView) -> Decision:
        steps = self.steps(view)
        top = self.hold_steps - 1
        prefixes = view.prefixes()
        priority = {
            p.agent: BASE_PRIORITY + top - min(steps.get(p.agent, top), top) for p in prefixes
        }
        prefetch: tuple[str, ...] = ()
        if view.host_capacity_tokens:
            due = [
                p.agent
                for p in prefixes
                if p.where is not PrefixLocation.GPU
                and steps.get(p.agent, math.inf) <= self.prefetch_steps
            ]
            prefetch = tuple(sorted(due, key=lambda a: (steps[a], a)))
        return Decision(admit=list(view.waiting), prefix_priority=priority, prefetch=prefetch)
