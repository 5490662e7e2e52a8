"""A real cluster on one host gives each SGLang replica its own GPUs (`--base-gpu-id`)."""

from __future__ import annotations

import pytest

from topas_bench.runners.sglang.launcher import ServerError, replica_gpu_args


def test_replicas_take_disjoint_gpus() -> None:
    assert replica_gpu_args([], 0) == ["--base-gpu-id", "0"]
    assert replica_gpu_args([], 3) == ["--base-gpu-id", "3"]


def test_tensor_parallel_replicas_step_by_their_gpus() -> None:
    extra = ["--tp-size", "2", "--mem-fraction-static", "0.8"]
    assert replica_gpu_args(extra, 0)[-2:] == ["--base-gpu-id", "0"]
    assert replica_gpu_args(extra, 1)[-2:] == ["--base-gpu-id", "2"]
    assert replica_gpu_args(["--tensor-parallel-size=4"], 2)[-1] == "8"


def test_the_users_base_gpu_is_the_offset_and_is_replaced() -> None:
    args = replica_gpu_args(["--base-gpu-id", "4", "--port-hint", "x"], 1)
    assert args == ["--port-hint", "x", "--base-gpu-id", "5"]
    assert replica_gpu_args(["--base-gpu-id=2", "--tp", "2"], 1) == [
        "--tp",
        "2",
        "--base-gpu-id",
        "4",
    ]


def test_a_non_integer_gpu_id_is_a_clear_error() -> None:
    with pytest.raises(ServerError, match="--base-gpu-id"):
        replica_gpu_args(["--base-gpu-id", "x"], 1)
