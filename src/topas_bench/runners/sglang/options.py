"""What `--engine sglang` is told beyond the run itself: its servers, owned by this engine.

`SglangOptions` is the engine's part of a run specification (`spec.RunSpec.engine`). Checks
that need no I/O run when it is built (`from_flags`, `check_spec`); the rest (the model
directory, the interpreters) when the engine prepares the run (`runner.SglangServer.prepare`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from topas_bench.errors import TopasError

if TYPE_CHECKING:
    from topas_bench.runners.cluster.config import ClusterConfig
    from topas_bench.runners.sim.config import SimConfig

#: The command-line flags only this engine takes.
SGLANG_FLAGS = ("--model", "--endpoint", "--sglang-arg", "--server-python", "--router-python")


def refuse_sglang_flags(flags: Mapping[str, Any], engine: str) -> None:
    """Another engine given one of this engine's flags: one line naming it."""
    for flag in SGLANG_FLAGS:
        if flags.get(flag):
            raise TopasError(f"{flag} is for --engine sglang; --engine {engine} does not use it")


@dataclass(frozen=True)
class SglangOptions:
    """How `run --engine sglang` reaches its servers.

    model: the model path the launcher serves (and the `model` field of requests).
    endpoint: an existing server's base URL instead of launching one (then one scheduler).
    server_args: extra `sglang.launch_server` arguments, passed through unchanged.
    server_python: the interpreter with SGLang and topas-bench installed (default: this one).
    router_python: with `--replicas`, the interpreter with sglang-router (`make router-env`).
    request_timeout_s, health_timeout_s: per request attempt, and for a server to get healthy.
    """

    engine: ClassVar[str] = "sglang"
    version: ClassVar[int] = 1  # as `runners.sim.config.SimOptions.version`
    #: A real server: it sizes its own KV pool when no budget is given (the identity then
    #: records budget 0), times itself, and its memory is not this process's.
    real_server: ClassVar[bool] = True

    model: str | None = None
    endpoint: str | None = None
    server_args: tuple[str, ...] = ()
    server_python: str | None = None
    router_python: str | None = None
    served_model: str | None = None
    concurrency: int = 256
    request_timeout_s: float = 600.0
    retries: int = 4
    health_timeout_s: float = 900.0
    max_restarts: int = 2

    def __post_init__(self) -> None:
        if (self.model is None) == (self.endpoint is None):
            raise TopasError("--engine sglang needs exactly one of --model PATH or --endpoint URL")
        if self.endpoint is not None and not self.endpoint.startswith("http://"):
            raise TopasError(f"--endpoint must be an http:// URL, got {self.endpoint!r}")

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> SglangOptions:
        """The options of `run`'s engine flags (by flag name, `runners.engines.engine_options`)."""
        if flags.get("--length-hint", "none") != "none" or flags.get("--host-tier-tokens"):
            raise TopasError(
                "--length-hint and --host-tier-tokens are simulator settings; a real server has "
                "neither (use SGLang's own --enable-hierarchical-cache via --sglang-arg)"
            )
        return cls(
            model=flags.get("--model"),
            endpoint=flags.get("--endpoint"),
            server_args=tuple(flags.get("--sglang-arg") or ()),
            server_python=flags.get("--server-python"),
            router_python=flags.get("--router-python"),
        )

    def check_spec(self, schedulers: tuple[str, ...], cluster: ClusterConfig | None) -> None:
        """What these options allow of the run: an endpoint serves one scheduler on one server;
        sglang-router's interpreter is for a cluster; no oracle variant."""
        if cluster is not None and self.endpoint is not None:
            raise TopasError(
                "--replicas starts the servers and sglang-router itself; it takes --model, not "
                "--endpoint"
            )
        if cluster is None and self.router_python is not None:
            raise TopasError("--router-python is for --replicas N (sglang-router)")
        from topas_bench.schedulers.registry import refuse_sim_only

        refuse_sim_only(schedulers, "a real SGLang server")
        if self.endpoint is not None and len(schedulers) != 1:
            raise TopasError(
                "--endpoint serves one scheduler (the one its server was started with); give "
                f"exactly one --scheduler, got {', '.join(schedulers)}"
            )

    def sim_settings(self) -> dict[str, Any]:
        """`SimConfig` fields these options set: none (the simulator's mirror of the server,
        for the unloaded JCT, keeps SGLang's defaults)."""
        return {}

    def engine_params(self, sim: SimConfig) -> dict[str, Any]:
        """What the server adds to a run's identity: the model and its arguments."""
        params: dict[str, Any] = {"model": self.model or self.served_model or self.endpoint}
        if self.server_args:
            params["server_args"] = list(self.server_args)
        return params
