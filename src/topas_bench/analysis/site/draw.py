"""The site's figures, per source, as PNG files under `img/<source>/`: the same figure
functions as `topas-bench figures`, on what each source holds. A figure that needs files the
source does not have (CDFs need per-task JCTs, timelines need the runs' timelines) is a
`Missing` entry naming what would draw it, never an empty panel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topas_bench.analysis.curves import cdf, load_settings, regime_grids, regime_map, vs_load
from topas_bench.analysis.figures import (
    EVERY,
    MAIN,
    ablation_bars,
    ablations,
    main_groups,
    relative,
    requests_figure,
    stage_bars,
)
from topas_bench.analysis.plotting import palette_for, save
from topas_bench.analysis.regime import regime_margin, regime_table
from topas_bench.analysis.site.sources import Source
from topas_bench.analysis.timeline import timeline_figure
from topas_bench.schedulers.registry import PEERS


@dataclass(frozen=True)
class Figure:
    src: str  # relative to the site's root
    caption: str


@dataclass(frozen=True)
class Missing:
    caption: str
    why: str
    needs_runs: bool = True


Drawn = dict[str, Figure | Missing]


class Drawer:
    """Draws one source's figures into `root/img/<source>/` and remembers what it wrote."""

    def __init__(self, plt: Any, root: Path, src: Source) -> None:
        self.plt, self.src = plt, src
        self.dir = root / "img" / src.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rel = f"img/{src.name}"
        self.palette = palette_for(src.rows["scheduler"].unique())
        self.drawn: Drawn = {}
        self.files: list[Path] = []

    def keep(self, key: str, fig: Any | None, name: str, caption: str) -> None:
        if fig is None:
            return
        self.files += save(self.plt, fig, self.dir, name, ("png",), small=True)
        self.drawn[key] = Figure(f"{self.rel}/{name}.png", caption)

    def needs_runs(self, key: str, caption: str) -> None:
        self.drawn[key] = Missing(caption, "needs the runs' per-task and timeline files, which "
                                  "this source does not hold")  # fmt: skip


def draw_source(plt: Any, root: Path, src: Source) -> tuple[Drawn, list[Path]]:
    """Every figure `src` supports; keys: `relative`, `relative_all`, `requests`, `ablation`,
    and per workload `cdf:W`, `load:W`, `regime:W`, `stages:W`, `timeline:W`."""
    d = Drawer(plt, root, src)
    rows, pal = src.rows, d.palette
    main = main_groups(rows)
    d.keep("relative", relative(plt, main, pal, rows), "jct_relative",
           "Each scheduler's mean and p99 JCT over the best baseline's, one setting per workload "
           "(named under it; the others are on the workload pages).")  # fmt: skip
    if main["scheduler"].isin(PEERS).any():
        d.keep("relative_all", relative(plt, main, pal, rows, against="any_"),
               "jct_relative_all", "The same against the best of all schedulers (the paper's "
               "baselines and the peers).")  # fmt: skip
    d.keep("requests", requests_figure(plt, main, pal, src.slo), "requests",
           "Per call: p99 TTFT, mean TPOT, mean queueing delay; per task: goodput under the "
           f"SLO ({src.slo}).")  # fmt: skip
    abl = ablations(rows, main)
    if not abl.empty:
        d.keep("ablation", ablation_bars(plt, abl, pal), "ablation",
               "TOPAS and its ablations, mean and p99 JCT from zero.")  # fmt: skip
    for w in src.workloads:
        wrows = rows[rows["workload"] == w]
        curves = load_settings(wrows[wrows["scheduler"].isin(MAIN)])
        if curves:
            d.keep(f"load:{w}", vs_load(plt, curves, pal, src.slo), f"load_{w}",
                   "Mean and p99 JCT and goodput against load (or rate), one column per "
                   "setting.")  # fmt: skip
        for i, grid in enumerate(regime_grids(wrows)):
            d.keep(f"regime:{w}" + (f":{i}" if i else ""), regime_map(plt, grid),
                   f"regime_{w}" + (f"_{i}" if i else ""),
                   "Regime map: TOPAS's JCT reduction against the best baseline on each cell "
                   "of the load (or rate) x KV-budget grid.")  # fmt: skip
        runs = src.runs[src.runs["workload"] == w] if not src.runs.empty else None
        table = regime_table(runs) if runs is not None else None
        if table is not None and not table.empty:
            for i, (_, tw) in enumerate(table.groupby("workload", sort=False)):
                d.keep(f"regime:{w}:margin" + (f":{i}" if i else ""), regime_margin(plt, tw),
                       f"regime_margin_{w}" + (f"_{i}" if i else ""),
                       "Regime map: TOPAS's JCT margin over the best other scheduler per "
                       "(output scale, KV budget as a multiple of the agent-prefix working "
                       "set, load) cell; outlined where residency pays (TOPAS beats "
                       "topas-no-pins beyond the interval).")  # fmt: skip
        row = main[main["workload"] == w].iloc[0]
        st = src.stages[src.stages["group"] == row["group"]] if not src.stages.empty else None
        if st is not None and not st.empty:
            d.keep(f"stages:{w}", stage_bars(plt, st, row, pal), f"stage_latency_{w}",
                   "Mean latency per stage kind (send to finish), main setting.")  # fmt: skip
        cdf_caption = "JCT CDF per scheduler, one panel per setting (tasks of every seed pooled)."
        tl_caption = "TOPAS against the best baselines over one run: the mechanism."
        covered = src.covered(wrows)
        if covered.empty:
            d.needs_runs(f"cdf:{w}", cdf_caption)
        else:
            assert src.coll is not None  # covered rows have runs
            d.keep(f"cdf:{w}", cdf(plt, src.coll, covered, pal, EVERY), f"jct_cdf_{w}",
                   cdf_caption)  # fmt: skip
        if src.coll is None or row["group"] not in set(covered["group"]):
            d.needs_runs(f"timeline:{w}", tl_caption)
        else:
            fig = timeline_figure(plt, src.coll, rows, str(row["group"]), pal)
            d.keep(f"timeline:{w}", fig, f"timeline_{w}", tl_caption)
            if fig is None:
                why = ("has nothing to show: the main setting has no TOPAS, no timeline, or "
                       "TOPAS ran the same schedule as the baselines")  # fmt: skip
                d.drawn[f"timeline:{w}"] = Missing(tl_caption, why, needs_runs=False)
    return d.drawn, d.files
