"""Hardware presets and the per-iteration cost model of the simulated engine (docs/design.md
section 4).

A preset is data: one TOML file per GPU x model pair in ``presets/``, parsed into frozen
dataclasses whose field names carry their units. `CostModel` turns a preset into iteration
durations with a roofline plus fitted overheads:

    T = c_step + c_layer*L + c_req*B + max(FLOPs/(peak*eta_c), W/(BW*eta_w) + KV_read/(BW*eta_kv))

The efficiencies and overheads are starting points; a `calibrate` command refits them from
measured iteration times and swaps them in with `dataclasses.replace`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import numpy as np
import numpy.typing as npt

from topas_bench.errors import TopasError, UnknownNameError, not_utf8

#: KV cache element size: SGLang's default KV dtype follows the BF16 model dtype.
KV_DTYPE_BYTES = 2


def _check(
    obj: object,
    section: str,
    names: Sequence[str],
    *,
    zero_ok: bool = False,
    fraction: bool = False,
) -> None:
    """Raise naming ``section.name`` unless each value is > 0 (or >= 0), and <= 1 if a fraction."""
    for name in names:
        value = getattr(obj, name)
        if not ((value >= 0 if zero_ok else value > 0) and (value <= 1 or not fraction)):
            bound = "in (0, 1]" if fraction else ">= 0" if zero_ok else "> 0"
            raise TopasError(f"{section}.{name} must be {bound}, got {value}")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU: dense BF16 peak, HBM bandwidth, memory, host link (decimal GB and TB)."""

    name: str
    peak_tflops: float
    hbm_tbps: float
    memory_gb: float
    host_link_gbps: float

    def __post_init__(self) -> None:
        _check(self, "gpu", ("peak_tflops", "hbm_tbps", "memory_gb", "host_link_gbps"))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A dense decoder-only transformer with grouped-query attention, served in BF16."""

    name: str
    params_b: float
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    weight_gb: float

    def __post_init__(self) -> None:
        names = ("params_b", "n_layers", "n_q_heads", "n_kv_heads", "head_dim", "weight_gb")
        _check(self, "model", names)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads; defaults are docs/design.md section 4's."""

    eta_c: float = 0.55
    eta_w: float = 0.72
    eta_kv: float = 0.55
    c_step_us: float = 130.0
    c_layer_us: float = 32.0
    c_req_us: float = 4.4

    def __post_init__(self) -> None:
        _check(self, "efficiency", ("eta_c", "eta_w", "eta_kv"), fraction=True)
        # A fit may drive an overhead to zero.
        _check(self, "efficiency", ("c_step_us", "c_layer_us", "c_req_us"), zero_ok=True)


@dataclass(frozen=True, slots=True)
class Preset:
    """A named GPU x model pair with its efficiencies and SGLang's static memory fraction."""

    name: str
    description: str
    gpu: GpuSpec
    model: ModelSpec
    efficiency: Efficiency = field(default_factory=Efficiency)
    mem_fraction_static: float = 0.88
    #: The absolute path of a preset loaded from a file by `load_preset` (None: packaged), so
    #: another process (the SGLang plugin) can load the same preset. Not part of the value.
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(self, "serving", ("mem_fraction_static",), fraction=True)
        if self.derived_kv_budget_tokens <= 0:
            raise TopasError(
                f"preset {self.name!r}: weights ({self.model.weight_gb} GB) leave no KV memory in "
                f"{self.gpu.memory_gb} GB x mem_fraction_static {self.mem_fraction_static}"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: ``n_layers * n_kv_heads * head_dim * 2 * KV_DTYPE_BYTES``."""
        m = self.model
        return m.n_layers * m.n_kv_heads * m.head_dim * 2 * KV_DTYPE_BYTES

    @property
    def derived_kv_budget_tokens(self) -> int:
        """KV pool size as SGLang sizes it: static memory fraction minus weights, in tokens.

        Ignores activations and CUDA-graph buffers, so it is an upper estimate; the simulator
        takes the budget as an explicit, printed input that defaults to this value.
        """
        free_bytes = self.gpu.memory_gb * 1e9 * self.mem_fraction_static
        return math.floor((free_bytes - self.model.weight_gb * 1e9) / self.kv_bytes_per_token)


class CostModel:
    """Iteration durations (seconds) of one engine on one preset; pure and stateless.

    Counts, per iteration: linear FLOPs ``2 * N_params`` per new token; causal attention FLOPs
    ``4 * n_q_heads * head_dim * n_layers`` per (new token, attended position) pair, the token
    itself included; weights read once; the KV of every token in the batch's contexts (cached
    and new) read once.
    """

    def __init__(self, preset: Preset) -> None:
        self.preset = preset
        g, m, e = preset.gpu, preset.model, preset.efficiency
        flops_per_s = g.peak_tflops * 1e12 * e.eta_c
        self._lin_s = 2.0 * m.params_b * 1e9 / flops_per_s  # per new token
        self._attn_s = 4.0 * m.n_q_heads * m.head_dim * m.n_layers / flops_per_s  # per pair
        self._weight_s = m.weight_gb * 1e9 / (g.hbm_tbps * 1e12 * e.eta_w)
        self._kv_s = preset.kv_bytes_per_token / (g.hbm_tbps * 1e12 * e.eta_kv)  # per token
        self._fixed_s = (e.c_step_us + e.c_layer_us * m.n_layers) * 1e-6
        self._req_s = e.c_req_us * 1e-6
        self._host_s = preset.kv_bytes_per_token / (g.host_link_gbps * 1e9)

    def _iteration_s(self, batch: int, new: int, pairs: int, context: int) -> float:
        compute_s = self._lin_s * new + self._attn_s * pairs
        memory_s = self._weight_s + self._kv_s * context
        return self._fixed_s + self._req_s * batch + max(compute_s, memory_s)

    def prefill_s(self, items: Sequence[tuple[int, int]]) -> float:
        """One prefill (extend) iteration; ``items`` are ``(cached_tokens, new_tokens)`` each."""
        if not items:
            raise ValueError("a prefill iteration needs at least one request")
        new = pairs = context = 0
        for cached, fresh in items:
            new += fresh
            pairs += fresh * cached + fresh * (fresh + 1) // 2
            context += cached + fresh
        return self._iteration_s(len(items), new, pairs, context)

    def prefill_token_s(self, tokens: int) -> float:
        """One prefill of ``tokens`` uncached tokens for a single request."""
        return self.prefill_s([(0, tokens)])

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode iteration: ``batch`` requests each produce one token.

        ``context_tokens`` is the sum of their contexts *including* the token being produced,
        so each new token attends to exactly its context and this equals
        ``prefill_s([(c, 1) for each request])`` with ``c`` its context minus one.
        """
        return self._iteration_s(batch, batch, context_tokens, context_tokens)

    def decode_steps_s(
        self, batch: int, context_tokens: int, steps: int
    ) -> npt.NDArray[np.float64]:
        """Durations of ``steps`` consecutive decode iterations of a fixed batch.

        The summed context grows by ``batch`` per step; element 0 equals
        ``decode_step_s(batch, context_tokens)`` exactly. The simulator's hot path: two arrays,
        in-place arithmetic in the same operation order as `_iteration_s`.
        """
        context = np.arange(steps, dtype=np.float64)
        context *= batch
        context += context_tokens
        compute = context * self._attn_s
        compute += self._lin_s * batch
        context *= self._kv_s
        context += self._weight_s
        np.maximum(compute, context, out=compute)
        compute += self._fixed_s + self._req_s * batch
        return compute

    def least_call_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """A lower bound on any call's time from ready to finish: each output token needs an
        iteration of its own, which costs at least a batch-of-one decode step over the call's
        context at that token (`_iteration_s` grows in every argument). Equals
        ``decode_steps_s(1, prompt_tokens, output_tokens).sum()``, in closed form: the sum of
        the larger of two lines in the context (compute and memory) over the call's tokens."""
        lo, n = prompt_tokens, output_tokens
        if n <= 0:
            return 0.0
        lin, attn, weight, kv = self._lin_s, self._attn_s, self._weight_s, self._kv_s
        # memory >= compute for contexts below `cross` when attn > kv (above it otherwise)
        slope = attn - kv
        cross = (weight - lin) / slope if slope else (math.inf if weight >= lin else -math.inf)
        below = (
            min(max(math.ceil(cross) - lo, 0), n)
            if math.isfinite(cross)
            else (n if cross > 0 else 0)
        )
        mem_first = slope >= 0  # memory bound for the smaller contexts

        def line(a: float, b: float, first: int, count: int) -> float:  # sum of a + b c
            return count * a + b * (2 * first + count - 1) * count / 2 if count else 0.0

        low = (weight, kv) if mem_first else (lin, attn)
        high = (lin, attn) if mem_first else (weight, kv)
        fixed = n * (self._fixed_s + self._req_s)
        return fixed + line(*low, lo, below) + line(*high, lo + below, n - below)

    def host_load_s(self, tokens: int) -> float:
        """Copy ``tokens`` of KV from host memory back to the GPU (HiCache-like tier)."""
        return tokens * self._host_s


_T = TypeVar("_T")
_PRESETS = resources.files("topas_bench.runners.sim") / "presets"
_SECTIONS = ("gpu", "model", "efficiency")
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def preset_names() -> list[str]:
    """Sorted names of the packaged presets (their file stems)."""
    return sorted(p.name[:-5] for p in _PRESETS.iterdir() if p.name.endswith(".toml"))


def is_preset_path(spec: str) -> bool:
    """Whether a `--preset` value names a file (a path separator, or a `.toml` ending)."""
    seps = [sep for sep in ("/", os.sep, os.altsep) if sep]
    return spec.endswith(".toml") or any(sep in spec for sep in seps)


def load_preset(spec: str) -> Preset:
    """A packaged preset by name, or a preset file (e.g. from `calibrate`) by path.

    A name that `is_preset_path` is read with `load_preset_file`; the preset is then named
    ``NAME@HASH``, its file's `name` plus the first 8 hex digits of the SHA-256 of its values
    (comments and formatting aside), so runs on two different files that share a name, or on
    one file before and after a recalibration, get different identities and directories.
    An unknown name raises `UnknownNameError` listing the known ones.
    """
    if is_preset_path(spec):
        preset = load_preset_file(spec)
        if not _SAFE_NAME.fullmatch(preset.name):
            raise TopasError(
                f"{spec}: preset name {preset.name!r} must be letters, digits, '.', '_' or '-' "
                "(it becomes part of run directory names)"
            )
        values = json.dumps(asdict(replace(preset, source=None)), sort_keys=True)
        digest = hashlib.sha256(values.encode()).hexdigest()[:8]
        return replace(preset, name=f"{preset.name}@{digest}", source=os.path.abspath(spec))
    if spec not in preset_names():
        raise UnknownNameError(
            f"unknown preset {spec!r}; known: {', '.join(preset_names())} "
            "(or a path to a preset .toml file)"
        )
    resource = _PRESETS / f"{spec}.toml"
    return _parse(resource.read_text(encoding="utf-8"), source=str(resource))


def load_preset_file(path: str | os.PathLike[str]) -> Preset:
    """A user's preset file with the packaged files' schema."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise TopasError(f"cannot read preset file {os.fspath(path)!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise TopasError(f"preset file {os.fspath(path)!r}: {not_utf8(err)}") from None
    return _parse(text, source=os.fspath(path))


def _parse(text: str, source: str) -> Preset:
    try:
        data = _table(tomllib.loads(text), "", {"name", "description", *_SECTIONS, "serving"})
        serving = _table(data.get("serving", {}), "serving", {"mem_fraction_static"})
        return Preset(
            name=_typed(data, "name", str, ""),
            description=_typed(data, "description", str, ""),
            gpu=_build(GpuSpec, data.get("gpu", {}), "gpu"),
            model=_build(ModelSpec, data.get("model", {}), "model"),
            efficiency=_build(Efficiency, data.get("efficiency", {}), "efficiency"),
            **{k: _typed(serving, k, float, "serving") for k in serving},
        )
    except tomllib.TOMLDecodeError as err:
        raise TopasError(f"{source}: invalid TOML: {err}") from None
    except TopasError as err:
        raise TopasError(f"{source}: {err}") from None


def _build(cls: type[_T], raw: object, section: str) -> _T:
    """``cls`` from a TOML table: required fields present, types checked, no unknown keys."""
    hints, fs = get_type_hints(cls), fields(cls)  # type: ignore[arg-type]
    table = _table(raw, section, {f.name for f in fs})
    needed = [f.name for f in fs if f.name in table or f.default is MISSING]
    return cls(**{n: _typed(table, n, hints[n], section) for n in needed})


def _table(raw: object, section: str, known: set[str]) -> dict[str, Any]:
    where = f"[{section}]" if section else "top level"
    if not isinstance(raw, dict):
        raise TopasError(f"{where} must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TopasError(f"unknown key(s) at {where}: {', '.join(unknown)}")
    return raw


def _typed(table: dict[str, Any], key: str, kind: Any, section: str) -> Any:
    full = f"{section}.{key}" if section else key
    if key not in table:
        raise TopasError(f"missing key '{full}'")
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TopasError(f"key '{full}' must be {kind.__name__}, got {value!r}")
    return value
