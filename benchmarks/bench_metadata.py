"""Decoding and ordering a huge task DAG in the SGLang plugin (issue 13, item 2).

Builds one task of `--stages` stages (each depends on up to four earlier stages, fixed seed),
encodes one of its requests' `custom_params` as the workflow client does, then times what the
plugin does with a new request: `metadata.decode` (parse + checks) and `Tracker.add` (decode +
the task's DAG in dependency order). Reports the median of `--repeats` runs.

    python benchmarks/bench_metadata.py [--stages 100000] [--repeats 5] [--json FILE]

Target: a 100,000-stage DAG decoded and ordered in under 1 s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.runners.sglang.metadata import decode, encode
from topas_bench.runners.sglang.tracker import Tracker
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import Segment, Stage, Task, agent_key


def big_task(stages: int, seed: int = 0) -> Task:
    rng = random.Random(seed)
    out = []
    for i in range(stages):
        deps = sorted({f"s{rng.randrange(i)}" for _ in range(min(i, rng.randint(1, 4)))})
        agent = f"agent{i % 16}"
        prompt = (Segment(agent_key(agent), 512), Segment(f"t/s{i}/in", 64))
        out.append(Stage(f"s{i}", agent, prompt, 32, tuple(deps), 0.0, "step"))
    return Task("t", "bench", 0.0, tuple(out))


@dataclass
class Params:
    custom_params: Any
    max_new_tokens: int = 32


@dataclass
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: Params
    output_ids: list[int] = field(default_factory=list)

    def finished(self) -> bool:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    task = big_task(args.stages)
    custom = encode(task, task.stages[-1], 0.0, 512)
    size = len(next(iter(custom.values())))
    decode_s, add_s = [], []
    est = ServiceEstimator(CostModel(load_preset("a100-qwen32b")))
    for i in range(args.repeats):
        t0 = time.perf_counter()
        meta, why = decode(custom)
        decode_s.append(time.perf_counter() - t0)
        assert meta is not None, why
        tracker = Tracker(est, clock=time.monotonic, unix_clock=time.time)
        req = Req(f"r{i}", list(range(576)), Params(custom))
        t0 = time.perf_counter()
        tracker.add(req)
        add_s.append(time.perf_counter() - t0)
        assert not tracker.untagged, tracker.untagged
        assert len(tracker.tasks["t"].stages) == args.stages
    result = {
        "stages": args.stages,
        "metadata_chars": size,
        "decode_median_s": statistics.median(decode_s),
        "decode_and_order_median_s": statistics.median(add_s),
        "repeats": args.repeats,
    }
    print(
        f"{args.stages:,} stages ({size / 1e6:.1f} MB of metadata): decode "
        f"{result['decode_median_s']:.3f} s, decode + order (Tracker.add) "
        f"{result['decode_and_order_median_s']:.3f} s (medians of {args.repeats})"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
