"""Mutable per-run state of the workflow client and the simulated server: requests, stages and
tasks in flight. The simulator and the reference engine's loop (`runners.sglang_cpu.loop`) both
keep their requests and tasks here, and release a task's DAG through `TaskRun.stage_done`.

These objects satisfy the read-only `RequestView`, `StageView` and `TaskView` protocols that
policies see; only the engines mutate them. The true output length is held under a private
name and is not part of any view.
"""

from __future__ import annotations

from collections.abc import Mapping

from topas_bench.runners.sim.radix import Node
from topas_bench.schedulers.base import StageState
from topas_bench.workloads.model import Segment, Stage, Task, output_key
from topas_bench.workloads.pieces import Piece, fill_pieces


class SimRequest:
    """One LLM call inside the simulated server, with SGLang's per-request KV bookkeeping."""

    __slots__ = (
        "_true_output",
        "admitted_s",
        "agent",
        "arrival_processed_tokens",
        "cached_tokens",
        "context_node",
        "enqueue_seq",
        "finish_s",
        "first_admitted_s",
        "first_token_s",
        "generated",
        "ignore_eos",
        "inserted_len",
        "kind",
        "lock_node",
        "max_new_tokens",
        "preemptions",
        "prefix_len",
        "private_tokens",
        "probe_memo",
        "prompt",
        "prompt_tokens",
        "queued_s",
        "ready_s",
        "rid",
        "sent_s",
        "service_s",
        "stage_id",
        "task",
        "task_id",
    )

    def __init__(
        self, rid: int, task: TaskRun, stage: Stage, now_s: float, max_new_tokens: int
    ) -> None:
        self.rid = rid
        self.task = task
        #: (tree version, fill tokens, GPU hit) of the view's last read-only probe
        self.probe_memo = (-1, -1, 0)
        self.task_id = task.id
        self.stage_id = stage.id
        self.agent = stage.agent
        self.kind = stage.kind
        self.prompt: tuple[Segment, ...] = stage.prompt
        self.prompt_tokens = stage.prompt_tokens
        #: The cap the server applies (`Scheduler.init_req_max_new_tokens` clips the client's).
        self.max_new_tokens = max_new_tokens
        self._true_output = stage.output_tokens
        # A client that asks for the exact length sends ignore_eos (docs/design.md section 7).
        self.ignore_eos = stage.max_new_tokens == stage.output_tokens
        self.generated = 0
        self.sent_s = now_s  # the client sent it
        self.ready_s = now_s  # the server received it (the next iteration boundary)
        self.queued_s = now_s
        self.enqueue_seq = 0
        self.arrival_processed_tokens = 0  # the server's prefill-token counter when queued
        self.admitted_s: float | None = None
        self.first_admitted_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.preemptions = 0
        self.service_s = 0.0
        # KV state while admitted (SGLang's `Req.prefix_len`, `req.lock`, private rows)
        self.lock_node: Node | None = None
        self.prefix_len = 0  # leading fill tokens the tree holds for it (locked)
        self.private_tokens = 0  # KV it holds outside the tree
        self.cached_tokens = 0  # prefix-cache hit at its latest admission
        self.inserted_len = 0  # fill tokens it inserted into the tree (`cache_inserted_len`)
        self.context_node: Node | None = None  # where its finished context ends in the tree

    @property
    def output_target(self) -> int:
        """Tokens the call will produce: its true length, capped by max_new_tokens."""
        return min(self._true_output, self.max_new_tokens)

    @property
    def remaining_output(self) -> int:
        return self.output_target - self.generated

    @property
    def fill_tokens(self) -> int:
        """`len(fill_ids)`: the prompt plus the outputs produced so far."""
        return self.prompt_tokens + self.generated

    def fill(self) -> list[Piece]:
        return fill_pieces(self.prompt, self.task_id, self.stage_id, self.generated)

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated


class StageRun:
    """A stage of a live task (satisfies `StageView`). Until it is sent, its prompt size counts
    only what exists: the outputs of stages of its task that have not finished are left out
    (they are `pending_outputs`), so the view never shows a true output before it is made."""

    __slots__ = ("_outputs", "_stage", "children", "remaining_deps", "request", "state")

    def __init__(self, stage: Stage, children: tuple[str, ...]) -> None:
        self._stage = stage
        self.children = children
        self.remaining_deps = len(stage.deps)
        self.state = StageState.BLOCKED if stage.deps else StageState.DELAYED
        self.request: SimRequest | None = None
        #: (stage of the same task, tokens) of each output its prompt carries (`TaskRun`)
        self._outputs: tuple[tuple[StageRun, int], ...] = ()

    @property
    def stage(self) -> Stage:
        return self._stage

    @property
    def id(self) -> str:
        return self._stage.id

    @property
    def agent(self) -> str:
        return self._stage.agent

    @property
    def kind(self) -> str:
        return self._stage.kind

    @property
    def deps(self) -> tuple[str, ...]:
        return self._stage.deps

    @property
    def prompt_tokens(self) -> int:
        total = self._stage.prompt_tokens
        for up, tokens in self._outputs:
            if up.state != StageState.DONE:
                total -= tokens
        return total

    @property
    def pending_outputs(self) -> tuple[tuple[str, str, str], ...]:
        return tuple(
            (up.id, up.agent, up.kind) for up, _ in self._outputs if up.state != StageState.DONE
        )

    @property
    def delay_s(self) -> float:
        return self._stage.delay_s


class TaskRun:
    """A live task (satisfies `TaskView`)."""

    __slots__ = ("_stages", "arrival_s", "attained_s", "finish_s", "pending", "task", "version")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.arrival_s = task.arrival_s
        self.attained_s = 0.0
        self.finish_s: float | None = None
        children: dict[str, list[str]] = {s.id: [] for s in task.stages}
        for s in task.stages:
            for d in s.deps:
                children[d].append(s.id)
        self._stages = {s.id: StageRun(s, tuple(children[s.id])) for s in task.topo_order()}
        made = {output_key(task.id, sid): run for sid, run in self._stages.items()}
        for run in self._stages.values():
            run._outputs = tuple(
                (made[g.key], g.tokens)
                for g in run.stage.prompt
                if g.key in made and made[g.key] is not run
            )
        self.pending = len(self._stages)
        self.version = 0  # bumped on every stage state change

    def set_state(self, stage_id: str, state: StageState) -> None:
        self._stages[stage_id].state = state
        self.version += 1

    def stage_done(self, stage_id: str) -> list[StageRun]:
        """The stage's request finished: the stage is done, and each child whose last
        dependency it was is released (DELAYED: the client's delay runs, then the caller
        sends it). Returns the released children, in the task's stage order."""
        st = self._stages[stage_id]
        self.set_state(stage_id, StageState.DONE)
        self.pending -= 1
        released = []
        for child_id in st.children:
            child = self._stages[child_id]
            child.remaining_deps -= 1
            if child.remaining_deps == 0:
                self.set_state(child_id, StageState.DELAYED)
                released.append(child)
        return released

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def workflow(self) -> str:
        return self.task.workflow

    @property
    def stages(self) -> Mapping[str, StageRun]:
        return self._stages
