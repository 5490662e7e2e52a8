"""What every figure shares: headless pyplot with the theme; the page budget (at most
`PAGE_WIDTH_IN` wide at `DPI`, no text under `MIN_FONT_PT`) and its check, `layout_problems`
(texts that overlap or leave the figure); fixed colour-blind-safe colours per scheduler, at most
`MAX_SERIES` series a panel (`leaders`), each with its own colour, marker and line style
(`styles`); titles that wrap to the figure's width (never clipped) and say their setting,
legends outside the data; and deterministic files (fixed SVG ids, no timestamps) so
regenerated figures diff cleanly. Figures use matplotlib's constrained layout, which makes room
for wrapped titles and outside legends."""

from __future__ import annotations

import importlib
import math
import re
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.errors import TopasError

#: The page budget: a figure is at most this wide (inches) and its PNG is written at `DPI`,
#: so at most 1,600 px; no text is smaller than `MIN_FONT_PT` at that size.
PAGE_WIDTH_IN = 8.0
DPI = 200
MIN_FONT_PT = 8.0
#: The most series one panel draws; the others are named in the figure's title as left out.
MAX_SERIES = 8
TOPAS = "#D55E00"  # Okabe-Ito vermillion: TOPAS is the one strong warm colour in every figure
#: Fixed colours for the paper's schedulers (Okabe & Ito's colour-blind-safe set), so each
#: looks the same in every figure.
COLOURS = {"topas": TOPAS, "fcfs": "#000000", "lpm": "#E69F00", "spf": "#009E73",
           "parrot": "#0072B2", "autellix": "#CC79A7"}  # fmt: skip
#: The rest, in this order, for the other schedulers of a panel (the rest of Okabe & Ito's set
#: and Paul Tol's dark ones): no two of `COLOURS` + `OTHERS` are near each other.
OTHERS = ("#56B4E9", "#882255", "#999933", "#332288", "#8C8C8C", "#8C564B")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")
LINESTYLES = ("-", "--", "-.", ":")


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
                         "figure.constrained_layout.use": True,
                         # room for a tick label centred on an axis' end at the edge
                         "figure.constrained_layout.w_pad": 0.12})  # fmt: skip
    return plt


def palette_for(labels: Any) -> dict[str, Any]:
    """A colour per scheduler: the fixed ones, the others from `OTHERS` in name order (which
    repeat past six; `styles` gives a panel's series distinct ones)."""
    rest = sorted(s for s in labels if s not in COLOURS)
    return COLOURS | {s: OTHERS[i % len(OTHERS)] for i, s in enumerate(rest)}


def styles(shown: list[str], palette: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Colour, marker and line style per series of one panel (in `shown`'s order): the paper's
    schedulers their fixed colours, the others their palette colour unless a series of the
    panel has it (then the first unused one), so no two series share one; marker and line
    style as a second cue; TOPAS drawn thicker and on top."""
    out: dict[str, dict[str, Any]] = {}
    used = {COLOURS[n] for n in shown if n in COLOURS}  # the paper's schedulers keep theirs
    spare = [c for c in (*COLOURS.values(), *OTHERS) if c != TOPAS]
    for i, name in enumerate(shown):
        colour = COLOURS.get(name)
        if colour is None:
            colour = palette.get(name)
            if colour is None or colour in used:
                colour = next((c for c in spare if c not in used), spare[i % len(spare)])
        used.add(colour)
        top = name == "topas"
        out[name] = {"color": colour, "marker": "o" if top else MARKERS[1 + i % (len(MARKERS) - 1)],
                     "linestyle": "-" if top else LINESTYLES[i % len(LINESTYLES)],
                     "linewidth": 2.2 if top else 1.3, "zorder": 3 if top else 2}  # fmt: skip
    return out


def leaders(
    rows: pd.DataFrame,
    col: str = "mean_jct_s",
    limit: int = MAX_SERIES,
    always: tuple[str, ...] = ("topas",),
) -> tuple[list[str], list[str]]:
    """(shown, left out): `always` (those present, and of each the best of its other settings
    `name[...]`, a tuned one), then the schedulers best on `col` (lower is better), ranked by
    their mean over groups of `col` / the group's best, to `limit`."""
    rel = rows[col] / rows.groupby("group")[col].transform("min")
    score = rel.groupby(rows["scheduler"]).mean()
    names = list(dict.fromkeys(rows["scheduler"]))
    ranked = sorted(names, key=lambda s: (float(score.get(s, math.inf)), s))
    shown = [s for s in always if s in names]
    for a in always:
        settings = [s for s in ranked if s != a and scheduler_of(s) == a and s not in shown]
        shown += settings[:1]
    shown += [s for s in ranked if s not in shown][: max(0, limit - len(shown))]
    return [s for s in names if s in shown], [s for s in ranked if s not in shown]


def scheduler_of(label: str) -> str:
    """The registered scheduler behind a report's label: `name` of `name[k=v,...]` (a tuned
    setting, `sweep --tuned`, or one given parameters)."""
    return label.partition("[")[0]


def among(labels: pd.Series, names: Any) -> pd.Series:
    """Which of `labels` are settings of one of `names`: each scheduler's default and its
    tuned or other settings alike."""
    return labels.astype(str).map(scheduler_of).isin(set(names))


def short(label: str, width: int = 22) -> str:
    """A scheduler label that fits a tick or legend: `name[params]` past `width` characters
    as `name[…]` (the report names the parameters)."""
    name, bracket, _ = label.partition("[")
    return label if len(label) <= width or not bracket else f"{name}[…]"


def left_out_note(left: list[str], limit: int = MAX_SERIES) -> str:
    if not left:
        return ""
    return (f"at most {limit} schedulers a panel (TOPAS and the best); not drawn in one or "
            f"more: {', '.join(left)}")  # fmt: skip


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
        fig.savefig(path, dpi=DPI if ext == "png" else 72, metadata=meta)
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
    width = fig.bbox.width / fig.dpi  # a figure's or a subfigure's
    chars = max(30, int(width * 72 / (0.6 * fontsize)))  # DejaVu Sans: ~0.56 em a char, and room
    lines = [textwrap.fill(p, chars) for p in text.split("\n")]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


def legend_right(ax: Any, source: Any = None) -> None:
    """The legend of `source`'s (default `ax`'s) artists right of `ax`, outside the data
    (constrained layout makes room for it)."""
    handles, labels = (source or ax).get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                  frameon=False)  # fmt: skip


def legend_below(fig: Any, sources: Any) -> None:
    """One legend for the whole figure, of the artists of `sources` (axes; each label once),
    below the panels in rows of at most four entries (constrained layout makes room)."""
    seen: dict[str, Any] = {}
    for ax in sources:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, h)
    handles, labels, n = list(seen.values()), list(seen), len(seen)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(4, max(1, n)),
                   fontsize=8, frameon=False)  # fmt: skip


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


def _drawn_texts(fig: Any) -> list[Any]:
    """Every visible, non-empty text of `fig` that a draw puts on the canvas: tick labels only
    of the ticks inside the view (an axis keeps spare tick objects with stale labels)."""
    from matplotlib.axis import Axis, Tick
    from matplotlib.text import Text

    drawn: set[int] = set()
    for axis in fig.findobj(Axis):
        if not (axis.get_visible() and axis.axes.get_visible()):
            continue
        for tick in axis._update_ticks():  # the ticks Axis.draw draws
            drawn |= {id(tick.label1), id(tick.label2)}
    spare = {id(x) for tick in fig.findobj(Tick) for x in (tick.label1, tick.label2)} - drawn
    out = []
    for t in fig.findobj(Text):
        if id(t) in spare or not t.get_visible() or not t.get_text().strip():
            continue
        if t.axes is not None and not t.axes.get_visible():
            continue
        out.append(t)
    return out


def layout_problems(fig: Any, page_width_in: float = PAGE_WIDTH_IN) -> list[str]:
    """What makes `fig` unreadable at page width, one line each ([] when nothing): wider than
    `page_width_in`, a text under `MIN_FONT_PT`, a text (title, axis or tick label, legend
    entry, annotation) outside the figure, or two texts whose boxes overlap by more than a
    pixel. Boxes are axis-aligned, so texts should be horizontal or vertical. Draws `fig`."""
    problems = []
    width = float(fig.get_size_inches()[0])
    if width > page_width_in + 1e-6:
        problems.append(f"figure {width:.1f} in wide ({width * DPI:,.0f} px at {DPI} dpi) > "
                        f"the page's {page_width_in:g} in")  # fmt: skip
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _drawn_texts(fig)
    boxes = [t.get_window_extent(renderer) for t in texts]
    names = [repr(" ".join(t.get_text().split())[:40]) for t in texts]
    page = fig.bbox
    for t, b, name in zip(texts, boxes, names, strict=True):
        if t.get_fontsize() < MIN_FONT_PT - 1e-6:
            problems.append(f"text {name} at {t.get_fontsize():g} pt < {MIN_FONT_PT:g} pt")
        if (b.x0 < page.x0 - 1 or b.y0 < page.y0 - 1 or b.x1 > page.x1 + 1
                or b.y1 > page.y1 + 1):  # fmt: skip
            problems.append(f"text {name} outside the figure")
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i], boxes[j]
            dx = min(a.x1, b.x1) - max(a.x0, b.x0)
            dy = min(a.y1, b.y1) - max(a.y0, b.y0)
            if dx > 1 and dy > 1:
                problems.append(f"text {names[i]} overlaps {names[j]}")
    return problems
