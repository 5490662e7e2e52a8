"""What every figure shares: headless pyplot with the theme, fixed colours per scheduler,
titles that wrap to the figure's width (never clipped) and say their setting, legends outside
the data, and deterministic files (fixed SVG ids, no timestamps) so regenerated figures diff
cleanly. Figures use matplotlib's constrained layout, which makes room for wrapped titles and
outside legends."""

from __future__ import annotations

import importlib
import math
import re
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.errors import TopasError

#: Fixed colours, so a scheduler looks the same in every figure; TOPAS stands out in red.
COLOURS = {
    "fcfs": "tab:gray", "lpm": "tab:orange", "spf": "tab:green", "parrot": "tab:blue",
    "autellix": "tab:purple", "topas": "tab:red",
}  # fmt: skip
OTHERS = (
    "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "black", "gold", "navy", "teal", "lime",
    "salmon", "darkgreen", "slateblue", "sienna", "orchid", "khaki", "steelblue",
)  # fmt: skip


def pyplot() -> Any:
    """matplotlib's pyplot, headless, with the figures' theme (a one-line error without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sns = importlib.import_module("seaborn")  # untyped; imported only for figures
    except ImportError:
        raise TopasError(
            "figures need matplotlib and seaborn, the `figures` extra: in the checkout, "
            "`.venv/bin/pip install -e '.[figures]'` (`make figures` installs it)"
        ) from None
    sns.set_theme(style="whitegrid", context="notebook")
    plt.rcParams.update({"svg.hashsalt": "topas-bench", "svg.fonttype": "none",
                         "figure.constrained_layout.use": True})  # fmt: skip
    return plt


def palette_for(labels: Any) -> dict[str, Any]:
    rest = sorted(s for s in labels if s not in COLOURS)
    return COLOURS | {s: OTHERS[i % len(OTHERS)] for i, s in enumerate(rest)}


def save(
    plt: Any, fig: Any, out: Path, name: str, formats: tuple[str, ...], small: bool = False
) -> list[Path]:
    """`fig` as out/name.<format> for each format, then closed. `small`: PNGs with a palette
    of 128 colours (a third of the size; plots have few colours), for files that are
    committed or served."""
    written = []
    for ext in formats:
        path = out / f"{name}.{ext}"
        meta = {"Software": None} if ext == "png" else {"Date": None}
        fig.savefig(path, dpi=120 if ext == "png" else 72, metadata=meta)
        if small and ext == "png":
            from PIL import Image  # matplotlib's own dependency

            with Image.open(path) as im:
                rgb = im.convert("RGB")
            rgb.quantize(128, Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
                path, optimize=True
            )
        written.append(path)
    plt.close(fig)
    return written


def suptitle(fig: Any, text: str, fontsize: float = 10) -> None:
    """A figure title wrapped to the figure's width (each paragraph on its own lines)."""
    width = fig.get_size_inches()[0]
    chars = max(40, int(width * 72 / (0.56 * fontsize)))  # DejaVu Sans: ~0.56 em per char
    lines = [textwrap.fill(p, chars) for p in text.split("\n")]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


def legend_right(ax: Any, source: Any = None) -> None:
    """The legend of `source`'s (default `ax`'s) artists right of `ax`, outside the data
    (constrained layout makes room for it)."""
    handles, labels = (source or ax).get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                  frameon=False)  # fmt: skip


def split_label(label: str) -> list[str]:
    """A group label's parts (`load 0.8`, `KV 18,692`, `plan_tokens=[225, 325]`)."""
    return [p for p in re.split(r",\s(?![^\[\(]*[\]\)])", label) if p]


def engine_of(row: pd.Series) -> str:
    engine = row.get("engine")
    if not isinstance(engine, str) or not engine:
        return "engine not recorded"
    return f"engine {engine}"


def setting_title(row: pd.Series) -> str:
    """The setting a figure shows: the group's label and engine, e.g. `load 0.8, rate
    0.2266/s, a100-qwen32b, KV 18,692, 60 tasks, engine sim`."""
    return f"{row['group_label']}, {engine_of(row)}"


def common_setting(rows: pd.DataFrame) -> tuple[str, dict[str, str]]:
    """What the groups in `rows` share (text) and, per group, what is its own."""
    parts = {str(k): split_label(str(g.iloc[0]["group_label"])) for k, g in rows.groupby("group")}
    shared = [p for p in next(iter(parts.values()), []) if all(p in v for v in parts.values())]
    engines = sorted({engine_of(r) for _, r in rows.iterrows()})
    own = {k: ", ".join(p for p in v if p not in shared) or "-" for k, v in parts.items()}
    return ", ".join([*shared, *engines]), own


def nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))
