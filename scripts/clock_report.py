"""The clock's error tables and figure (docs/fidelity.md, "Clock"), from the committed profile
(results/gpu/) and presets: each shape's points measured against the preset before calibration
and the packaged, calibrated one, per region and split.

    python scripts/clock_report.py            # writes results/gpu/clock.md and clock.png
    python scripts/clock_report.py --no-figure

tests/test_clock.py checks that results/gpu/clock.md and docs/fidelity.md hold what `tables()`
computes now.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from topas_bench.runners.sim.clock_fit import region_rows, rel_errors, render_rows
from topas_bench.runners.sim.cost import load_preset
from topas_bench.runners.sim.iteration_profile import (
    Point,
    held_out,
    hold_out_rule,
    read_profile,
)

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "results" / "gpu"
GRAPHS, EAGER = GPU / "h200-profile-graphs.jsonl", GPU / "h200-profile-eager.jsonl"
#: shape -> (the calibrated preset, the preset before calibration)
SHAPES = {
    "llama3-8b": ("h200-llama8b", GPU / "h200-llama8b-uncalibrated.toml"),
    "qwen2.5-32b": ("h200-qwen32b", GPU / "h200-qwen32b-uncalibrated.toml"),
}
#: The split the packaged presets were fitted on (their headers carry the command).
RULE = ["cached=2048", "batch=2,8,32,96,192"]


def _points(path: Path, shape: str) -> tuple[list[Point], list[bool]]:
    rule = hold_out_rule(RULE)
    pts = list(read_profile([path], shape).points)
    return pts, [held_out(p, rule) for p in pts]


def tables() -> str:
    """The Markdown of results/gpu/clock.md."""
    out = [
        "# The clock against the H200 profile",
        "",
        "Made by `python scripts/clock_report.py` from results/gpu/ and the packaged presets.",
        "Absolute error of the GPU time per point (the model without its host terms, c_step_us",
        "and c_req_us), median / max per region; before = the preset before calibration, after",
        f"= the packaged calibrated preset; held out = {'; '.join(RULE)} (not fitted).",
    ]
    for shape, (after_name, before_path) in SHAPES.items():
        after, before = load_preset(after_name), load_preset(str(before_path))
        pts, held = _points(GRAPHS, shape)
        rows = region_rows(pts, held, rel_errors(before, pts), rel_errors(after, pts))
        out += ["", f"## {shape}: {after_name} (graph times, {GRAPHS.name})", ""]
        out.append(render_rows(rows, markdown=True))
        pts, held = _points(EAGER, shape)
        rows = region_rows(pts, held, rel_errors(after, pts), splits=("rest", "held out"))
        out += ["", f"{after_name} on {EAGER.name} (an earlier run: decode graph times, prefill "
                "eager times, which include Python's kernel launches):", ""]  # fmt: skip
        out.append(render_rows(rows, markdown=True))
    return "\n".join([*out, ""])


def figure(path: Path) -> None:
    """Per point: predicted against measured (top), and the relative error (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5), height_ratios=(3, 2))
    for col, (shape, (after_name, before_path)) in enumerate(SHAPES.items()):
        top, bottom = axes[0, col], axes[1, col]
        pts, held = _points(GRAPHS, shape)
        measured = np.array([p.seconds for p in pts]) * 1e3
        h = np.array(held)
        before = rel_errors(load_preset(str(before_path)), pts)
        after = rel_errors(load_preset(after_name), pts)
        lo, hi = measured.min() * 0.7, measured.max() * 1.4
        line = np.array([lo, hi])
        top.fill_between(line, line * 0.88, line * 1.12, color="0.9", zorder=0,
                         label="within 12%")  # fmt: skip
        top.plot(line, line, color="k", lw=0.8, zorder=1)
        bottom.axhspan(-12, 12, color="0.9", zorder=0)
        bottom.axhline(0, color="k", lw=0.8, zorder=1)
        panels = ((top, measured * (1 + before), measured * (1 + after)),
                  (bottom, 100 * before, 100 * after))  # fmt: skip
        for ax, y_before, y_after in panels:
            ax.scatter(measured, y_before, s=28, facecolors="none", edgecolors="0.55",
                       label="before calibration", zorder=2)  # fmt: skip
            ax.scatter(measured[~h], y_after[~h], s=22, color="tab:blue",
                       label="after, fit split", zorder=3)  # fmt: skip
            ax.scatter(measured[h], y_after[h], s=24, color="tab:orange", marker="s",
                       label="after, held out", zorder=3)  # fmt: skip
            ax.set_xscale("log")
            ax.set_xlim(lo, hi)
        top.set(yscale="log", ylim=(lo, hi), ylabel="predicted GPU time (ms)",
                title=f"{shape} on an H200: {after_name}")  # fmt: skip
        bottom.set(
            xlabel="measured GPU time (ms, CUDA graph)", ylabel="predicted / measured - 1 (%)"
        )
        top.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-figure", action="store_true")
    args = ap.parse_args()
    (GPU / "clock.md").write_text(tables())
    if not args.no_figure:
        figure(GPU / "clock.png")
    print(tables())


if __name__ == "__main__":
    main()
