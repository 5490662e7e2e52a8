"""Iteration profiles: GPU times of whole prefill and decode iterations, one JSON object a line
(docs/gpu.md, "The iteration profile format"; written by `topas-bench profile`, read by
`topas-bench calibrate --profile`).

A point is a prefill (extend) iteration of requests ``(cached, new)`` or a decode step of
``batch`` requests over ``context`` cached tokens each; its time is ``graph_ms`` (a replayed CUDA
graph: the GPU's own time) where present, else ``ms`` (eager: Python launches every kernel, so
a small iteration measures the launches). Anchor lines carry the GPU's peak checks (a large
BF16 GEMM's TFLOP/s, a device-to-device copy's TB/s counting bytes read and written), which
bound the efficiencies a fit may reach.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.sim.cost import CostModel

#: Region boundaries (docs/fidelity.md, "Clock"): a prefill whose requests attend to this many
#: cached tokens or more has a long prefix; a decode step of this many requests or more is a
#: large batch (where the GEMMs near their ridge).
LONG_PREFIX_TOKENS = 8192
LARGE_BATCH = 64
REGIONS = (
    "prefill, short prefix",
    "prefill, long prefix",
    "decode, small batch",
    "decode, large batch",
)
HOLD_OUT_KEYS = ("cached", "new", "batch", "context")


@dataclass(frozen=True)
class Point:
    """One measured iteration."""

    shape: str
    kind: str  # "prefill" or "decode"
    items: tuple[tuple[int, int], ...]  # prefill: (cached, new) per request; decode: ((c, 1),)
    batch: int
    seconds: float
    timing: str  # "graph" or "eager"
    where: str  # file:line

    @property
    def context(self) -> int:
        """Decode: each request's cached tokens (c); prefill: the largest cached prefix."""
        return max(c for c, _ in self.items)

    @property
    def region(self) -> str:
        if self.kind == "prefill":
            return REGIONS[1] if self.context >= LONG_PREFIX_TOKENS else REGIONS[0]
        return REGIONS[3] if self.batch >= LARGE_BATCH else REGIONS[2]

    def predict_s(self, cost: CostModel) -> float:
        """The model's time of this iteration."""
        if self.kind == "prefill":
            return cost.prefill_s(self.items)
        return cost.decode_step_s(self.batch, self.batch * (self.context + 1))

    def label(self) -> str:
        if self.kind == "decode":
            return f"decode {self.batch} x c={self.context}"
        (c, n), k = self.items[0], len(self.items)
        same = all(it == self.items[0] for it in self.items)
        what = f"({c}, {n})" if same else "mixed"
        return f"prefill {what}" + (f" x {k}" if k > 1 else "")


@dataclass(frozen=True)
class Profile:
    """The points of one shape, and the files' peak checks (None where none was measured)."""

    points: tuple[Point, ...]
    gemm_tflops: float | None
    copy_tbps: float | None
    devices: tuple[str, ...]
    shape_info: dict[str, Any] | None  # the `shape` line, if the profiler wrote one


def read_profile(paths: Sequence[Path], shape: str) -> Profile:
    """The points of ``shape`` in the profile files (lines with an ``error`` are skipped), with
    the highest GEMM and copy checks found in any of them."""
    points: list[Point] = []
    gemm = copy = None
    devices: list[str] = []
    shapes: set[str] = set()
    info: dict[str, Any] | None = None
    for path in paths:
        for n, row in _rows(path):
            kind = row.get("kind")
            if kind == "anchor":
                if "tflops" in row:
                    gemm = max(gemm or 0.0, float(row["tflops"]))
                if "tbps_rw" in row:
                    copy = max(copy or 0.0, float(row["tbps_rw"]))
            elif kind == "info" and row.get("device"):
                devices.append(str(row["device"]))
            elif kind == "shape" and row.get("model") == shape:
                info = row
            elif kind in ("prefill", "decode") and "model" in row:
                shapes.add(str(row["model"]))
                if row["model"] == shape and "error" not in row:
                    points.append(_point(row, f"{path}:{n}"))
    if not points:
        known = ", ".join(sorted(shapes)) or "none"
        raise TopasError(f"no timed points of shape {shape!r} in the profile (shapes: {known})")
    return Profile(tuple(points), gemm, copy, tuple(dict.fromkeys(devices)), info)


def _rows(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TopasError(f"cannot read profile {path}: {e.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TopasError(f"{path}:{n}: not JSON: {e.msg}") from None
        if isinstance(row, dict):
            yield n, row


def _point(row: dict[str, Any], where: str) -> Point:
    try:
        items = tuple((int(c), int(n)) for c, n in row["items"])
        batch = int(row.get("batch", len(items)))
        graph = row.get("graph_ms")
        ms = float(graph if graph is not None else row["ms"])
    except (KeyError, TypeError, ValueError) as e:
        raise TopasError(f"{where}: a {row.get('kind')} line needs items and ms: {e}") from None
    if row["kind"] == "decode":
        context = int(row.get("context", items[0][0]))
        items = ((context, 1),)
    elif batch != len(items):
        raise TopasError(f"{where}: batch {batch} but {len(items)} items")
    if not (items and math.isfinite(ms) and ms > 0):
        raise TopasError(f"{where}: needs items and a positive time")
    timing = "graph" if graph is not None else "eager"
    return Point(str(row["model"]), row["kind"], items, batch, ms / 1e3, timing, where)


def hold_out_rule(specs: Sequence[str]) -> dict[str, frozenset[int]]:
    """``KEY=V[,V...]`` (KEY one of `HOLD_OUT_KEYS`) -> the rule `held_out` applies."""
    rule: dict[str, frozenset[int]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or key not in HOLD_OUT_KEYS:
            raise TopasError(
                f"--hold-out {spec!r}: expected KEY=V[,V...] with KEY one of "
                f"{', '.join(HOLD_OUT_KEYS)}"
            )
        try:
            rule[key] = rule.get(key, frozenset()) | {int(v) for v in values.split(",")}
        except ValueError:
            raise TopasError(f"--hold-out {spec!r}: values must be integers") from None
    return rule


def held_out(p: Point, rule: dict[str, frozenset[int]]) -> bool:
    """Whether the rule holds ``p`` out: any key matches. ``cached`` and ``new`` match a
    prefill whose every request has one of the values; ``batch`` any iteration of that many
    requests; ``context`` a decode step over that many cached tokens per request."""
    pre = p.kind == "prefill"
    return (
        (pre and "cached" in rule and all(c in rule["cached"] for c, _ in p.items))
        or (pre and "new" in rule and all(n in rule["new"] for _, n in p.items))
        or p.batch in rule.get("batch", ())
        or (not pre and p.context in rule.get("context", ()))
    )
