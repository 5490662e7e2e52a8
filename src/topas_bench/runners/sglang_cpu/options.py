"""The reference engine's part of a run specification (`spec.RunSpec.engine`): it has no
settings of its own, and refuses the simulator's and the real server's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from topas_bench.errors import TopasError
from topas_bench.runners.sim.config import SimConfig, sim_engine_params


@dataclass(frozen=True)
class ReferenceOptions:
    """`--engine sglang-cpu`: SGLang's own scheduler on CPU, one server, SGLang's settings."""

    engine: ClassVar[str] = "sglang-cpu"
    version: ClassVar[int] = 1  # as `SimOptions.version`
    real_server: ClassVar[bool] = False

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> ReferenceOptions:
        """The options of `run`'s engine flags (by flag name, `runners.engines.engine_options`,
        which has refused the real server's)."""
        if flags.get("--host-tier-tokens"):
            raise TopasError(
                "--host-tier-tokens is a simulator setting; the sglang-cpu reference runs SGLang "
                "without a host tier (HiCache)"
            )
        if flags.get("--length-hint", "none") != "none":
            raise TopasError(
                "--length-hint oracle is a simulator setting; SGLang's scheduler sees only "
                "max_new_tokens, as a real server does"
            )
        return cls()

    def check_spec(self, schedulers: tuple[str, ...], cluster: object) -> None:
        if cluster is not None:
            raise TopasError("--replicas is for --engine sim or sglang; sglang-cpu runs one server")
        from topas_bench.schedulers.registry import refuse_sim_only

        refuse_sim_only(schedulers, "the sglang-cpu reference")

    def sim_settings(self) -> dict[str, Any]:
        return {}

    def engine_params(self, sim: SimConfig) -> dict[str, Any]:
        return sim_engine_params(sim)
