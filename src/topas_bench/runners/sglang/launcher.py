"""Starting, watching and stopping an inference server on 127.0.0.1 (docs/design.md section 7).

One `Server` per scheduler: it picks a free port, starts the server in its own process group
with stdout and stderr appended to a log file in the run directory, waits until `/health`
answers (or fails with the cause: the process exited, with the tail of its log, or the wait
timed out), and stops it by pid (SIGTERM to its group, SIGKILL after a grace period).
`restart()` starts it again on the same port, so clients retrying with backoff resume.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from topas_bench.errors import TopasError
from topas_bench.runners.sglang.plugin import (
    ENV_PARAMS,
    ENV_PRESET,
    ENV_SCHEDULER,
    INSTALLED_MARK,
)

if TYPE_CHECKING:
    from topas_bench.schedulers.base import ServerNeeds


class ServerError(TopasError):
    """The server could not be started, died, or never became healthy."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_probe(python: str, probe: str, flag: str) -> subprocess.CompletedProcess[str]:
    """`python -c probe` (a minute at most), its output captured; an interpreter that cannot
    be started is one line naming `flag`."""
    try:
        return subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TopasError(f"{flag} {python}: cannot run it ({e})") from None


def check_server_python(python: str, flag: str) -> None:
    """Fail before launching when `python` cannot run the plugin: it must import SGLang and
    topas-bench (the plugin registers through topas-bench's entry point)."""
    if not Path(python).exists():
        raise TopasError(f"{flag} {python} does not exist")
    probe = (
        "import importlib.util as u; "
        "print(' '.join(m for m in ('sglang', 'topas_bench') if u.find_spec(m) is None))"
    )
    res = run_probe(python, probe, flag)
    missing = res.stdout.split() if res.returncode == 0 else ["(the interpreter failed)"]
    if missing:
        raise TopasError(
            f"{flag} {python} lacks {', '.join(missing)}: point it at an interpreter with SGLang "
            "0.5.23 and topas-bench installed (docs/gpu.md)"
        )


def sglang_argv(
    python: str, model: str, port: int, kv_budget_tokens: int | None, extra: Sequence[str]
) -> list[str]:
    """`python -m sglang.launch_server` on 127.0.0.1 with the project's defaults."""
    argv = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
            "--port", str(port), "--enable-cache-report"]  # fmt: skip
    if kv_budget_tokens is not None:
        argv += ["--max-total-tokens", str(kv_budget_tokens)]
    return argv + list(extra)


def policy_server_args(needs: ServerNeeds, extra: Sequence[str] = ()) -> list[str]:
    """The `sglang.launch_server` arguments a policy needs and `extra` lacks: its radix
    eviction policy (`ServerNeeds.eviction`, with its config) when not SGLang's
    default `lru`. (The plugin builds SGLang's `SchedulePolicy` for the policy's own
    `--schedule-policy` whatever the server was started with.)"""
    import json

    if needs.eviction == "lru" or "--radix-eviction-policy" in extra:
        return []
    argv = ["--radix-eviction-policy", needs.eviction]
    if needs.eviction_config:
        argv += ["--radix-eviction-policy-config", json.dumps(needs.eviction_config_dict)]
    return argv


def _take_flag(argv: Sequence[str], names: Sequence[str]) -> tuple[str | None, list[str]]:
    """The value of the last of `names` in `argv` (`--flag value` or `--flag=value`), and
    `argv` without any of them."""
    found, rest = None, []
    args = iter(argv)
    for arg in args:
        name = next((n for n in names if arg == n or arg.startswith(n + "=")), None)
        if name is None:
            rest.append(arg)
        elif arg == name:
            found = next(args, found)
        else:
            found = arg[len(name) + 1 :]
    return found, rest


def replica_gpu_args(extra: Sequence[str], replica: int) -> list[str]:
    """`extra` with `--base-gpu-id` set for replica `replica` of a cluster on one host, so the
    replicas take disjoint GPUs: replica i starts at the user's `--base-gpu-id` (default 0)
    plus i x its GPUs (`--tp-size` / `--tensor-parallel-size`, default 1), as one would start
    N SGLang servers by hand. Any `--base-gpu-id` in `extra` is replaced."""
    base, rest = _take_flag(extra, ("--base-gpu-id",))
    tp, _ = _take_flag(extra, ("--tp-size", "--tensor-parallel-size", "--tp"))
    try:
        first, per = int(base or 0), int(tp or 1)
    except ValueError:
        raise ServerError(
            f"--base-gpu-id / --tp-size must be integers, got {base!r} / {tp!r}"
        ) from None
    return [*rest, "--base-gpu-id", str(first + replica * per)]


def plugin_env(scheduler: str, params: Mapping[str, object], preset: str) -> dict[str, str]:
    import json

    return {ENV_SCHEDULER: scheduler, ENV_PARAMS: json.dumps(dict(params)), ENV_PRESET: preset}


@dataclass
class Server:
    """A server process. `argv` must make it listen on 127.0.0.1:`port`."""

    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    ready_mark: str | None = None  # a line the log must contain once healthy
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if not Path(self.argv[0]).exists() and "/" in self.argv[0]:
            raise ServerError(f"server interpreter {self.argv[0]} does not exist")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {time.strftime('%F %T')}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True,
            )  # fmt: skip

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until `/health` answers 200; raise `ServerError` naming why not."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise ServerError(
                    f"server exited with code {code} before becoming healthy; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self._healthy():
                break
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"server not healthy after {timeout_s:.0f} s; log {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.5)
        if self.ready_mark is not None and self.ready_mark not in self.log_text():
            self.stop()
            raise ServerError(
                f"server is up but its log lacks {self.ready_mark!r} (the topas plugin did not "
                f"install; is topas-bench installed in the server's environment?); log "
                f"{self.log_path}:\n{self.log_tail()}"
            )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.health_path, timeout=5.0) as answer:
                return bool(200 <= answer.status < 300)
        except (OSError, ValueError):  # refused, reset, timed out, HTTP errors (URLError)
            return False

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group (by its pid), SIGKILL after `grace_s`."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def restart(self, timeout_s: float) -> None:
        self.stop()
        self.restarts += 1
        self.start()
        self.wait_healthy(timeout_s)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def sglang_server(
    *, python: str | None, model: str, scheduler: str, params: Mapping[str, object], preset: str,
    kv_budget_tokens: int | None, extra: Sequence[str], log_path: Path,
) -> Server:  # fmt: skip
    """A `Server` running SGLang with the topas plugin set to `scheduler`."""
    if not Path(model).exists() and not looks_like_hub_id(model):
        raise ServerError(f"--model {model!r}: no such model directory")
    port = free_port()
    from topas_bench.schedulers.registry import make_policy

    extra = [*extra, *policy_server_args(make_policy(scheduler, **params).needs, extra)]
    return Server(
        argv=sglang_argv(python or sys.executable, model, port, kv_budget_tokens, extra),
        port=port, log_path=log_path, env=plugin_env(scheduler, params, preset),
        ready_mark=INSTALLED_MARK.format(name=scheduler),
    )  # fmt: skip


def looks_like_hub_id(model: str) -> bool:
    """`org/name` (a hub id the server may resolve from its own cache), not a local path."""
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~", "/"))
