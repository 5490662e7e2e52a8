"""`--executor ray` fails at once, in one line, when nothing listens at the Ray address."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from topas_bench.errors import TopasError
from topas_bench.sweep import executors
from topas_bench.sweep.executors import _bootstrap_address, check_reachable, parse_ray_address

CLI = [sys.executable, "-c", "from topas_bench.cli import main; main()"]


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("head-node", ("head-node", 6379)),
        ("ray://head-node:10002", ("head-node", 10002)),
        ("ray://head-node", ("head-node", 10001)),
        ("[::1]:6380", ("::1", 6380)),
        ("::1", ("::1", 6379)),
    ],
)
def test_parse_ray_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_ray_address(address) == expected


@pytest.mark.parametrize(
    ("address", "message"),
    [("host:99999", "bad port '99999'"), ("host:x", "bad port 'x'"), (":6379", "no host"),
     ("http://host:6379", "expected host:port or ray://host:port")],
)  # fmt: skip
def test_a_malformed_address_is_named(address: str, message: str) -> None:
    with pytest.raises(TopasError, match="cannot reach Ray at") as info:
        parse_ray_address(address)
    assert message in str(info.value)


def test_check_reachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")  # listening: fine
    port = closed_port()
    with pytest.raises(TopasError) as info:
        check_reachable(f"127.0.0.1:{port}")
    assert str(info.value) == f"cannot reach Ray at 127.0.0.1:{port}: Connection refused"
    check_reachable(None)  # Ray starts a local cluster: nothing to check


def test_check_reachable_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    def silent(address: tuple[str, int], timeout: float) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(executors.socket, "create_connection", silent)
    with pytest.raises(TopasError) as info:
        check_reachable("ray://10.1.2.3", timeout_s=5.0)
    assert str(info.value) == (
        "cannot reach Ray at ray://10.1.2.3: no answer from 10.1.2.3:10001 in 5 s"
    )


def test_auto_uses_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert _bootstrap_address("auto") == "10.0.0.5:6379"
    assert _bootstrap_address(None) == "10.0.0.5:6379"
    assert _bootstrap_address("10.0.0.6:6379") == "10.0.0.6:6379"  # explicit wins


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS"])
def test_sweep_on_an_unreachable_ray_fails_at_once(how: str) -> None:
    pytest.importorskip("ray", reason="the `ray` extra (make test installs it)")
    address = f"127.0.0.1:{closed_port()}"
    args = ["sweep", "-w", "chain3", "-s", "fcfs", "--rate", "0.1", "-n", "3", "--executor", "ray"]
    env = dict(os.environ)
    if how == "--address":
        args += ["--address", address]
    else:
        env["RAY_ADDRESS"] = address
    start = time.monotonic()
    done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: cannot reach Ray at {address}: Connection refused"
    assert time.monotonic() - start < 30
