"""Which replica served a call, from the servers' logs (`request_log`, `replicas`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from topas_bench.runners.sglang.fleet import Fleet
from topas_bench.runners.sglang.replicas import replica_tables
from topas_bench.runners.sglang.request_log import line, served


def test_ids_survive_the_round_trip() -> None:
    odd = ('t "7" stage=x', "s\\1 task=")
    text = "[2026-12-02] INFO something\n" + line(*odd) + "\n" + line("t1", "s0") + "\nnoise"
    assert served(text) == {odd, ("t1", "s0")}
    assert served("topas: request task=not-json stage=1") == set()


@dataclass
class FakeServer:
    url: str
    log: str

    def log_text(self) -> str:
        return self.log


def test_replicas_from_logs_when_answers_do_not_name_them() -> None:
    workers = [
        FakeServer("http://127.0.0.1:1", line("t0", "a") + "\n" + line("t1", "a")),
        FakeServer("http://127.0.0.1:2", line("t0", "b") + "\n" + line("t1", "a")),
    ]
    fleet = Fleet(workers)  # type: ignore[arg-type]
    requests = pd.DataFrame({
        "task_id": ["t0", "t0", "t1", "t2"], "stage_id": ["a", "b", "a", "a"],
        "finish_s": [1.0, 2.0, 3.0, 4.0],
    })  # fmt: skip
    tasks = pd.DataFrame({"task_id": ["t0", "t1", "t2"]})
    served_by = ["", "", "", "http://127.0.0.1:2"]
    req, _, _ = replica_tables(fleet, requests, served_by, tasks)
    # t0/a and t0/b from one log each; t1/a is in both logs (a retry): unknown; t2/a's answer
    # named its worker, which wins over the logs
    assert list(req["replica"]) == [0, 1, -1, 1]
