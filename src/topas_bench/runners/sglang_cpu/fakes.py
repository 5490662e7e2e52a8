"""SGLang 0.5.23's real `Scheduler` with its process, IPC and model parts replaced (runs in the
SGLang venv only).

`Scheduler.__init__` is a sequence of `init_*` steps; two are replaced:
- `init_ipc_channels`: no ZMQ sockets; outputs are dropped (the loop reads the requests).
- `init_model_worker`: a worker that computes nothing (`ScriptedWorker`) over real SGLang KV
  pools (`ReqToTokenPool`, `MHATokenToKVPool` of one layer, one head, dim 1: only the slot indices
  matter, `TokenToKVPoolAllocator` of `kv_budget_tokens` slots). The scheduler then builds its
  own radix cache from the server args through `kv_cache_builder`, as a server does.
Everything else runs unmodified: `SchedulePolicy`, `PrefillAdder`, chunked prefill, the
`batch_is_full` latch, `ScheduleBatch` (extend/decode preparation, `retract_decode`),
`new_token_ratio`, result processing and SGLang's own KV leak checks.

The scripted worker emits, for each request, the token ids of its output segment
(`tokens.TokenIds`), its last one replaced by EOS unless the request has `ignore_eos` (then the
`max_new_tokens` cap, equal to the scripted length, ends it).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch  # type: ignore[import-not-found]
from sglang.srt.distributed import bootstrap  # type: ignore[import-not-found]
from sglang.srt.layers.dp_attention import get_dp_tp_group  # type: ignore[import-not-found]
from sglang.srt.managers.utils import GenerationBatchResult  # type: ignore[import-not-found]
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # type: ignore[import-not-found]
from sglang.srt.mem_cache.memory_pool import (  # type: ignore[import-not-found]
    MHATokenToKVPool,
    ReqToTokenPool,
)
from sglang.srt.runtime_context import (  # type: ignore[import-not-found]
    SpawnRanks,
    get_context,
    get_parallel,
    get_schedule,
    publish,
)
from sglang.srt.server_args import PortArgs, ServerArgs  # type: ignore[import-not-found]

from topas_bench.runners.sglang_cpu.tokens import EOS

#: Scripted output token ids of a request (by rid), emitted one per forward.
Script = dict[str, list[int]]


class ScriptedWorker:
    """Stands in for `TpModelWorker`: the scheduler's pools, and a forward that emits scripts."""

    def __init__(self, runner: ScriptedRunner, script: Script) -> None:
        self.model_runner = runner
        self.model_config = runner.model_config
        self.is_hybrid_swa = False
        self.sliding_window_size = None
        self.preloaded_weights_bytes = 0
        self.graph_memory_usage: dict[str, Any] = {}
        self.graph_time_usage: dict[str, Any] = {}
        self.weight_load_time = 0.0
        self.script = script

    def get_memory_pool(self) -> tuple[Any, Any]:
        return self.model_runner.req_to_token_pool, self.model_runner.token_to_kv_pool_allocator

    def get_pad_input_ids_func(self) -> None:
        return None

    def set_hicache_consumer(self, index: Any) -> None:
        pass

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        # Non-overlap loop: `output_ids` holds the tokens emitted so far, so this forward
        # produces each request's token number len(output_ids).
        ids = []
        for req in batch.reqs:
            script = self.script[req.rid]
            n = len(req.output_ids)
            last = n >= len(script) - 1
            # The scripted length ends by EOS unless the request ends by its length cap.
            ids.append(EOS if last and not req.sampling_params.ignore_eos else script[n])
        return GenerationBatchResult(
            logits_output=None,
            next_token_ids=torch.tensor(ids, dtype=torch.int64),
            can_run_cuda_graph=False,
        )


class _AttnBackend:
    # No `extend_attention_block_m`: the scheduler then uses its fallback of 64.
    needs_cpu_seq_lens = True


class ScriptedRunner:
    """The `ModelRunner` attributes the scheduler reads, over real pools of `kv_tokens` slots."""

    def __init__(self, model_config: Any, kv_tokens: int, max_reqs: int) -> None:
        from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (  # type: ignore[import-not-found]
            NgramEmbeddingManager,
        )

        self.model_config = model_config
        self.device = "cpu"
        self.page_size = 1
        self.req_to_token_pool = ReqToTokenPool(
            size=max_reqs + 1, max_context_len=model_config.context_len + 8, device="cpu",
            enable_memory_saver=False,
        )  # fmt: skip
        self.token_to_kv_pool = MHATokenToKVPool(
            size=kv_tokens, page_size=1, dtype=torch.float16, head_num=1, head_dim=1, layer_num=1,
            device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
            size=kv_tokens, dtype=torch.float16, device="cpu", kvcache=self.token_to_kv_pool,
            need_sort=False,
        )  # fmt: skip
        self.max_total_num_tokens = kv_tokens
        self.logical_max_total_num_tokens = kv_tokens
        self.effective_logical_max_total_num_tokens = kv_tokens
        self.max_running_requests = max_reqs
        self.attn_backend = _AttnBackend()
        self.prefill_aware_swa = False
        self.canary_manager = None
        self.mtp_draft_device_pools = None
        self.mtp_draft_mamba_pools = ()
        self.hisparse_coordinator = None
        self.forward_stream = None
        self.is_hybrid_swa = False
        self.ngram_embedding_manager = NgramEmbeddingManager.from_model(
            model=torch.nn.Module(), model_config=model_config,
            req_to_token_pool=self.req_to_token_pool, max_running_requests=max_reqs, device="cpu",
        )  # fmt: skip


class _Outputs:
    """Stands in for `SchedulerIpcChannels`: outputs go nowhere (the loop reads the requests)."""

    def __init__(self) -> None:
        self.send_to_tokenizer = self
        self.send_to_detokenizer = self
        self.recv_from_tokenizer = None
        self.recv_from_rpc = None
        self.send_metrics_from_scheduler = None

    def send_output(self, *args: Any, **kwargs: Any) -> None:
        pass

    send_pyobj = send_output


class OnCpu:
    """Mixin placed before SGLang's `Scheduler` (or our plugin's subclass of it) in the MRO."""

    ref_kv_tokens: int
    ref_max_reqs: int
    ref_script: Script
    #: Called with (req, is_retracted) whenever a request re-enters the waiting queue.
    ref_on_requeue: Callable[[Any, bool], None] | None = None

    def init_ipc_channels(self, port_args: Any) -> None:
        self.ipc_channels = _Outputs()
        self.load_snapshot_writer = None
        self.recv_from_tokenizer = None

    def init_model_worker(self) -> None:
        """Sets what `Scheduler.init_model_worker` sets (0.5.23), from the scripted worker."""
        runner = ScriptedRunner(self.model_config, self.ref_kv_tokens, self.ref_max_reqs)  # type: ignore[attr-defined]
        self.tp_worker = ScriptedWorker(runner, self.ref_script)
        self.model_worker = self.tp_worker
        self.draft_worker = None
        self.external_corpus_manager = None
        self.kv_cache_allocation_time = 0.0
        self.schedule_stream = None
        self.forward_stream = None
        self.max_total_num_tokens = runner.logical_max_total_num_tokens
        self.max_prefill_tokens = get_schedule().max_prefill_tokens
        self.max_running_requests = runner.max_running_requests
        self.max_queued_requests = get_schedule().max_queued_requests
        # `TpModelWorker.get_worker_info`
        self.max_req_len = min(self.model_config.context_len - 1, self.max_total_num_tokens - 1)  # type: ignore[attr-defined]
        self.max_req_input_len = self.max_req_len - 5
        self.random_seed = 0
        self.device = "cpu"
        self.min_free_slots_delayer = None
        par = get_parallel()
        if not par.pp_max_micro_batch_size:
            get_context().override(
                "scheduler.pp_max_micro_batch_size_default",
                pp_max_micro_batch_size=max(self.max_running_requests, 1),
            )
        self.tp_group = par.tp_group
        self.tp_cpu_group = self.tp_group.cpu_group
        self.attn_tp_group = par.attn_tp_group
        self.attn_tp_cpu_group = self.attn_tp_group.cpu_group
        self.attn_cp_group = par.attn_cp_group
        self.attn_cp_cpu_group = self.attn_cp_group.cpu_group
        self.pp_group = par.pp_group
        self.world_group = par.world_group
        self.dp_tp_group = get_dp_tp_group()
        self.dp_tp_cpu_group = self.dp_tp_group.cpu_group
        self.pad_input_ids_func = None
        self.startup_available_gpu_memory_gb = 0.0

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        if self.ref_on_requeue is not None:
            self.ref_on_requeue(req, is_retracted)
        super()._add_request_to_queue(req, is_retracted=is_retracted)  # type: ignore[misc]


def model_dir(vocab_size: int, context_length: int) -> Path:
    """A directory holding only a tiny Llama `config.json`: `ModelConfig` reads it through
    transformers (no weights, no network); only its vocabulary, context and EOS matter."""
    d = Path(tempfile.mkdtemp(prefix="topas-sglang-cpu-"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
        "num_hidden_layers": 1, "vocab_size": vocab_size,
        "max_position_embeddings": context_length, "rms_norm_eps": 1e-5,
        "torch_dtype": "float16", "eos_token_id": EOS, "bos_token_id": 1,
    }  # fmt: skip
    (d / "config.json").write_text(json.dumps(config))
    return d


def build_scheduler(
    base: type,
    server_args: dict[str, Any],
    *,
    kv_tokens: int,
    max_reqs: int,
    script: Script,
    on_requeue: Callable[[Any, bool], None] | None = None,
) -> Any:
    """Publish `server_args` and construct `base` (SGLang's `Scheduler` or a subclass) on CPU.

    Callable many times in one process: `bootstrap.init_parallel_runtime` (gloo groups of world
    size 1) refuses a second call, and the groups of the first stay valid, so later
    constructions skip it.
    """
    attrs = {
        "ref_kv_tokens": kv_tokens,
        "ref_max_reqs": max_reqs,
        "ref_script": script,
        "ref_on_requeue": staticmethod(on_requeue) if on_requeue is not None else None,
    }
    cls = type(f"Cpu{base.__name__}", (OnCpu, base), attrs)
    sa = ServerArgs(
        device="cpu", skip_tokenizer_init=True, disable_overlap_schedule=True, page_size=1,
        disable_cuda_graph=True, dtype="float16", load_format="dummy", random_seed=0,
        **server_args,
    )  # fmt: skip
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    port_args = PortArgs.init_new(sa)
    real_init = bootstrap.init_parallel_runtime
    if bootstrap._PARALLEL_INITIALISED:
        bootstrap.init_parallel_runtime = lambda **kw: None
    try:
        sched = cls(sa, port_args)
    finally:
        bootstrap.init_parallel_runtime = real_init
    for name in ("", "sglang"):  # construction reconfigures logging: keep runs quiet
        logging.getLogger(name).setLevel(logging.ERROR)
    return sched
