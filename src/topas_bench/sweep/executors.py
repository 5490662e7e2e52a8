"""Where a sweep's jobs run: in-process, in local worker processes, or as Ray tasks.

An executor maps a module-level function over picklable jobs and yields results as they
finish (in any order). Job functions catch their own errors and return them as data, so one
failing cell never stops the others. Ray is imported only by `RayExecutor` (an optional extra:
`pip install 'topas-bench[ray]'`).
"""

from __future__ import annotations

import multiprocessing
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


def make_executor(kind: str, jobs: int, address: str | None) -> Executor:
    if kind == "local":
        if jobs < 1:
            raise TopasError(f"--jobs must be >= 1, got {jobs}")
        return InlineExecutor() if jobs == 1 else LocalExecutor(jobs)
    if kind == "ray":
        return RayExecutor(address)
    raise TopasError(f"unknown executor {kind!r}; known: local, ray")
