"""The site's pages: Jinja2 templates filled with leaderboards, tables and the data the page's
charts are drawn from (JSON in the page, drawn by `site.js` with the vendored plotly.js).

- `index.html`: per workload, its lead source's verdict sentence and leaderboard (the first
  source in `site.toml` order that has the workload leads it), the paper's reduction beside
  TOPAS's;
- `workload-<name>.html`: the lead source's leaderboard, JCT distribution, lever effects,
  mechanism timeline and stage latency; then every other source with this workload, each
  under its own setting;
- `source-<name>.html`: one source: what it is, how to regenerate it, each workload's
  leaderboard, every setting's verdict against the strongest other, its own figures;
- `sources.html`, `levers.html`, `fidelity.html`, `history.html`.

Every table links the CSV it is drawn from (under `data/`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.figures import main_groups
from topas_bench.analysis.plotting import setting_title
from topas_bench.analysis.protocol import best_others, pct
from topas_bench.analysis.report import PAPER_REDUCTIONS
from topas_bench.analysis.site import tables
from topas_bench.analysis.site.board import Board, family, num, rows_board, seed_text
from topas_bench.analysis.site.leaderboard import FOCUS, leaderboards
from topas_bench.analysis.site.sources import Source
from topas_bench.workloads.registry import WORKLOADS

#: Line charts show TOPAS and this many leaders; the rest start hidden (one click shows them).
SHOWN = 7
#: A source's own CSV files are copied into the site up to this size (the site's size budget).
COPY_MAX_BYTES = 600_000


def workload_key(name: str) -> tuple[int, str]:
    names = WORKLOADS.names()
    return (names.index(name) if name in names else len(names), name)


def safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def page_name(workload: str) -> str:
    return f"workload-{safe(workload)}.html"


def source_page(name: str) -> str:
    return f"source-{safe(name)}.html"


def of_board(frame: pd.DataFrame, b: Board) -> pd.DataFrame:
    """`frame`'s rows of `b`'s workload and setting (`group_label`)."""
    if frame.empty:
        return frame
    return frame[(frame["workload"] == b.workload) & (frame["group_label"] == b.group_label)]


@dataclass
class Pages:
    sources: list[Source]
    command: str
    fidelity: dict[str, Any]
    history: Any
    out: Path

    def __post_init__(self) -> None:
        #: a source's committed figures of a workload, copied beside the pages once
        self.copied: dict[tuple[str, str], list[dict[str, str]]] = {}
        self.boards: dict[tuple[str, str], Board] = {}
        for s in self.sources:
            for w in s.workloads:
                self.boards[(s.name, w)] = self._board(s, w)

    # --- what is where ---------------------------------------------------------------------

    @property
    def workloads(self) -> list[str]:
        names = {w for s in self.sources for w in s.workloads}
        return sorted(names, key=workload_key)

    def lead(self, workload: str) -> Source:
        """The source a workload's numbers come from on the index and its page."""
        return next(s for s in self.sources if workload in s.workloads)

    def nav(self, here: str) -> list[dict[str, Any]]:
        items = [("index.html", "Leaderboard")]
        items += [(page_name(w), w) for w in self.workloads]
        if any(not s.levers.empty for s in self.sources):
            items.append(("levers.html", "Levers"))
        items.append(("sources.html", "All results"))
        if self.fidelity:
            items.append(("fidelity.html", "Fidelity"))
        if self.history is not None:
            items.append(("history.html", "Nightly history"))
        return [{"href": h, "label": label, "here": h == here} for h, label in items]

    def _board(self, s: Source, w: str) -> Board:
        rows = s.rows[s.rows["workload"] == w]
        first = main_groups(rows).iloc[0]
        label = str(first["group_label"])
        if not s.runs.empty and "variant" in s.runs:
            board = leaderboards(s.runs[s.runs["workload"] == w], s.rows, s.verdicts, {label})
        else:
            board = pd.DataFrame()
        if board.empty:
            board = rows_board(rows[rows["group_label"] == label])
        bid = f"{safe(s.name)}-{safe(w)}"
        engine = str(first.get("engine", "")) or "sim"
        setting = setting_title(first).replace(f", engine {engine}", "")
        return Board(bid, s, w, label, board, setting, seed_text(str(first["seeds"])),
                     engine)  # fmt: skip

    # --- writing ---------------------------------------------------------------------------

    def write(self, env: Any) -> list[str]:
        data = self.out / "data"
        data.mkdir(exist_ok=True)
        for b in self.boards.values():
            b.csv = self._csv(b.rows, b.source.name, f"leaderboard-{safe(b.workload)}.csv")
        pages: dict[str, tuple[str, dict[str, Any]]] = {"index.html": ("index.html.j2",
                                                                       self.index())}  # fmt: skip
        for w in self.workloads:
            pages[page_name(w)] = ("workload.html.j2", self.workload(w))
        for s in self.sources:
            pages[source_page(s.name)] = ("source.html.j2", self.source(s))
        pages["sources.html"] = ("sources.html.j2", self.source_list())
        names = [n["href"] for n in self.nav("")]
        if "levers.html" in names:
            pages["levers.html"] = ("levers.html.j2", self.levers())
        if "fidelity.html" in names:
            pages["fidelity.html"] = ("fidelity.html.j2", self.fidelity_page())
        if "history.html" in names:
            pages["history.html"] = ("history.html.j2", self.history_page())
        for name, (template, ctx) in pages.items():
            page_data = ctx.pop("data", {})
            ctx |= {"nav": self.nav(name), "command": self.command,
                    "page_data": json.dumps(page_data, separators=(",", ":"),
                                            sort_keys=True).replace("</", "<\\/")}  # fmt: skip
            (self.out / name).write_text(env.get_template(template).render(**ctx))
        return list(pages)

    def _csv(self, table: pd.DataFrame, source: str, name: str) -> str:
        d = self.out / "data" / safe(source)
        d.mkdir(parents=True, exist_ok=True)
        table.to_csv(d / name, index=False, float_format="%.6g")
        return f"data/{safe(source)}/{name}"

    def _copy(self, path: Path, source: str) -> str | None:
        """A source's own file, copied beside the pages when it is small (`COPY_MAX_BYTES`):
        the larger ones stay in the repository, named on the source's page."""
        if not path.is_file() or path.stat().st_size > COPY_MAX_BYTES:
            return None
        d = self.out / "data" / safe(source)
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, d / path.name)
        return f"data/{safe(source)}/{path.name}"

    # --- contexts --------------------------------------------------------------------------

    def _facts(self, s: Source) -> dict[str, Any]:
        main = main_groups(s.rows)
        seeds = sorted({seed_text(x) for x in main["seeds"].astype(str)})
        return {
            "name": s.name, "title": s.title, "about": s.about, "commands": s.commands,
            "code": s.code, "slo": s.slo, "data": s.data, "notes": s.notes,
            "href": source_page(s.name), "seeds": "; ".join(seeds),
            "workloads": [{"name": w, "href": page_name(w)} for w in s.workloads],
            "schedulers": max((int((b.rows["metric"] == "mean").sum())
                               for (name, _), b in self.boards.items() if name == s.name),
                              default=0),
        }  # fmt: skip

    def _board_ctx(self, b: Board) -> dict[str, Any]:
        return {"id": b.id, "workload": b.workload, "href": page_name(b.workload),
                "sentences": b.sentences(), "tables": b.tables(), "csv": b.csv,
                "setting": b.setting, "seeds": b.seeds, "engine": b.engine,
                "source": self._facts(b.source), "paper": self._paper(b),
                "paired": bool(b.rows["margin"].notna().any())}  # fmt: skip

    def _paper(self, b: Board) -> dict[str, str] | None:
        """TOPAS's reduction against the best of the paper's baselines, beside the paper's."""
        paper = PAPER_REDUCTIONS.get(b.workload)
        topas = b.rows[(b.rows["scheduler"] == FOCUS) & (b.rows["metric"] == "mean")]
        if paper is None or topas.empty:
            return None
        r = b.source.rows
        hit = r[(r["workload"] == b.workload) & (r["group_label"] == b.group_label)
                & (r["scheduler"] == topas.iloc[0]["label"])]  # fmt: skip
        if hit.empty or "reduction_mean" not in hit:
            return None
        h = hit.iloc[0]
        return {
            "mean": pct(h["reduction_mean"], h.get("reduction_mean_lo"),
                         h.get("reduction_mean_hi")),
            "p99": pct(h["reduction_p99"], h.get("reduction_p99_lo"), h.get("reduction_p99_hi")),
            "paper_mean": f"{100 * paper[0]:+.1f}%", "paper_p99": f"{100 * paper[1]:+.1f}%",
            "baseline_mean": str(h.get("best_baseline_mean", "")),
            "baseline_p99": str(h.get("best_baseline_p99", "")),
        }  # fmt: skip

    def _schedulers(self, boards: list[Board]) -> list[dict[str, str]]:
        names: dict[str, None] = {}
        for b in boards:
            names |= dict.fromkeys(b.rows[b.rows["metric"] == "mean"].sort_values("rank")
                                   ["scheduler"])  # fmt: skip
        order = sorted(names, key=lambda n: (n != FOCUS, list(names).index(n)))
        return [{"name": n, "family": family(n)} for n in order]

    def index(self) -> dict[str, Any]:
        boards = [self.boards[(self.lead(w).name, w)] for w in self.workloads]
        leads = list(dict.fromkeys(b.source.name for b in boards))
        return {
            "title": "Leaderboard",
            "boards": [self._board_ctx(b) for b in boards],
            "leads": [self._facts(s) for s in self.sources if s.name in leads],
            "schedulers": self._schedulers(boards),
            "others": [self._facts(s) for s in self.sources if s.name not in leads],
            "data": {"boards": {b.id: b.chart() for b in boards}},
        }  # fmt: skip

    def workload(self, w: str) -> dict[str, Any]:
        lead = self.lead(w)
        b = self.boards[(lead.name, w)]
        data: dict[str, Any] = {"boards": {b.id: b.chart()}}
        cdf = self._cdf(lead, b)
        if cdf:
            data["cdf"] = cdf
        levers = self._levers(lead, w)
        if levers:
            data["levers"] = levers
        timeline = self._timeline(lead, b)
        if timeline:
            data["timeline"] = timeline
        stages = lead.stages[lead.stages["group"] == f"{w} | {b.group_label}"] \
            if not lead.stages.empty else lead.stages  # fmt: skip
        ranked = b.rows[b.rows["metric"] == "mean"].sort_values("rank")
        stage_table = tables.stages(stages, list(ranked["label"]))
        stage_table = stage_table.rename(columns=dict(zip(ranked["label"], ranked["scheduler"],
                                                          strict=True)))  # fmt: skip
        others = []
        for s in self.sources:
            if s is lead or w not in s.workloads:
                continue
            ob = self.boards[(s.name, w)]
            data["boards"][ob.id] = ob.chart()
            others.append({**self._board_ctx(ob), "images": self._images(s, w)})
        spec = WORKLOADS.get(w) if w in WORKLOADS.names() else None
        return {
            "title": w, "workload": w, "about": spec.description if spec else "",
            "board": self._board_ctx(b), "schedulers": self._schedulers([b]),
            "has_cdf": bool(cdf), "has_levers": bool(levers), "has_timeline": bool(timeline),
            "timeline_note": timeline.get("note", "") if timeline else "",
            "stages": tables.html(stage_table, f"stages-{safe(w)}"),
            "stages_csv": self._csv(stage_table, lead.name, f"stages-{safe(w)}.csv")
            if not stage_table.empty else "",
            "others": others, "data": data,
        }  # fmt: skip

    def _images(self, s: Source, w: str) -> list[dict[str, str]]:
        """The source's own committed figures of this workload (e.g. the regime map's margin
        maps), copied beside the pages (once: the workload's and the source's page show them)."""
        if s.report_dir is None:
            return []
        if (s.name, w) in self.copied:
            return self.copied[(s.name, w)]
        out = []
        for png in sorted(s.report_dir.glob(f"*_{w}.png")):
            dest = self.out / "img" / safe(s.name)
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, dest / png.name)
            out.append({"src": f"img/{safe(s.name)}/{png.name}",
                        "caption": f"{png.stem} ({s.name}, drawn by its own command)"})  # fmt: skip
        self.copied[(s.name, w)] = out
        return out

    def _cdf(self, s: Source, b: Board) -> dict[str, Any]:
        c = of_board(s.cdf, b)
        if c.empty:
            return {}
        labels = b.rows[b.rows["metric"] == "mean"].sort_values("rank")
        series = []
        for i, (_, r) in enumerate(labels.iterrows()):
            d = c[c["scheduler"] == r["label"]]
            if d.empty:
                continue
            series.append({"s": r["scheduler"], "f": family(str(r["scheduler"])),
                           "x": [num(v) for v in d["jct_s"]], "y": [num(v) for v in d["q"]],
                           "shown": r["scheduler"] == FOCUS or i <= SHOWN})  # fmt: skip
        return {"series": series, "setting": b.setting} if series else {}

    def _levers(self, s: Source, w: str) -> dict[str, Any]:
        lv = s.levers
        if lv.empty:
            return {}
        lv = lv[lv["workload"] == w]
        if lv.empty:
            return {}
        out: dict[str, Any] = {}
        for m, d in lv.groupby("metric", sort=False):
            out[str(m)] = {
                "lever": list(d["other_name"]), "margin": [num(v) for v in d["margin"]],
                "lo": [num(v) for v in d["lo"]], "hi": [num(v) for v in d["hi"]],
                "verdict": list(d["verdict"]), "n": len(lv),
            }  # fmt: skip
        return out

    def _timeline(self, s: Source, b: Board) -> dict[str, Any]:
        t = of_board(s.timeline, b)
        if t.empty:
            return {}
        names = {str(lab): str(n) for lab, n in
                 zip(b.rows["label"], b.rows["scheduler"], strict=True)}  # fmt: skip
        runs: list[dict[str, Any]] = []
        for sched, d in t.groupby("scheduler", sort=False):
            series = {str(k): {"t": [num(v) for v in g["t_s"]],
                               "v": [num(v) for v in g["value"]]}
                      for k, g in d.groupby("series", sort=False)}  # fmt: skip
            name = names.get(str(sched), str(sched).split("[")[0])
            runs.append({"s": name, "f": family(name), "series": series})
        seed = int(t["seed"].iloc[0])
        budget = int(b.source.rows[b.source.rows["group_label"] == b.group_label]
                     ["kv_budget_tokens"].iloc[0])  # fmt: skip
        return {"runs": runs, "seed": seed, "budget": budget,
                "note": f"seed {seed}, {b.setting}"}  # fmt: skip

    def source(self, s: Source) -> dict[str, Any]:
        boards = [self.boards[(s.name, w)] for w in s.workloads]
        settings = self._settings(s)
        where = s.report_dir
        names = ("verdicts.csv", "report.csv", "runs.csv.gz")
        files = [f for f in (self._copy(where / n, s.name) for n in names) if f] if where else []
        kept = [f"results/{where.name}/{n}" for n in names if where and (where / n).is_file()
                and f"data/{safe(s.name)}/{n}" not in files]  # fmt: skip
        return {
            "title": s.title, "source": self._facts(s),
            "boards": [self._board_ctx(b) for b in boards],
            "schedulers": self._schedulers(boards),
            "settings": settings["html"], "settings_csv": settings["csv"],
            "n_settings": settings["n"], "files": files, "kept": kept,
            "images": [i for w in s.workloads for i in self._images(s, w)],
            "data": {"boards": {b.id: b.chart() for b in boards}},
        }  # fmt: skip

    def _settings(self, s: Source) -> dict[str, Any]:
        """Every setting of a source: TOPAS against the strongest other, per metric."""
        if s.verdicts.empty or "other_name" not in s.verdicts:
            return {"html": "", "csv": "", "n": 0}
        best = best_others(s.verdicts)
        if best.empty:
            return {"html": "", "csv": "", "n": 0}
        table = pd.DataFrame([{
            "workload": r["workload"], "setting": r["group_label"], "metric": r["metric"],
            "strongest other": r["other_name"],
            "TOPAS / other (s)": f"{r['focus_value']:,.1f} / {r['other_value']:,.1f}",
            "TOPAS's margin": pct(r["margin"], r["lo"], r["hi"]), "verdict": r["verdict"],
            "TOPAS wins / ties / losses": f"{r['n_win']} / {r['n_tie']} / {r['n_loss']}",
        } for _, r in best.iterrows()])  # fmt: skip
        table.attrs["verdicts"] = {"verdict": list(best["verdict"])}
        return {"html": tables.html(table, f"settings-{safe(s.name)}"),
                "csv": self._csv(best, s.name, "settings.csv"),
                "n": int(best.groupby(["workload", "group_label"]).ngroups)}  # fmt: skip

    def source_list(self) -> dict[str, Any]:
        return {"title": "All results", "sources": [self._facts(s) for s in self.sources]}

    def levers(self) -> dict[str, Any]:
        sections, data = [], {}
        for s in self.sources:
            lv = s.levers
            if lv.empty:
                continue
            sid = f"lev-{safe(s.name)}"
            table = pd.DataFrame([{
                "workload": r["workload"], "lever off": r["other_name"], "metric": r["metric"],
                "TOPAS / lever off (s)": f"{r['focus_value']:,.1f} / {r['other_value']:,.1f}",
                "what the lever is worth": pct(r["margin"], r["lo"], r["hi"]),
                "verdict": r["verdict"], "setting": r["group_label"],
            } for _, r in lv.iterrows()])  # fmt: skip
            table.attrs["verdicts"] = {"verdict": list(lv["verdict"])}
            main = set(main_groups(s.rows)["group_label"])
            plot = lv[lv["group_label"].isin(main)]
            data[sid] = {
                m: {"x": [f"{w}: {o}" for w, o in zip(d["workload"], d["other_name"],
                                                       strict=True)],
                    "margin": [num(v) for v in d["margin"]], "lo": [num(v) for v in d["lo"]],
                    "hi": [num(v) for v in d["hi"]], "verdict": list(d["verdict"])}
                for m, d in plot.groupby("metric", sort=False)
            }  # fmt: skip
            sections.append({"id": sid, "source": self._facts(s), "n": len(lv),
                             "chart": bool(data[sid]),
                             "table": tables.html(table, sid),
                             "csv": self._csv(lv, s.name, "levers.csv")})  # fmt: skip
        return {"title": "Levers", "sections": sections, "data": {"levers": data}}

    def fidelity_page(self) -> dict[str, Any]:
        f = self.fidelity
        cells, ranks = tables.fidelity(f["fidelity"]) if "fidelity" in f else (pd.DataFrame(),) * 2
        bench = f.get("bench", {})
        return {
            "title": "Fidelity", "cells": tables.html(cells, "fid-cells"),
            "ranks": tables.html(ranks, "fid-ranks"),
            "fidelity_path": f.get("fidelity_path"),
            "fidelity_command": f.get("fidelity", {}).get("command"),
            "bench": tables.html(tables.reference_bench(bench), "fid-bench") if bench else "",
            "bench_path": f.get("bench_path"),
            "bench_setting": {k: v for k, v in bench.items() if k != "cells"},
        }  # fmt: skip

    def history_page(self) -> dict[str, Any]:
        from topas_bench.analysis.history import plot
        from topas_bench.analysis.plotting import pyplot

        hist, drops = self.history
        img = self.out / "img" / "history"
        pyplot()
        files = plot(hist, img, formats=("png",))
        figs = [{"src": f"img/history/{p.name}", "caption": f"{p.stem}: nightly trend"}
                for p in files]  # fmt: skip
        return {
            "title": "Nightly history",
            "figures": figs,
            "latest": tables.html(tables.history_latest(hist), "hist-latest"),
            "drops": [d.describe() for d in drops],
            "nights": hist["date"].nunique(),
        }


__all__ = ["Pages", "page_name"]
