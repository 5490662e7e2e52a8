"""sglang-router 0.3.2 in front of N servers (`run --engine sglang --replicas N --router NAME`).

The router is the PyPI package `sglang-router==0.3.2` (the Rust "SGLang Model Gateway"), in its
own venv (`make router-env`: .venvs/sglang-router, pinned by requirements/). It is started as
`python -m sglang_router.launch_router` on 127.0.0.1 with the servers' URLs, the policy our
router name maps to, and our router parameters as its flags (`ROUTER_FLAGS`), its Prometheus
exporter on a free port of its own (two routers on one host would clash on the default 29000).

It serves before the workers are registered (registration is a background job per URL), so
`wait_registered` polls `GET /workers` until all N are there and healthy, and returns their
registry order: the order its `min_by_key` breaks load ties in, which differs from run to run.
The router has no `/tokenize`: the client asks a worker directly.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.sglang.launcher import Server, ServerError, free_port, run_probe

ROUTER_VERSION = "0.3.2"
DEFAULT_ROUTER_VENV = Path(".venvs/sglang-router")
#: Our router names -> sglang-router's `--policy` (the others exist only in the simulator).
POLICIES = {"cache-aware": "cache_aware", "round-robin": "round_robin"}
#: Our router parameters -> sglang-router's flags (the values are passed through as given).
ROUTER_FLAGS = {
    "cache_threshold": "--cache-threshold",
    "balance_abs_threshold": "--balance-abs-threshold",
    "balance_rel_threshold": "--balance-rel-threshold",
    "eviction_interval_secs": "--eviction-interval-secs",
    "max_tree_size": "--max-tree-size",
}


def check_router(router: str) -> str:
    """sglang-router's policy for `router`, or a `TopasError` naming the ones it has."""
    if router not in POLICIES:
        raise TopasError(
            f"router {router!r} exists only in the simulator; sglang-router {ROUTER_VERSION} "
            f"runs {', '.join(POLICIES)} (--engine sim runs every router)"
        )
    return POLICIES[router]


def router_python(explicit: str | None) -> str:
    """The interpreter with sglang-router: `explicit`, else .venvs/sglang-router's; checked."""
    python = explicit or str(DEFAULT_ROUTER_VENV / "bin" / "python")
    if not Path(python).exists():
        raise TopasError(
            f"no sglang-router interpreter at {python}: run `make router-env` (sglang-router "
            f"{ROUTER_VERSION} in .venvs/sglang-router) or pass --router-python"
        )
    probe = (
        "import importlib.metadata as m, sglang_router.launch_router; "
        "print(m.version('sglang-router'))"
    )
    res = run_probe(python, probe, "--router-python")
    version = res.stdout.strip()
    if res.returncode != 0 or version != ROUTER_VERSION:
        raise TopasError(
            f"--router-python {python} lacks sglang-router {ROUTER_VERSION} (found "
            f"{version or 'none'}); `make router-env` builds it"
        )
    return python


def router_argv(
    python: str, port: int, workers: Sequence[str], router: str, params: Mapping[str, Any]
) -> list[str]:
    argv = [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
            str(port), "--worker-urls", *workers, "--policy", check_router(router),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--log-level", "info"]  # fmt: skip
    for key, value in sorted(params.items()):
        if key not in ROUTER_FLAGS:
            raise TopasError(f"router parameter {key!r} has no sglang-router flag")
        argv += [ROUTER_FLAGS[key], str(value)]
    return argv


def router_server(
    python: str, workers: Sequence[str], router: str, params: Mapping[str, Any], log_path: Path
) -> Server:
    """A `Server` running sglang-router over `workers`; its health is `wait_registered`'s."""
    port = free_port()
    return Server(
        argv=router_argv(python, port, workers, router, params), port=port, log_path=log_path,
        health_path="/liveness",
    )  # fmt: skip


def workers_listing(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/workers", timeout=timeout_s) as answer:
        data: dict[str, Any] = json.loads(answer.read())
    return data


def wait_registered(router: Server, workers: Sequence[str], timeout_s: float) -> list[str]:
    """Block until the router lists every worker as healthy; their URLs in registry order."""
    deadline = time.monotonic() + timeout_s
    want = set(workers)
    seen: list[str] = []
    while time.monotonic() < deadline:
        if not router.alive():
            raise ServerError(
                f"sglang-router exited before registering its workers; log {router.log_path}:\n"
                f"{router.log_tail()}"
            )
        try:
            listed = workers_listing(router.url).get("workers", [])
        except (OSError, ValueError):
            listed = []
        seen = [w.get("url") for w in listed if w.get("is_healthy")]
        if set(seen) == want and len(seen) == len(want):
            return seen
        time.sleep(0.2)
    router.stop()
    raise ServerError(
        f"sglang-router registered {len(seen)} of {len(want)} workers in {timeout_s:.0f} s; log "
        f"{router.log_path}:\n{router.log_tail()}"
    )
