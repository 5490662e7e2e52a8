"""The workflow client: runs a workload's task DAGs against an OpenAI-compatible server.

asyncio throughout. Each task starts at its arrival time (relative to the run's start); each
stage is sent `delay_s` after its last dependency finishes, as a streaming `/v1/completions`
request whose prompt has the exact per-segment token counts (`prompts.PromptBuilder`). The first
streamed token gives TTFT; the usage block gives the token counts, which are checked against the
workload. The output ends at the stage's length either way its `max_new_tokens`
(`workloads.lengths`) asks:

- exact (`max_new_tokens` = the output length): `max_tokens` = that length with `ignore_eos`,
  so the server ends the call there.
- a cap (`max_new_tokens` above the output, e.g. MetaGPT's 4,096): `max_tokens` = the cap,
  without `ignore_eos`, as a real client sends it, so the server reserves KV for it as for any
  call that may end at EOS. A real model would end where it likes; to end at the stage's length
  the client sends `min_tokens` = that length (SGLang and vLLM: no EOS before it) and asks for
  usage on every chunk (`stream_options.continuous_usage_stats`), then closes the stream once
  that many tokens came (the server aborts a call whose client left). The call's finish is that
  moment and its output those tokens; the server will have decoded more by then, since a
  streamed chunk may carry several tokens (vLLM on CPU sent 67 of a 60-token call once) and it
  notices the disconnect a step or more later. `min_tokens` is in
  the request's sampling parameters but in no view a policy gets (the plugin's view reads only
  the cap and `ignore_eos`, `view.SglangView`). A server that does not send per-chunk usage
  is counted by its streamed chunks (one per decode step on SGLang and vLLM by default).

The server is reached through the `openai` package (`api`): one `AsyncOpenAI` per run, its
connection pool, timeouts and retries; the task metadata (`custom_params`), `ignore_eos` and
`min_tokens` travel in `extra_body`, the usage block comes with `stream_options.include_usage`.

Robustness: at most `concurrency` requests in flight; openai retries a request that fails
before its answer starts (connection errors, HTTP 408/409/429/5xx: e.g. a server restarting)
with exponential backoff; a stream cut mid-way or an attempt over `request_timeout_s` is sent
again (`retries` times, backoff doubling); a request that still fails is recorded with its
error as status, never dropped, and the stages after it in its task are recorded as skipped.

A task is the workflow's `TaskRun` (`runners.workflow`), whose DAG every engine releases alike
(`TaskRun.stage_done`); a call's and a task's rows are the records' (`runners.records`:
`request_row`, `task_row`, the simulator's columns). What a client cannot see (admission times,
preemptions) is NaN; cached tokens come from the server's
`usage.prompt_tokens_details.cached_tokens` when it reports them, else NaN. What stays the
client's own: wall-clock times, attempts and failures (`ClientCall`), and the journal its runner
keeps of each finished task (`runner.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from topas_bench.runners.sglang import metadata
from topas_bench.runners.sglang.api import RequestError, TransientError, classify, connect
from topas_bench.runners.sglang.prompts import PromptBuilder
from topas_bench.runners.workflow import TaskRun
from topas_bench.workloads.model import Stage, Task, Workload

if TYPE_CHECKING:
    from openai import AsyncOpenAI

NAN = float("nan")


@dataclass(frozen=True)
class ClientConfig:
    """How the client talks to the server.

    base_url: e.g. http://127.0.0.1:30000 (no trailing /v1).
    model: the `model` field of requests (the served model's name or path).
    concurrency: requests in flight at most (the rest wait client-side, counted in their TTFT).
    request_timeout_s: per attempt, from send to the last streamed token.
    retries: openai's retries of a request that failed before its answer started, and ours of
      one cut mid-stream or timed out; backoff_s (ours) doubles after each.
    """

    base_url: str
    model: str
    concurrency: int = 256
    request_timeout_s: float = 600.0
    retries: int = 4
    backoff_s: float = 0.5
    tag_requests: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")


@dataclass(slots=True)
class ClientCall:
    """One stage's call as the client saw it: its row (`runners.records.request_row`) and what
    only a client over the network has (attempts, the server that answered, when the answered
    attempt was sent, an error or skip as its status). Times are wall-clock seconds from the
    run's start; what a client cannot see (admissions, preemptions) is NaN."""

    rid: int
    task_id: str
    stage_id: str
    agent: str
    kind: str
    prompt_tokens: int
    generated: int
    cached_tokens: float
    #: when the client sent it (released it to its queue: the `ready_s` column)
    sent_s: float
    first_token_s: float
    finish_s: float
    status: str
    attempts: int
    #: the base URL of the server that answered, when its answer names it (`system_fingerprint`)
    served_by: str = ""
    #: when the answered attempt was sent (after the client's own queue and prompt check)
    attempt_s: float = NAN

    first_admitted_s: ClassVar[float] = NAN
    admitted_s: ClassVar[float] = NAN
    preemptions: ClassVar[float] = NAN

    @property
    def service_s(self) -> float:
        return self.finish_s - self.sent_s if self.status == "ok" else NAN


class WorkflowClient:
    """Runs tasks; `on_task` is called with each finished (or failed) task, its calls (by id)
    and whether every call succeeded."""

    def __init__(
        self,
        cfg: ClientConfig,
        builder: PromptBuilder,
        on_task: Callable[[TaskRun, list[ClientCall], bool], None] | None = None,
        prefix_tokens: dict[str, int] | None = None,
        api: AsyncOpenAI | None = None,
    ) -> None:
        """`api`: the run's client (`api.connect`); one of its own when None."""
        self.cfg = cfg
        self.builder = builder
        self.on_task = on_task
        self.prefix_tokens = prefix_tokens or {}
        self._api = api
        self._sem = asyncio.Semaphore(cfg.concurrency)
        self._ids = itertools.count()
        self._t0 = 0.0
        self._unix0 = 0.0

    async def run(self, tasks: tuple[Task, ...] | list[Task], start_offset_s: float = 0.0) -> None:
        """Run `tasks`, each at `arrival_s - start_offset_s` seconds after now."""
        own = self._api is None
        if self._api is None:
            self._api = connect(self.cfg.base_url, timeout_s=self.cfg.request_timeout_s,
                                retries=self.cfg.retries)  # fmt: skip
        self._t0 = time.monotonic()
        self._unix0 = time.time()
        try:
            await asyncio.gather(*(self._task(t, t.arrival_s - start_offset_s) for t in tasks))
        finally:
            if own:
                await self._api.close()

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def _task(self, task: Task, at_s: float) -> None:
        """A task's DAG, released as every engine releases it (`TaskRun.stage_done`): a stage
        is sent `delay_s` after its last dependency ends. A call that failed releases its
        children too, which are then skipped, and theirs after them."""
        await asyncio.sleep(max(at_s - self.now(), 0.0))
        run = TaskRun(task)
        run.arrival_s = arrival = self.now()
        loop = asyncio.get_running_loop()
        released = {s.id: loop.create_future() for s in task.stages if s.deps}
        failed: set[str] = set()
        calls: list[ClientCall] = []

        async def stage(st: Stage) -> None:
            if st.deps:
                await released[st.id]
            if failed.intersection(st.deps):
                call = self._skipped(st, task)
            else:
                await asyncio.sleep(st.delay_s)
                call = await self._request(task, st, arrival)
            calls.append(call)
            if call.status == "ok":
                run.attained_s += call.service_s
            else:
                failed.add(st.id)
            for child in run.stage_done(st.id):
                released[child.id].set_result(None)

        await asyncio.gather(*(stage(s) for s in task.stages))
        ok = not failed
        finish = max((c.finish_s for c in calls if c.status == "ok"), default=NAN)
        run.finish_s = finish if ok else NAN
        if self.on_task is not None:
            self.on_task(run, sorted(calls, key=lambda c: c.rid), ok)

    def _skipped(self, st: Stage, task: Task) -> ClientCall:
        return ClientCall(
            next(self._ids), task.id, st.id, st.agent, st.kind, st.prompt_tokens, 0, NAN,
            self.now(), NAN, NAN, "skipped: a dependency failed", 0,
        )  # fmt: skip

    def _extra(self, task: Task, st: Stage, arrival_s: float) -> dict[str, Any]:
        """What the OpenAI API has no field for: SGLang's (and vLLM's) `ignore_eos` (exact) or
        `min_tokens` (a cap: no EOS before the stage's length), and the task metadata the topas
        plugin reads."""
        extra: dict[str, Any] = {"ignore_eos": True}
        if not exact_length(st):
            # the body's stream_options, replaced whole (openai merges extra_body shallowly)
            usage = {"include_usage": True, "continuous_usage_stats": True}
            extra = {"min_tokens": st.output_tokens, "stream_options": usage}
        if self.cfg.tag_requests:
            prefix = self.prefix_tokens.get(st.agent, st.prompt[0].tokens)
            extra["custom_params"] = metadata.encode(task, st, self._unix0 + arrival_s, prefix)
        return extra

    async def _request(self, task: Task, st: Stage, arrival_s: float) -> ClientCall:
        rid = next(self._ids)
        ready = self.now()
        attempts = 0
        error = "not sent"
        async with self._sem:
            for attempts in range(1, self.cfg.retries + 2):
                try:
                    text = await self.builder.checked_text(st.prompt)
                    extra = self._extra(task, st, arrival_s)
                    return await self._attempt(rid, task, st, ready, attempts, text, extra)
                except _Retry as e:
                    error = f"error: {e}"
                    if attempts <= self.cfg.retries:
                        await asyncio.sleep(self.cfg.backoff_s * 2 ** (attempts - 1))
                except RequestError as e:  # openai's own retries, if any, are spent
                    error = f"error: {e}"
                    break
        return self._failed(rid, task, st, ready, attempts, error)

    def _failed(
        self, rid: int, task: Task, st: Stage, ready: float, attempts: int, error: str
    ) -> ClientCall:
        return ClientCall(
            rid, task.id, st.id, st.agent, st.kind, st.prompt_tokens, 0, NAN, ready, NAN,
            self.now(), error, attempts,
        )  # fmt: skip

    async def _attempt(
        self, rid: int, task: Task, st: Stage, ready: float, attempts: int, text: str,
        extra: dict[str, Any],
    ) -> ClientCall:  # fmt: skip
        assert self._api is not None
        url = f"{self._api.base_url}completions"
        first = NAN
        usage: Any = None
        pieces = 0
        served_by = ""
        sent = self.now()
        exact = exact_length(st)
        cut = False  # the client ended the call at the stage's length (a cap)
        try:
            stream = await self._api.completions.create(
                model=self.cfg.model, prompt=text, max_tokens=st.max_new_tokens, temperature=0.0,
                stream=True, stream_options={"include_usage": True}, extra_body=extra,
            )  # fmt: skip
        except Exception as e:
            raise classify(e, url) from None
        try:
            async with asyncio.timeout(self.cfg.request_timeout_s):
                async for chunk in stream:
                    served_by = getattr(chunk, "system_fingerprint", None) or served_by
                    if any(c.text for c in chunk.choices or ()):
                        pieces += 1
                        if math.isnan(first):
                            first = self.now()
                    if chunk.usage is not None:
                        usage = chunk.usage
                    got = int(usage.completion_tokens) if usage is not None else pieces
                    if not exact and got >= st.output_tokens:
                        cut = True  # the stage's EOS: stop reading, close the stream
                        break
        except Exception as e:
            err = classify(e, url)
            raise (_Retry(str(err)) if isinstance(err, TransientError) else err) from None
        finally:
            await stream.close()
        finish = self.now()
        if cut:  # the call's output is its first `output_tokens` tokens, whatever came after
            prompt = int(usage.prompt_tokens) if usage is not None else st.prompt_tokens
            output = st.output_tokens
        elif usage is None:  # the stream was cut before its usage block
            raise _Retry(f"{url}: the stream ended without a usage block")
        else:
            prompt, output = int(usage.prompt_tokens), int(usage.completion_tokens)
        details = usage.prompt_tokens_details
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        status = "ok"
        if prompt != st.prompt_tokens or output != st.output_tokens:
            status = (
                f"error: token counts {prompt} in / {output} out, expected "
                f"{st.prompt_tokens} / {st.output_tokens}"
            )
        return ClientCall(
            rid, task.id, st.id, st.agent, st.kind, prompt, output,
            float(cached) if isinstance(cached, int) else NAN, ready,
            first if pieces else finish, finish, status, attempts, str(served_by), sent,
        )  # fmt: skip


class _Retry(TransientError):
    """A stream cut mid-way or an attempt that timed out: sent again by the client."""


def exact_length(st: Stage) -> bool:
    """Whether the client asks for the exact length (`ignore_eos`): its cap is the output
    length, as the simulator and the reference engine infer it (`runners.sim.state`)."""
    return st.max_new_tokens == st.output_tokens


def prefix_lengths(w: Workload) -> dict[str, int]:
    """Each agent's shared-prefix tokens (what the plugin locks to keep a prefix)."""
    return {a.name: a.prefix_tokens for a in w.agents}
