"""A workflow's live tasks and stages, as every engine keeps them: the one home of the task and
stage views a policy reads (`TaskView`, `StageView`) and of the DAG release.

- `WorkflowStage` and `WorkflowTask` hold the view logic: a stage's identity from its
  description, what exists of its prompt (`prompt_tokens`, `pending_outputs`), the stage
  states with a task's version and its count of finished stages (`set_state`), and the release
  of a finished stage's children (`WorkflowTask.stage_done`).
- `StageRun` and `TaskRun` build them from a workload's `Task`: the simulator
  (`runners.sim`), the reference engine's loop (`runners.sglang_cpu.loop`) and the real
  workflow client (`runners.sglang.client`) keep their tasks in them.
- The plugin's tracker (`runners.sglang.tracker`) builds them from a request's metadata
  (`TrackedStage`, `TrackedTask`), lazily: a DAG may have 100,000 stages.

Engine-neutral: nothing here imports an engine. These objects satisfy the read-only view
protocols; only the engines mutate them. A stage's true output length is in no view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, Generic, TypeVar

from topas_bench.schedulers.base import StageState
from topas_bench.workloads.model import Stage, Task, output_key

_BLOCKED, _DELAYED, _DONE = StageState.BLOCKED, StageState.DELAYED, StageState.DONE


S = TypeVar("S")  # the stage's description: a workload `Stage`, or the plugin's `StageMeta`
R = TypeVar("R")  # the engine's request object that serves a stage


class WorkflowStage(Generic[S, R]):
    """A stage of a live task (satisfies `StageView`, given `children` and `_carried`).

    `sent_tokens`: its prompt's tokens without the outputs of its task's stages it carries (a
    client does not know an output before it is made). Until those stages finish, its prompt
    size counts only what exists, so the view never shows a true output before it is made."""

    __slots__ = ("request", "sent_tokens", "spec", "state")

    spec: S
    state: StageState
    request: R | None
    sent_tokens: int

    # Read from its description (`attrgetter` in C: these are read in every policy's loops).
    id = property(attrgetter("spec.id"))
    agent = property(attrgetter("spec.agent"))
    kind = property(attrgetter("spec.kind"))
    deps = property(attrgetter("spec.deps"))
    delay_s = property(attrgetter("spec.delay_s"))

    @property
    def children(self) -> tuple[str, ...]:
        """The ids of the stages that depend on it, in its task's declaration order."""
        raise NotImplementedError

    def _carried(self) -> Sequence[tuple[WorkflowStage[Any, Any], int]]:
        """(stage of the same task, the tokens its output adds to this prompt once made), one
        per output this stage's prompt carries, in prompt order."""
        raise NotImplementedError

    @property
    def prompt_tokens(self) -> int:
        """What exists of its prompt: the tokens sent, plus each finished upstream output."""
        total = self.sent_tokens
        for up, tokens in self._carried():
            if up.state is _DONE:
                total += tokens
        return total

    @property
    def pending_outputs(self) -> tuple[tuple[str, str, str], ...]:
        return tuple((up.id, up.agent, up.kind) for up, _ in self._carried() if up.state != _DONE)


T = TypeVar("T", bound=WorkflowStage[Any, Any])


class WorkflowTask(Generic[T]):
    """A live task (satisfies `TaskView`): its stages in topological order, their states, and
    the release of its DAG."""

    __slots__ = ("_done", "_stages", "arrival_s", "attained_s", "id", "version", "workflow")

    id: str
    workflow: str
    arrival_s: float
    attained_s: float
    version: int  # bumped on every change of a stage's state
    _stages: dict[str, T]
    _done: int  # stages in state DONE (`done` in O(1): a DAG may have 100,000 stages)

    @property
    def stages(self) -> Mapping[str, T]:
        return self._stages

    def set_state(self, stage_id: str, state: StageState) -> None:
        st = self._stages[stage_id]
        if st.state != state:
            self._done += (state == _DONE) - (st.state == _DONE)
            st.state = state
            self.version += 1

    def stage_done(self, stage_id: str) -> list[T]:
        """The stage's request finished: the stage is done, and each child still BLOCKED whose
        dependencies are now all done is released (DELAYED: the client's delay runs, then it
        sends the child). Returns the released children, in the task's stage order. Calling it
        again (a retried stage finishing twice) releases nothing twice."""
        self.set_state(stage_id, _DONE)
        stages = self._stages
        released = []
        for child_id in stages[stage_id].children:
            child = stages[child_id]
            if child.state is _BLOCKED and all(stages[d].state is _DONE for d in child.deps):
                self.set_state(child_id, _DELAYED)
                released.append(child)
        return released

    @property
    def done(self) -> bool:
        """Every stage is done."""
        return self._done == len(self._stages)

    def first_stages(self) -> list[T]:
        """The stages released when the task arrives (no dependencies), in topological order."""
        return [st for st in self._stages.values() if not st.deps]


class StageRun(WorkflowStage[Stage, Any]):
    """A stage of a workload task (`TaskRun`)."""

    __slots__ = ("_children", "_outputs")

    def __init__(self, stage: Stage, children: tuple[str, ...]) -> None:
        self.spec = stage
        self._children = children
        self.state = _BLOCKED if stage.deps else _DELAYED
        self.request = None
        self.sent_tokens = stage.prompt_tokens
        #: (stage of the same task, tokens) of each output its prompt carries (`TaskRun`)
        self._outputs: tuple[tuple[StageRun, int], ...] = ()

    @property
    def stage(self) -> Stage:
        return self.spec

    @property
    def children(self) -> tuple[str, ...]:
        return self._children

    def _carried(self) -> Sequence[tuple[WorkflowStage[Any, Any], int]]:
        return self._outputs


class TaskRun(WorkflowTask[StageRun]):
    """A live task of a workload. `arrival_s` is the task's (the real client sets the moment
    it measured); `finish_s` is set by its engine when the last stage ends."""

    __slots__ = ("finish_s", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.id = task.id
        self.workflow = task.workflow
        self.arrival_s = task.arrival_s
        self.attained_s = 0.0
        self.finish_s: float | None = None
        self.version = 0
        self._done = 0
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
            run.sent_tokens -= sum(tokens for _, tokens in run._outputs)
