"""What the reference engine's driver is asked to run: plain JSON, read on both sides of the
venv boundary (no SGLang import)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.runners.sim.config import SimConfig


@dataclass(frozen=True)
class ServerSettings:
    """The SGLang server the driver builds, from the run's `SimConfig`."""

    kv_budget_tokens: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int
    context_length: int
    clip_max_new_tokens: int
    init_new_token_ratio: float
    min_new_token_ratio_factor: float
    new_token_ratio_decay_steps: int
    retract_decode_steps: int
    record_timeline: bool = True
    #: SGLang's default TreeCore backend (its bundled Rust extension), as a server runs it.
    tree_core: str = "rust"

    @classmethod
    def of(cls, cfg: SimConfig) -> ServerSettings:
        return cls(
            kv_budget_tokens=cfg.kv_budget_tokens,
            chunked_prefill_size=cfg.chunked_prefill_size,
            max_prefill_tokens=cfg.max_prefill_tokens,
            max_running_requests=cfg.max_running_requests,
            context_length=cfg.context_length,
            clip_max_new_tokens=cfg.clip_max_new_tokens,
            init_new_token_ratio=cfg.init_new_token_ratio,
            min_new_token_ratio_factor=cfg.min_new_token_ratio_factor,
            new_token_ratio_decay_steps=cfg.new_token_ratio_decay_steps,
            retract_decode_steps=cfg.retract_decode_steps,
            record_timeline=cfg.record_timeline,
        )


@dataclass(frozen=True)
class Cell:
    scheduler: str
    out: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    trace: str
    preset: str
    server: ServerSettings
    cells: tuple[Cell, ...]

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> Job:
        raw = json.loads(path.read_text())
        return cls(
            trace=raw["trace"],
            preset=raw["preset"],
            server=ServerSettings(**raw["server"]),
            cells=tuple(Cell(**c) for c in raw["cells"]),
        )
