"""The workflow's task and stage views and its DAG release (`runners.workflow`): one logic for
the tasks every engine keeps from a workload (`TaskRun`) and the plugin's tasks built from
request metadata (`TrackedTask`)."""

from __future__ import annotations

from types import SimpleNamespace

from topas_bench.runners.sglang.metadata import decode, encode
from topas_bench.runners.sglang.tracker import TrackedTask
from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import StageState
from topas_bench.workloads.model import Task
from topas_bench.workloads.registry import generate


def _task(name: str = "dag4") -> Task:
    return generate(name, num_tasks=1, seed=0).tasks[0]


def _tracked(task: Task) -> TrackedTask:
    meta, why = decode(encode(task, task.stages[0], 0.0, 30))
    assert meta is not None, why
    return TrackedTask(meta, 0.0)


def test_a_join_is_released_by_its_last_dependency_once() -> None:
    task = _task()  # s0 -> {s1, s2} -> s3
    for run in (TaskRun(task), _tracked(task)):
        state = {sid: st.state for sid, st in run.stages.items()}
        assert state == {"s0": StageState.DELAYED, "s1": StageState.BLOCKED,
                         "s2": StageState.BLOCKED, "s3": StageState.BLOCKED}  # fmt: skip
        assert [c.id for c in run.stage_done("s0")] == ["s1", "s2"]
        assert run.stage_done("s1") == []  # s3 still waits for s2
        assert run.stages["s3"].state == StageState.BLOCKED
        assert [c.id for c in run.stage_done("s2")] == ["s3"]
        version = run.version
        assert run.stage_done("s2") == [] and run.version == version  # again: nothing moves
        assert not run.done
        run.stage_done("s3")
        assert run.done


def test_a_stage_that_leaves_done_is_counted_again() -> None:
    run = TaskRun(_task())
    for sid in ("s0", "s1", "s2", "s3"):
        run.stage_done(sid)
    assert run.done
    run.set_state("s1", StageState.WAITING)  # a retried stage
    assert not run.done
    version = run.version
    run.set_state("s1", StageState.WAITING)
    assert run.version == version  # no change, no new version


def test_both_builders_show_the_same_views() -> None:
    """Stage by stage, before and after each finishes: identity, children, prompt size without
    the outputs not made yet, pending outputs. The tracker adds what a request generated; the
    workload's task what its prompt carries, equal here."""
    for name in ("dag4", "dag10-wide", "metagpt-tl", "metagpt-sop"):
        task = _task(name)
        run, tracked = TaskRun(task), _tracked(task)
        outputs = {s.id: s.output_tokens for s in task.stages}
        assert list(run.stages) == list(tracked.stages)
        for sid in [*run.stages, None]:
            for a, b in zip(run.stages.values(), tracked.stages.values(), strict=True):
                assert (a.id, a.agent, a.kind, a.deps, a.children, a.delay_s, a.state) == (
                    b.id, b.agent, b.kind, b.deps, b.children, b.delay_s, b.state
                )  # fmt: skip
                assert a.prompt_tokens == b.prompt_tokens, (name, a.id)
                assert a.pending_outputs == b.pending_outputs, (name, a.id)
            if sid is not None:
                made = SimpleNamespace(generated=outputs[sid])
                tracked.stages[sid].request = made  # type: ignore[assignment]
                assert [c.id for c in run.stage_done(sid)] == [
                    c.id for c in tracked.stage_done(sid)
                ]
        assert run.done and tracked.done
