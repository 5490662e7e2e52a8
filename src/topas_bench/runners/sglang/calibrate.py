"""`topas-bench calibrate`: fit the cost model's efficiencies and overheads to an SGLang log.

SGLang 0.5.23 logs one line per prefill batch and one per `--decode-log-interval` (40) decode
steps (`managers/scheduler_components/metrics_reporter.py`):

    [2026-11-29 20:40:01 TP0] Prefill batch, #new-seq: 2, #new-token: 4096, #cached-token: 512,
        token usage: 0.21, #running-req: 3, #queue-req: 5, ..., input throughput (token/s): 1.2e4
    [2026-11-29 20:40:02 TP0] Decode batch, #running-req: 5, #token: 12345, token usage: 0.60,
        ..., gen throughput (token/s): 678.90, #queue-req: 2

Decode: a step of the logged batch takes `running / gen throughput` seconds (the throughput is
measured over the last interval) with `#token` KV tokens of context. In the cost model a decode
step is memory-bound on every GPU we model:
`T = c_step + c_layer L + W/(BW eta_w) + ctx kv_bytes/(BW eta_kv) + B c_req`, linear in
(1, ctx, B). One weighted least-squares fit (relative errors) gives all three coefficients
jointly: the intercept gives eta_w (with the preset's c_step and c_layer kept: one intercept
cannot separate them), the slope in ctx eta_kv, the slope in B c_req. Lines whose relative
residual is more than 4 robust standard deviations out (e.g. an interval that included a
prefill) are dropped and the fit repeated once.

The KV term is small (on an A100 with Qwen2.5-32B, at most a tenth of a step) and c_req B smaller
still, so a short log determines them poorly. The preset's values enter as weak priors (eta_kv
+-30%, c_req +-5 us, one standard deviation): a term the log barely constrains stays near the
preset's value instead of swinging with the noise, and a log that does constrain it (many
lines over a wide range of contexts) overrides them. Each efficiency comes with a 95% interval
from the fit's covariance; when eta_w's or eta_kv's standard error exceeds 10% of its value (an
interval wider than about +-20%), the fit carries a warning with that interval (`Fit.warnings`,
printed by the CLI).

Prefill: a prefill line's time is `#new-token / input throughput`, where SGLang measures the
throughput over the time since the previous prefill line; under load, prefill batches run back
to back and this is the batch's time. Lines of at least `min_prefill_tokens` new tokens are
compute-bound; each gives an eta_c, and the median is kept (robust to lines whose interval
included decode steps).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from topas_bench.errors import TopasError
from topas_bench.runners.records import TIMELINE_COLUMNS
from topas_bench.runners.sim.cost import CostModel, Efficiency, Preset
from topas_bench.runners.sim.preset import preset_toml as write_preset

_TIME = r"\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})[^\]]*\]\s+"
PREFILL = re.compile(
    _TIME + r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<new>\d+), "
    r"#cached-token: (?P<cached>\d+), .*?#running-req: (?P<running>\d+), "
    r"#queue-req: (?P<queue>\d+), .*?input throughput \(token/s\): (?P<tput>[0-9.]+)"
)
DECODE = re.compile(
    _TIME + r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), #token: (?P<tokens>\d+), "
    r".*?gen throughput \(token/s\): (?P<tput>[0-9.]+), #queue-req: (?P<queue>\d+)"
)


@dataclass(frozen=True)
class LogBatches:
    prefill: pd.DataFrame  # t_s, seqs, new, cached, running, queue, duration_s
    decode: pd.DataFrame  # t_s, running, tokens, queue, step_s


def parse_log(text: str) -> LogBatches:
    """Prefill and decode batch lines of an SGLang server log (other lines are ignored)."""
    pre: list[tuple[float, ...]] = []
    dec: list[tuple[float, ...]] = []
    t0: datetime | None = None
    for line in text.splitlines():
        m = PREFILL.search(line) or DECODE.search(line)
        if m is None:
            continue
        t = datetime.strptime(m["time"], "%Y-%m-%d %H:%M:%S")
        t0 = t0 or t
        ts = (t - t0).total_seconds()
        tput = float(m["tput"])
        if m.re is PREFILL:
            new = int(m["new"])
            dur = new / tput if tput > 0 else math.nan
            pre.append((ts, int(m["seqs"]), new, int(m["cached"]), int(m["running"]),
                        int(m["queue"]), dur))  # fmt: skip
        else:
            running = int(m["running"])
            step = running / tput if tput > 0 else math.nan
            dec.append((ts, running, int(m["tokens"]), int(m["queue"]), step))
    return LogBatches(
        pd.DataFrame(
            pre, columns=["t_s", "seqs", "new", "cached", "running", "queue", "duration_s"]
        ),
        pd.DataFrame(dec, columns=["t_s", "running", "tokens", "queue", "step_s"]),
    )


#: Weak priors (one standard deviation) on the terms a log determines poorly: eta_kv relative
#: to the preset's, and c_req in microseconds.
ETA_KV_PRIOR_REL_SD = 0.30
C_REQ_PRIOR_SD_US = 5.0
#: An efficiency whose relative standard error exceeds this gets a warning with its interval.
MAX_REL_SE = 0.10
#: Decode lines with a relative residual beyond this many robust standard deviations are dropped.
OUTLIER_SDS = 4.0
_Z95 = 1.959964


@dataclass(frozen=True)
class Estimate:
    """A fitted value and its 95% interval (``high`` may be inf: no upper bound)."""

    value: float
    low: float
    high: float
    rel_se: float  # standard error / value

    @property
    def determined(self) -> bool:
        return self.rel_se <= MAX_REL_SE

    def __str__(self) -> str:
        high = "1" if self.high >= 1.0 else f"{self.high:.3g}"
        return f"{self.value} (95% interval {self.low:.3g}-{high})"


@dataclass(frozen=True)
class Fit:
    efficiency: Efficiency
    decode_lines: int
    prefill_lines: int
    decode_rel_err: float  # median |model - measured| / measured over decode lines, after fit
    prefill_rel_err: float
    eta_w: Estimate | None = None
    eta_kv: Estimate | None = None
    c_req_se_us: float = math.nan
    decode_outliers: int = 0  # decode lines dropped as outliers
    warnings: tuple[str, ...] = ()


def fit(
    batches: LogBatches, preset: Preset, min_prefill_tokens: int = 1024, min_decode_lines: int = 3
) -> Fit:
    """Refit `preset`'s efficiencies and per-request overhead to the measured batches."""
    d = batches.decode.dropna()
    d = d[d["step_s"] > 0]
    if len(d) < min_decode_lines:
        raise TopasError(
            f"the log has {len(d)} usable decode batch lines; calibration needs at least "
            f"{min_decode_lines} (serve some load with the server's default logging first)"
        )
    g, m, e = preset.gpu, preset.model, preset.efficiency
    bw = g.hbm_tbps * 1e12
    fixed_s = (e.c_step_us + e.c_layer_us * m.n_layers) * 1e-6
    x = np.column_stack(
        [np.ones(len(d)), d["tokens"].to_numpy(float), d["running"].to_numpy(float)]
    )
    y = d["step_s"].to_numpy(float)
    k0 = preset.kv_bytes_per_token / (bw * e.eta_kv)
    prior = (np.array([math.nan, k0, e.c_req_us * 1e-6]),
             np.array([math.inf, ETA_KV_PRIOR_REL_SD * k0, C_REQ_PRIOR_SD_US * 1e-6]))  # fmt: skip
    keep = np.ones(len(y), dtype=bool)
    coef, cov = _wls(x, y, *prior)
    rel = 1.0 - x @ coef / y
    spread = 1.4826 * float(np.median(np.abs(rel - np.median(rel))))
    out = np.abs(rel - np.median(rel)) > OUTLIER_SDS * max(spread, 1e-4)
    if out.any() and (~out).sum() >= min_decode_lines:
        keep = ~out
        coef, cov = _wls(x[keep], y[keep], *prior)
    (intercept, per_token, per_req), se = coef, np.sqrt(np.diag(cov))
    warnings: list[str] = []
    eta_w = _estimate(
        "eta_w", m.weight_gb * 1e9 / bw, intercept - fixed_s, se[0], e.eta_w, warnings
    )
    eta_kv = _estimate("eta_kv", preset.kv_bytes_per_token / bw, per_token, se[1], e.eta_kv,
                       warnings)  # fmt: skip
    ctx = x[keep, 1]
    if not eta_kv.determined:
        warnings.append(
            f"eta_kv is poorly determined by this log: {eta_kv}; its decode lines' KV context "
            f"spans {ctx.min():,.0f}-{ctx.max():,.0f} tokens over {int(keep.sum())} lines. A "
            "longer log over a wider range of context sizes narrows it (the value leans toward "
            f"the preset's {e.eta_kv} when the log says little)"
        )
    if not eta_w.determined:
        warnings.append(f"eta_w is poorly determined by this log: {eta_w}")
    c_req_us = round(max(float(per_req), 0.0) * 1e6, 2)
    p = batches.prefill.dropna()
    p = p[(p["new"] >= min_prefill_tokens) & (p["duration_s"] > 0)]
    eta_c = e.eta_c
    if len(p):
        flops = 2.0 * m.params_b * 1e9 * p["new"] + 4.0 * m.n_q_heads * m.head_dim * m.n_layers * (
            p["new"] * p["cached"] + p["new"] * (p["new"] + 1) / 2 / p["seqs"].clip(lower=1)
        )
        overhead = fixed_s + c_req_us * 1e-6 * p["seqs"]
        compute_s = (p["duration_s"] - overhead).clip(lower=1e-9)
        eta_c = _fraction(float(np.median(flops / (g.peak_tflops * 1e12 * compute_s))), e.eta_c)
    if e.eta_attn or e.ridge_frac or e.c_req_layer_us:
        warnings.append(
            "the log fit reads decode steps as the original memory-bound line and prefills at "
            "eta_c; the base's eta_attn, ridge_frac and c_req_layer_us are kept as they are "
            "(a GPU profile fits them: `calibrate --profile`)"
        )
    eff = replace(e, eta_c=eta_c, eta_w=eta_w.value, eta_kv=eta_kv.value, c_req_us=c_req_us)
    cost = CostModel(replace(preset, efficiency=eff))
    dec_err = [
        abs(cost.decode_step_s(int(b), int(c)) - s) / s
        for b, c, s in zip(d["running"], d["tokens"], d["step_s"], strict=True)
    ]
    pre_err = [
        abs(cost.prefill_s([(int(c), int(n))]) - t) / t
        for n, c, t in zip(p["new"], p["cached"], p["duration_s"], strict=True)
    ]
    return Fit(
        eff, len(d), len(p), float(np.median(dec_err)),
        float(np.median(pre_err)) if pre_err else math.nan,
        eta_w=eta_w, eta_kv=eta_kv, c_req_se_us=float(se[2]) * 1e6,
        decode_outliers=int((~keep).sum()), warnings=tuple(warnings),
    )  # fmt: skip


def _wls(
    x: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    prior_mean: npt.NDArray[np.float64],
    prior_sd: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Least squares of ``x @ coef ~ y`` with relative errors of a common (estimated) size, plus
    independent Gaussian priors (an infinite sd: none); the coefficients and their covariance."""
    n, k = x.shape
    has = np.isfinite(prior_sd)
    rows = np.eye(k)[has] / prior_sd[has, None]
    target = prior_mean[has] / prior_sd[has]
    sigma = 0.03  # relative noise; re-estimated from the residuals
    for _ in range(4):
        a = np.vstack([x / (y * sigma)[:, None], rows])
        t = np.concatenate([np.full(n, 1.0 / sigma), target])
        scale = np.linalg.norm(a, axis=0)
        scale[scale == 0] = 1.0
        sol, *_ = np.linalg.lstsq(a / scale, t, rcond=None)
        coef = sol / scale
        rel = 1.0 - x @ coef / y
        dof = max(n + int(has.sum()) - k, 1)
        sigma = max(float(np.sqrt(rel @ rel / dof)), 1e-6)
    a = np.vstack([x / (y * sigma)[:, None], rows]) / scale
    cov = np.linalg.pinv(a.T @ a) / np.outer(scale, scale)
    return coef, cov


def _estimate(
    name: str, numerator: float, denom: float, se: float, fallback: float, warnings: list[str]
) -> Estimate:
    """An efficiency ``numerator / denom`` with its 95% interval from ``denom``'s standard
    error; a non-physical fit keeps the preset's value (and says so)."""
    value = _fraction(numerator / denom if denom > 0 else math.nan, math.nan)
    if math.isnan(value):
        warnings.append(f"{name}: the fit is not physical; kept the preset's {fallback}")
        return Estimate(fallback, 0.0, math.inf, math.inf)
    hi_denom = denom - _Z95 * se
    return Estimate(
        value,
        numerator / (denom + _Z95 * se),
        numerator / hi_denom if hi_denom > 0 else math.inf,
        se / denom,
    )


def _fraction(x: float, fallback: float) -> float:
    """An efficiency in (0, 1]; a non-physical fit keeps the preset's value."""
    return round(x, 4) if math.isfinite(x) and 0.0 < x <= 1.0 else fallback


def preset_toml(
    preset: Preset, eff: Efficiency, name: str, source: str, notes: Sequence[str] = ()
) -> str:
    """A preset file (the packaged presets' schema) with the fitted `[efficiency]`; `notes`
    become comment lines under the header. Every other field, the newer terms included, is the
    base preset's."""
    header = [f"Calibrated by `topas-bench calibrate` from {source}, starting from {preset.name}."]
    fitted = replace(
        preset, name=name, description=f"{preset.description} (calibrated)", efficiency=eff
    )
    return write_preset(fitted, [*header, *notes], base=preset)


def timeline_from_log(text: str) -> pd.DataFrame:
    """The run's `timeline.parquet` from its server log (one row per logged batch line)."""
    b = parse_log(text)
    rows: list[tuple[Any, ...]] = [
        (r.t_s, "prefill", 1, r.duration_s, r.seqs, r.new, math.nan, math.nan, math.nan,
         r.queue, "", math.nan)
        for r in b.prefill.itertuples()
    ] + [
        (r.t_s, "decode", 1, r.step_s, r.running, r.running, r.tokens, math.nan, math.nan,
         r.queue, "", math.nan)
        for r in b.decode.itertuples()
    ]  # fmt: skip
    rows.sort(key=lambda x: float(x[0]))
    return pd.DataFrame(rows, columns=TIMELINE_COLUMNS)


def calibrate_file(log: Path, preset: Preset, out: Path, name: str | None = None) -> Fit:
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        raise TopasError(f"cannot read log {log}: {e.strerror}") from None
    result = fit(parse_log(text), preset)
    notes = [f"eta_w {result.eta_w}, eta_kv {result.eta_kv}" if result.eta_kv else ""]
    notes += [f"warning: {w}" for w in result.warnings]
    out.write_text(
        preset_toml(preset, result.efficiency, name or out.stem, str(log), [n for n in notes if n])
    )
    return result
