"""Where a sweep's jobs run: in-process, in local worker processes, or as Ray tasks.

An executor maps a module-level function over picklable jobs and yields results as they
finish (in any order). Job functions catch their own errors and return them as data, so one
failing cell never stops the others. Ray is imported only by `RayExecutor` (an optional extra:
`pip install 'topas-bench[ray]'`).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol, TypeVar

from topas_bench.errors import TopasError

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    def imap_unordered(self, fn: Callable[[T], R], jobs: Sequence[T]) -> Iterator[R]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Runs jobs one after another in this process (`--jobs 1`)."""

    def imap_unordered(self, fn: Callable[[T], R], jobs: Sequence[T]) -> Iterator[R]:
        for job in jobs:
            yield fn(job)

    def close(self) -> None:
        pass


class LocalExecutor:
    """A pool of `jobs` worker processes, started with `spawn` (no forked threads or state)."""

    def __init__(self, jobs: int) -> None:
        self._jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def imap_unordered(self, fn: Callable[[T], R], jobs: Sequence[T]) -> Iterator[R]:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self._jobs, mp_context=ctx)
        pending: set[Future[R]] = {self._pool.submit(fn, job) for job in jobs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()
        finally:
            for fut in pending:
                fut.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayExecutor:
    """Ray tasks (one CPU each) on the cluster at `address` (None: `RAY_ADDRESS`, a running
    local cluster, or a new local one). Every node must have topas-bench installed and see the
    sweep's output directory (a shared filesystem), since workers write the run directories."""

    def __init__(self, address: str | None) -> None:
        try:
            import ray
        except ImportError:
            raise TopasError("--executor ray needs Ray: pip install 'topas-bench[ray]'") from None
        self._ray: Any = ray
        check_reachable(_bootstrap_address(address))
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise TopasError(f"cannot connect to Ray at {address or 'auto'}: {e}") from None

    def imap_unordered(self, fn: Callable[[T], R], jobs: Sequence[T]) -> Iterator[R]:
        ray = self._ray
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        pending = [remote.remote(job) for job in jobs]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        finally:
            for ref in pending:
                ray.cancel(ref)

    def close(self) -> None:
        self._ray.shutdown()


#: How long `check_reachable` waits for a TCP connection to a Ray cluster.
CONNECT_TIMEOUT_S = 5.0
RAY_GCS_PORT = 6379  # `ray start --head` default
RAY_CLIENT_PORT = 10001  # `ray://` default


def _bootstrap_address(address: str | None) -> str | None:
    """The address `ray.init` would connect to: `address`, or for None/"auto" `RAY_ADDRESS`,
    then (for "auto", or None with a cluster recorded by `ray start`) the local cluster; None
    when Ray would start a new local cluster. "auto" with no cluster fails here, at once."""
    if address not in (None, "auto"):
        return address
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    try:  # Ray's own discovery (a private API: if it moves, skip the check and let Ray decide)
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return None
    discover: Any = canonicalize_bootstrap_address
    try:
        found = discover(address)
    except (ConnectionError, ValueError) as e:
        raise TopasError(f"cannot reach Ray at {address}: {e}") from None
    except Exception:
        return None
    return str(found) if found else None


def parse_ray_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port``, ``ray://host[:port]`` or ``[ipv6]:port``."""
    rest, default = address.strip(), RAY_GCS_PORT
    if rest.startswith("ray://"):
        rest, default = rest[len("ray://") :], RAY_CLIENT_PORT
    elif "://" in rest:
        raise TopasError(f"cannot reach Ray at {address}: expected host:port or ray://host:port")
    rest = rest.rstrip("/")
    if rest.startswith("["):  # [::1]:6379
        host, _, tail = rest[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        host, port_text = rest, ""
    if not host:
        raise TopasError(f"cannot reach Ray at {address}: no host")
    if not port_text:
        return host, default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise TopasError(f"cannot reach Ray at {address}: bad port {port_text!r}")
    return host, int(port_text)


def check_reachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast, in one line, when nothing listens at a Ray address (`ray.init` would retry
    for minutes); None (start a local cluster) is not checked."""
    if address is None or address == "local":
        return
    host, port = parse_ray_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except TimeoutError:
        raise TopasError(
            f"cannot reach Ray at {address}: no answer from {host}:{port} in {timeout_s:g} s"
        ) from None
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise TopasError(f"cannot reach Ray at {address}: {reason}") from None


def make_executor(kind: str, jobs: int, address: str | None) -> Executor:
    if kind == "local":
        if jobs < 1:
            raise TopasError(f"--jobs must be >= 1, got {jobs}")
        return InlineExecutor() if jobs == 1 else LocalExecutor(jobs)
    if kind == "ray":
        return RayExecutor(address)
    raise TopasError(f"unknown executor {kind!r}; known: local, ray")
