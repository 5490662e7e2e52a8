"""The simulated server's requests in flight, with SGLang's per-request KV bookkeeping. The
simulator and the reference engine's loop (`runners.sglang_cpu.loop`) both keep their requests
here; their tasks and stages are the workflow's (`runners.workflow.TaskRun`, whose
`stage_done` releases a task's DAG).

A request satisfies the read-only `RequestView` protocol that policies see; only the engines
mutate it. The true output length is held under a private name and is not part of any view.
"""

from __future__ import annotations

from topas_bench.runners.sim.radix import Node
from topas_bench.runners.workflow import TaskRun
from topas_bench.workloads.model import Segment, Stage
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
