"""Hardware presets: one TOML file per GPU x model pair in ``presets/`` (or a user's file), parsed
into frozen dataclasses whose field names carry their units, and written back (`preset_toml`).
`cost.CostModel` turns a preset into iteration durations (docs/design.md section 4)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import textwrap
import tomllib
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

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
            bound = (
                ("in [0, 1]" if zero_ok else "in (0, 1]")
                if fraction
                else ">= 0"
                if zero_ok
                else "> 0"
            )
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
    #: The input embedding table (vocab x hidden): a lookup, never streamed nor multiplied.
    #: 0: every parameter is streamed per iteration (the original accounting).
    embedding_params_b: float = 0.0
    #: The output projection: runs on each request's last token only (SGLang computes the logits
    #: of an extend's last position), so a prefill pays it per request, not per new token.
    #: 0: every parameter runs on every new token (the original accounting).
    lm_head_params_b: float = 0.0

    def __post_init__(self) -> None:
        names = ("params_b", "n_layers", "n_q_heads", "n_kv_heads", "head_dim", "weight_gb")
        _check(self, "model", names)
        _check(self, "model", ("embedding_params_b", "lm_head_params_b"), zero_ok=True)
        if self.embedding_params_b + self.lm_head_params_b >= self.params_b:
            raise TopasError(
                "model.embedding_params_b + model.lm_head_params_b must be below model.params_b"
            )

    @property
    def hidden(self) -> int:
        """Hidden size, ``n_q_heads * head_dim`` (true of Llama and Qwen2 models)."""
        return self.n_q_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads; defaults are docs/design.md section 4's.

    The last three terms came with the GPU profile (docs/fidelity.md, "Clock"); their defaults
    leave the original model exactly as it was. ``c_step_us`` and ``c_req_us`` are host time
    (scheduling, sampling, launching a step), absent from a GPU's own iteration time; the rest is
    GPU time.
    """

    eta_c: float = 0.55
    eta_w: float = 0.72
    eta_kv: float = 0.55
    c_step_us: float = 130.0
    c_layer_us: float = 32.0
    c_req_us: float = 4.4
    #: Attention kernels' achieved fraction of peak FLOPs; > 0 makes attention a kernel of its
    #: own (its FLOPs and KV read on their own roofline, after the GEMMs'). 0: attention's
    #: FLOPs at eta_c on the GEMMs' roofline and its KV read beside the weights (the original).
    eta_attn: float = 0.0
    #: How much longer than either roof a kernel takes at its ridge (compute time = memory time),
    #: as a fraction: 0 is the sharp roofline max(compute, memory); 1 is no overlap at all,
    #: compute + memory. Between them a hyperbola (`CostModel`), smooth through the ridge.
    ridge_frac: float = 0.0
    #: GPU time per request per layer in a batch (the attention kernel's work per sequence: its
    #: blocks' setup and merge), beside c_req_us's host time per request.
    c_req_layer_us: float = 0.0

    def __post_init__(self) -> None:
        _check(self, "efficiency", ("eta_c", "eta_w", "eta_kv"), fraction=True)
        _check(self, "efficiency", ("eta_attn", "ridge_frac"), zero_ok=True, fraction=True)
        # A fit may drive an overhead to zero.
        names = ("c_step_us", "c_layer_us", "c_req_us", "c_req_layer_us")
        _check(self, "efficiency", names, zero_ok=True)


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
        values = json.dumps(_identity(preset), sort_keys=True)
        digest = hashlib.sha256(values.encode()).hexdigest()[:8]
        return replace(preset, name=f"{preset.name}@{digest}", source=os.path.abspath(spec))
    if spec not in preset_names():
        raise UnknownNameError(
            f"unknown preset {spec!r}; known: {', '.join(preset_names())} "
            "(or a path to a preset .toml file)"
        )
    resource = _PRESETS / f"{spec}.toml"
    return _parse(resource.read_text(encoding="utf-8"), source=str(resource))


#: Fields added after preset files were first hashed: left out of a file's hash while 0 (their
#: default), so a file that does not use them keeps its name and its runs' directories.
_LATER_FIELDS = {
    "model": ("embedding_params_b", "lm_head_params_b"),
    "efficiency": ("eta_attn", "ridge_frac", "c_req_layer_us"),
}


def _identity(preset: Preset) -> dict[str, Any]:
    values = asdict(replace(preset, source=None))
    for section, names in _LATER_FIELDS.items():
        for name in names:
            if values[section][name] == 0.0:
                del values[section][name]
    return values


def preset_toml(
    preset: Preset,
    header: Sequence[str] = (),
    comments: dict[str, str] | None = None,
    base: Preset | None = None,
) -> str:
    """A preset file (the packaged files' schema) with every field of ``preset``.

    ``header`` lines become comments at the top (wrapped, but for lines that start with two
    spaces); ``comments["section.key"]`` (or ``["name"]``) an end-of-line comment; a key
    without one keeps the comment it has in ``base``'s file when its value is the same there.
    """
    notes = {**_file_comments(base), **(comments or {})} if base else dict(comments or {})

    def line(where: str, key: str, value: Any) -> str:
        if isinstance(value, str):
            text = f'{key} = "{value}"'
        else:  # an int stays one; a float (or numpy scalar) is written as its shortest repr
            text = f"{key} = {value if isinstance(value, int) else float(value)!r}"
        note = notes.get(f"{where}.{key}" if where else key)
        return f"{text:<27} # {note}" if note else text

    def section(where: str, obj: Any) -> list[str]:
        return ["", f"[{where}]", *(line(where, f.name, getattr(obj, f.name)) for f in fields(obj))]

    out = [f"# {w}" for h in header for w in ([h] if h.startswith("  ") else textwrap.wrap(h, 96))]
    out += [line("", "name", preset.name), line("", "description", preset.description)]
    out += section("gpu", preset.gpu) + section("model", preset.model)
    out += section("efficiency", preset.efficiency)
    out += ["", "[serving]", line("serving", "mem_fraction_static", preset.mem_fraction_static)]
    return "\n".join([*out, ""])


def _file_comments(preset: Preset) -> dict[str, str]:
    """``section.key`` -> the end-of-line comment of the key in ``preset``'s file, for the keys
    whose value there is the preset's (a preset without a readable file: none)."""
    try:
        text = Path(preset.source or "").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    values = asdict(preset)
    out: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, eq, rest = line.partition("=")
        value, hash_, note = rest.partition("#")
        if not (eq and hash_ and note.strip()):
            continue
        key = key.strip()
        try:
            parsed = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            continue
        table = values.get(section, values) if section else values
        if isinstance(table, dict) and table.get(key) == parsed:
            out[f"{section}.{key}" if section else key] = note.strip()
    return out


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
