"""`topas-bench calibrate --profile`: fit a preset's cost model to a GPU iteration profile.

The profile's graph times are GPU time, so the model is compared without its host terms
(``c_step_us``, ``c_req_us``: scheduling, sampling, launching a step), which the fit keeps
from the base preset. Fitted, by least squares of log(predicted / measured) over the fit
split's points: ``eta_c`` and ``eta_attn`` (at most the GEMM check over the datasheet peak),
``eta_kv`` (at most the copy check over the datasheet bandwidth), ``c_layer_us``,
``c_req_layer_us`` and ``ridge_frac``. ``eta_w`` is set to the copy check: every iteration of
one shape has the same layer count, so the weight-streaming time and the per-layer cost are one
intercept and one shape cannot tell them apart (with both of the shared profile's shapes and
one per-layer cost, the joint fit puts eta_w at the copy check too: docs/fidelity.md, "Clock").
Without a copy check the base's eta_w stays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from topas_bench.errors import TopasError
from topas_bench.runners.sim.cost import CostModel, Efficiency, Preset
from topas_bench.runners.sim.iteration_profile import REGIONS, Point, Profile

#: The fitted terms, their lower bounds and their starting points when the base lacks them.
FITTED = ("eta_c", "eta_attn", "eta_kv", "c_layer_us", "c_req_layer_us", "ridge_frac")
_LOWER = (0.02, 0.02, 0.02, 0.0, 0.0, 0.0)
_UPPER_US = {"c_layer_us": 2000.0, "c_req_layer_us": 200.0}
_DIGITS = {"c_layer_us": 2, "c_req_layer_us": 3}  # the rest: 4 decimals


@dataclass(frozen=True)
class Bounds:
    """Upper bounds of the efficiencies (fractions of the datasheet), and eta_w's value."""

    gemm: float  # eta_c, eta_attn
    copy: float  # eta_kv
    eta_w: float
    why: str


@dataclass(frozen=True)
class RegionRow:
    region: str  # one of REGIONS (with " (eager)" for eager-timed points) or "all"
    split: str  # "fit" or "held out" (a check: "all", or "rest" and "held out")
    points: int
    before_median: float
    before_max: float
    after_median: float = math.nan  # nan: a check of one preset, no fit
    after_max: float = math.nan


@dataclass(frozen=True)
class ClockFit:
    preset: Preset  # the fitted preset (its name still the base's)
    base: Preset
    points: tuple[Point, ...]  # the points compared (those of the timing fitted)
    held: tuple[bool, ...]
    before: npt.NDArray[np.float64]  # relative error per point, base preset
    after: npt.NDArray[np.float64]  # relative error per point, fitted preset
    bounds: Bounds
    at_bound: tuple[str, ...]
    skipped_eager: int  # eager-timed points not compared (graph times were there)

    def rows(self) -> list[RegionRow]:
        return region_rows(self.points, self.held, self.before, self.after)


def region_rows(
    points: Sequence[Point],
    held: Sequence[bool],
    before: npt.NDArray[np.float64],
    after: npt.NDArray[np.float64] | None = None,
    splits: tuple[str, str] = ("fit", "held out"),
) -> list[RegionRow]:
    """Median and max absolute error per region and split, then over all points per split
    (eager-timed points apart from graph-timed ones, and left out of "all" when both exist)."""
    h = np.array(held, dtype=bool)
    eager = np.array([p.timing == "eager" for p in points])
    labels = np.array(
        [p.region + (" (eager)" if e else "") for p, e in zip(points, eager, strict=True)]
    )
    everything = ~eager if (~eager).any() else eager
    out: list[RegionRow] = []
    for label in (*REGIONS, *(f"{r} (eager)" for r in REGIONS), "all"):
        in_region = labels == label if label != "all" else everything
        for split, mask in ((splits[0], ~h), (splits[1], h)):
            m = in_region & mask
            if m.any():
                b = np.abs(before[m])
                row = [float(np.median(b)), float(b.max())]
                if after is not None:
                    a = np.abs(after[m])
                    row += [float(np.median(a)), float(a.max())]
                out.append(RegionRow(label, split, int(m.sum()), *row))
    return out


def gpu_cost(preset: Preset) -> CostModel:
    """The preset's model without its host terms: what a graph-timed profile measures."""
    eff = replace(preset.efficiency, c_step_us=0.0, c_req_us=0.0)
    return CostModel(replace(preset, efficiency=eff))


def rel_errors(preset: Preset, points: Sequence[Point]) -> npt.NDArray[np.float64]:
    cost = gpu_cost(preset)
    return np.array([p.predict_s(cost) / p.seconds - 1.0 for p in points])


def bounds(
    base: Preset, profile: Profile, gemm_tflops: float | None, copy_tbps: float | None
) -> Bounds:
    g = base.gpu
    gemm = gemm_tflops or profile.gemm_tflops
    copy = copy_tbps or profile.copy_tbps
    gemm_frac = min(gemm / g.peak_tflops, 1.0) if gemm else 1.0
    copy_frac = min(copy / g.hbm_tbps, 1.0) if copy else 1.0
    why = [
        f"eta_c, eta_attn <= {gemm_frac:.4f} (GEMM check {gemm:g} of {g.peak_tflops:g} TFLOP/s)"
        if gemm
        else "eta_c, eta_attn <= 1 (no GEMM check)",
        f"eta_kv <= {copy_frac:.4f}, eta_w = {copy_frac:.4f} (copy check {copy:g} of "
        f"{g.hbm_tbps:g} TB/s)"
        if copy
        else f"eta_kv <= 1, eta_w = the base's {base.efficiency.eta_w} (no copy check)",
    ]
    eta_w = round(copy_frac, 4) if copy else base.efficiency.eta_w
    return Bounds(round(gemm_frac, 4), round(copy_frac, 4), eta_w, "; ".join(why))


def fit_profile(
    profile: Profile,
    base: Preset,
    held: Sequence[bool],
    gemm_tflops: float | None = None,
    copy_tbps: float | None = None,
    vocab: int | None = None,
) -> ClockFit:
    """Fit `FITTED` on the points not held out (graph-timed ones when there are any).

    ``vocab`` (else the profile's shape line's) splits the vocabulary out of a base model that
    has not: an untied embedding table and LM head of ``vocab x hidden`` each (a tied model,
    per the shape line: the head only)."""
    timing = "graph" if any(p.timing == "graph" for p in profile.points) else "eager"
    keep = [i for i, p in enumerate(profile.points) if p.timing == timing]
    points = tuple(profile.points[i] for i in keep)
    held_t = tuple(bool(held[i]) for i in keep)
    train = [p for p, h in zip(points, held_t, strict=True) if not h]
    kinds = {p.kind for p in train}
    if kinds != {"prefill", "decode"} or len(train) < 2 * len(FITTED):
        raise TopasError(
            f"the fit split has {len(train)} points ({', '.join(sorted(kinds)) or 'none'}); "
            f"the fit needs prefill and decode points, at least {2 * len(FITTED)} in all"
        )
    base_model = base
    base = _with_vocab(base, profile, vocab)
    b = bounds(base, profile, gemm_tflops, copy_tbps)
    upper = np.array([b.gemm, b.gemm, b.copy, *_UPPER_US.values(), 1.0])
    lower = np.array(_LOWER)
    eff0 = replace(base.efficiency, eta_w=b.eta_w)
    measured = np.array([p.seconds for p in train])

    def preset_of(x: Sequence[float] | npt.NDArray[np.float64]) -> Preset:
        values = dict(zip(FITTED, (float(v) for v in x), strict=True))
        return replace(base, efficiency=replace(eff0, **values))

    def residuals(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        cost = gpu_cost(preset_of(x))
        out: npt.NDArray[np.float64] = np.log(
            np.array([p.predict_s(cost) for p in train]) / measured
        )
        return out

    from scipy.optimize import least_squares

    best = None
    for start in _starts(eff0, lower, upper):
        res = least_squares(residuals, start, bounds=(lower, upper), x_scale="jac")
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    fitted = [_rounded(n, float(v)) for n, v in zip(FITTED, best.x, strict=True)]
    preset = preset_of(fitted)
    at = tuple(
        n
        for n, v, lo, hi in zip(FITTED, best.x, lower, upper, strict=True)
        if math.isclose(v, hi, rel_tol=1e-3) or (lo > 0 and math.isclose(v, lo, rel_tol=1e-3))
    )
    return ClockFit(
        preset, base_model, points, held_t, rel_errors(base_model, points),
        rel_errors(preset, points), b, at, len(profile.points) - len(points),
    )  # fmt: skip


def _with_vocab(base: Preset, profile: Profile, vocab: int | None) -> Preset:
    m, info = base.model, profile.shape_info or {}
    vocab = vocab or info.get("vocab")
    if not vocab or m.embedding_params_b or m.lm_head_params_b:
        return base
    matrix_b = round(vocab * m.hidden / 1e9, 6)
    emb = 0.0 if info.get("tied") else matrix_b
    return replace(base, model=replace(m, embedding_params_b=emb, lm_head_params_b=matrix_b))


def _starts(
    eff: Efficiency, lower: npt.NDArray[np.float64], upper: npt.NDArray[np.float64]
) -> list[npt.NDArray[np.float64]]:
    """A few starting points (the fit has shallow valleys along ridge_frac)."""
    attn = eff.eta_attn or 0.6 * eff.eta_c
    out = []
    for ridge in (0.1, 0.5, 0.9):
        x = np.array([eff.eta_c, attn, eff.eta_kv, eff.c_layer_us, eff.c_req_layer_us, ridge])
        out.append(np.clip(x, lower + 1e-9, upper - 1e-9))
    return out


def _rounded(name: str, value: float) -> float:
    return round(value, _DIGITS.get(name, 4))


def render_rows(rows: Sequence[RegionRow], markdown: bool = False) -> str:
    """The error table, as `calibrate` prints it (or as a Markdown table); one error column
    when the rows are a check of one preset."""
    fitted = any(not math.isnan(r.after_median) for r in rows)
    head = ["region", "split", "points"]
    head += ["before: median / max", "after: median / max"] if fitted else ["median / max"]
    body = []
    for r in rows:
        cells = [r.region, r.split, str(r.points), f"{r.before_median:.1%} / {r.before_max:.1%}"]
        if fitted:
            cells.append(f"{r.after_median:.1%} / {r.after_max:.1%}")
        body.append(cells)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]

    def text(x: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(x, widths, strict=True))
        )

    return "\n".join(text(x) for x in (head, *body))


def fitted_toml(fit: ClockFit, name: str, command: str) -> str:
    """The fitted preset as a file, saying where each number came from (``command``: how it was
    made)."""
    from topas_bench.runners.sim.preset import preset_toml

    rows = {r.split: r for r in fit.rows() if r.region == "all"}
    errors = "; ".join(
        f"{s} {r.points} points, median {r.after_median:.1%}, max {r.after_max:.1%}"
        for s, r in rows.items()
    )
    header = [
        f"Calibrated to a GPU iteration profile (shape {fit.points[0].shape}, "
        f"{fit.points[0].timing} times) by:",
        f"  {command}",
        f"Absolute error of the GPU time: {errors}.",
        f"Bounds: {fit.bounds.why}.",
        f"c_step_us and c_req_us are the base's ({fit.base.name}): host time, which a GPU "
        "profile does not see.",
    ]
    fit_note = "fitted to the profile"
    comments = {f"efficiency.{n}": fit_note + (" (at its bound)" if n in fit.at_bound else "")
                for n in FITTED}  # fmt: skip
    comments["efficiency.eta_w"] = (
        "the copy check (one shape cannot tell it from c_layer_us)"
        if fit.bounds.eta_w != fit.base.efficiency.eta_w
        else "the base's"
    )
    comments["efficiency.c_step_us"] = comments["efficiency.c_req_us"] = "the base's (host time)"
    if fit.preset.model != fit.base.model:
        for key in ("embedding_params_b", "lm_head_params_b"):
            comments[f"model.{key}"] = "vocab x hidden (the vocabulary split out for the fit)"
    preset = replace(fit.preset, name=name, description=f"{fit.base.description} (calibrated)")
    return preset_toml(preset, header, comments, base=fit.base)
