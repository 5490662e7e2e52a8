"""`metagpt-replay`: a recorded MetaGPT run (`trace record`, or a packaged one) replayed as
Poisson-arriving tasks, so `topas-bench run` can serve recorded jobs like any workload:

    topas-bench run -w metagpt-replay --workload-param file=calls.jsonl --rate 0.01

Every task is the recorded job, converted as `trace import` does (`metagpt_import`); arrivals
and parameters go through the registry's `build_workload` like every generator. ``file`` is a
path to a recorded call trace or the name of a packaged one (``sop-2048-offline`` (default),
``sop-qa-2048-offline``, ``tl-2048-offline``; the last needs a KV budget above 19,621 tokens).
``prefix_mode``: ``cache-friendly`` (default, as every MetaGPT workload and `trace import`) or
``faithful`` (as recorded). ``max_tokens``: ``cap`` (default: every call sends
``max_tokens_cap``, 4,096, MetaGPT's own, and ends at EOS after its recorded output) or
``exact`` (the recorded output lengths, with ``ignore_eos``); see `lengths`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads.lengths import METAGPT_CAP, check_cap, check_mode
from topas_bench.workloads.metagpt import PREFIX_MODES, check_prefix_mode
from topas_bench.workloads.metagpt_import import for_task, load_calls, recorded_job
from topas_bench.workloads.model import Agent, Stage, Workload
from topas_bench.workloads.registry import build_workload

PACKAGED = ("sop-2048-offline", "sop-qa-2048-offline", "tl-2048-offline")


@dataclass(frozen=True)
class ReplayParams:
    file: str = PACKAGED[0]
    prefix_mode: str = PREFIX_MODES[0]
    max_tokens: str = "cap"  # cap | exact: the max_tokens the client sends (lengths.py)
    max_tokens_cap: int = METAGPT_CAP  # MetaGPT's LLMConfig.max_token

    def __post_init__(self) -> None:
        check_prefix_mode(self.prefix_mode)
        check_mode(self.max_tokens)
        check_cap(self.max_tokens_cap)
        if not isinstance(self.file, str) or not self.file:
            raise TopasError(f"file must be a path or one of {', '.join(PACKAGED)}")


def resolve(file: str) -> Path:
    if file in PACKAGED:
        return Path(str(files("topas_bench.workloads") / "data" / f"{file}.jsonl"))
    path = Path(file)
    if not path.is_file():
        raise TopasError(f"file {file!r}: no such recorded call trace (packaged: {PACKAGED})")
    return path


def _job(file: str, prefix_mode: str) -> tuple[tuple[Agent, ...], tuple[Stage, ...]]:
    path = resolve(file)
    st = path.stat()  # a rewritten file is read again
    return _converted(path, st.st_mtime_ns, st.st_size, prefix_mode)


@functools.lru_cache(maxsize=16)
def _converted(
    path: Path, mtime_ns: int, size: int, prefix_mode: str
) -> tuple[tuple[Agent, ...], tuple[Stage, ...]]:
    return recorded_job(load_calls(path), prefix_mode)


def make_replay(
    num_tasks: int, rate_per_s: float, seed: int, overrides: dict[str, Any]
) -> Workload:
    def agents(p: ReplayParams) -> tuple[Agent, ...]:
        return _job(p.file, p.prefix_mode)[0]

    def stages(p: ReplayParams, task_id: str, rng: np.random.Generator) -> tuple[Stage, ...]:
        return for_task(_job(p.file, p.prefix_mode)[1], task_id)

    return build_workload(
        "metagpt-replay", ReplayParams, overrides, agents, stages, num_tasks, rate_per_s, seed
    )
