"""The site's pages: each a Jinja2 template filled with tables (pandas HTML) and figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.figures import main_groups
from topas_bench.analysis.plotting import common_setting, setting_title
from topas_bench.analysis.site import tables
from topas_bench.analysis.site.draw import Figure, Missing
from topas_bench.analysis.site.sources import Source
from topas_bench.schedulers.registry import ABLATIONS
from topas_bench.workloads.registry import WORKLOADS


def workload_key(name: str) -> tuple[int, str]:
    names = WORKLOADS.names()
    return (names.index(name) if name in names else len(names), name)


def page_name(workload: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in workload)
    return f"workload-{safe}.html"


@dataclass
class Pages:
    sources: list[Source]
    drawn: dict[str, dict[str, Figure | Missing]]
    command: str
    fidelity: dict[str, Any]
    history: Any
    out: Path
    plt: Any
    extra_files: list[Path] = field(default_factory=list)

    @property
    def workloads(self) -> list[str]:
        names = {w for s in self.sources for w in s.workloads}
        return sorted(names, key=workload_key)

    def nav(self, here: str) -> list[dict[str, Any]]:
        items = [("index.html", "Headline")]
        items += [(page_name(w), w) for w in self.workloads]
        if any(s.rows["scheduler"].isin(ABLATIONS).any() for s in self.sources):
            items.append(("ablations.html", "Ablations"))
        if self.fidelity:
            items.append(("fidelity.html", "Fidelity"))
        if self.history is not None:
            items.append(("history.html", "Nightly history"))
        return [{"href": h, "label": label, "here": h == here} for h, label in items]

    def write(self, env: Any) -> list[str]:
        pages = {"index.html": ("index.html.j2", self.index())}
        for w in self.workloads:
            pages[page_name(w)] = ("workload.html.j2", self.workload(w))
        names = [n["href"] for n in self.nav("")]
        if "ablations.html" in names:
            pages["ablations.html"] = ("ablations.html.j2", self.ablations())
        if "fidelity.html" in names:
            pages["fidelity.html"] = ("fidelity.html.j2", self.fidelity_page())
        if "history.html" in names:
            pages["history.html"] = ("history.html.j2", self.history_page())
        for name, (template, ctx) in pages.items():
            ctx |= {"nav": self.nav(name), "command": self.command}
            (self.out / name).write_text(env.get_template(template).render(**ctx))
        return list(pages)

    def _source(self, s: Source) -> dict[str, Any]:
        main = main_groups(s.rows)
        shared, _ = common_setting(main)
        others = main[~main["scheduler"].str.startswith("topas")]["scheduler"]
        return {
            "compared": ", ".join(dict.fromkeys(others)),
            "name": s.name, "title": s.title, "about": s.about, "commands": s.commands,
            "code": s.code, "slo": s.slo, "data": s.data, "shared": shared,
            "seeds": ", ".join(sorted(set(s.rows["seeds"].astype(str)))), "notes": s.notes,
            "workloads": [{"name": w, "href": page_name(w)} for w in s.workloads],
        }  # fmt: skip

    def _headline(self, s: Source, name: str) -> str:
        # seeds and engine: the source's facts name them
        table = tables.headline(s.rows, s.verdicts)
        return tables.html(tables.without_constant(table, ("seeds", "engine")), name)

    def index(self) -> dict[str, Any]:
        first, *rest = self.sources
        return {
            "title": "topas-bench results",
            "headline": self._source(first),
            "headline_table": self._headline(first, "headline"),
            "headline_figure": self.drawn[first.name].get("relative"),
            "headline_extra": [
                f for k, f in self.drawn[first.name].items() if k in ("relative_all", "requests")
            ],
            "others": [
                {
                    **self._source(s),
                    "table": self._headline(s, f"h-{s.name}"),
                    "figure": self.drawn[s.name].get("relative"),
                }
                for s in rest
            ],
        }

    def workload(self, w: str) -> dict[str, Any]:
        sections = []
        for s in self.sources:
            rows = s.rows[s.rows["workload"] == w]
            if rows.empty:
                continue
            main = main_groups(rows)["group"].iloc[0]
            _, own = common_setting(rows)
            groups = []
            for i, (key, g) in enumerate(rows.groupby("group", sort=False)):
                st = s.stages[s.stages["group"] == key] if not s.stages.empty else s.stages
                groups.append({
                    "label": own[str(key)] if own[str(key)] != "-" else g.iloc[0]["group_label"],
                    "setting": setting_title(g.iloc[0]),
                    "seeds": g.iloc[0]["seeds"], "main": key == main,
                    "jct": tables.html(tables.jct(g), f"{s.name}-{i}-jct"),
                    "calls": tables.html(tables.calls(g), f"{s.name}-{i}-calls"),
                    "stages": tables.html(tables.stages(st, list(g["scheduler"])),
                                          f"{s.name}-{i}-stages"),
                })  # fmt: skip
            drawn = self.drawn[s.name]
            keys = ("cdf", "load", "stages", "timeline")
            sections.append({
                **self._source(s), "groups": groups,
                "figures": [drawn[f"{k}:{w}"] for k in keys if f"{k}:{w}" in drawn],
                "regime": [f for k, f in drawn.items() if k.startswith(f"regime:{w}")],
            })  # fmt: skip
        return {"title": w, "workload": w, "sections": sections,
                "has_regime": any(sec["regime"] for sec in sections)}  # fmt: skip

    def ablations(self) -> dict[str, Any]:
        sections = []
        for s in self.sources:
            abl = s.rows[s.rows["scheduler"].isin(ABLATIONS)]
            if abl.empty:
                continue
            groups = s.rows[s.rows["group"].isin(set(abl["group"]))]
            parts = []
            for i, (_, g) in enumerate(groups.groupby("group", sort=False)):
                table = tables.html(tables.ablation(g), f"{s.name}-a{i}")
                parts.append({"setting": setting_title(g.iloc[0]), "seeds": g.iloc[0]["seeds"],
                              "table": table})  # fmt: skip
            sections.append({**self._source(s), "parts": parts,
                             "figure": self.drawn[s.name].get("ablation")})  # fmt: skip
        return {"title": "Ablations", "sections": sections}

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

        hist, drops = self.history
        img = self.out / "img" / "history"
        files = plot(hist, img, formats=("png",))
        self.extra_files += files
        figs = [Figure(f"img/history/{p.name}", f"{p.stem}: nightly trend") for p in files]
        return {
            "title": "Nightly history",
            "figures": figs,
            "latest": tables.html(tables.history_latest(hist), "hist-latest"),
            "drops": [d.describe() for d in drops],
            "nights": hist["date"].nunique(),
        }
