"""The site's tables of text (rendered by pandas' `to_html`): stage latency, fidelity, the
reference-engine benchmark and the nightly history's latest points (the leaderboards are
`leaderboard` and the templates' own)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from topas_bench.analysis.render import num_text, pct_text


def html(table: pd.DataFrame, name: str) -> str:
    """A table of text as HTML (pandas' Styler, text escaped), TOPAS's rows marked for the
    style sheet; `name` makes the table's id, unique on its page."""
    if table.empty:
        return ""
    marks = pd.DataFrame("", index=table.index, columns=table.columns)
    if "scheduler" in table:
        marks.loc[table["scheduler"] == "topas", :] = "topas"
    for col, verdicts in table.attrs.get("verdicts", {}).items():
        marks[col] = (marks[col] + " " + pd.Series(verdicts, index=table.index)).str.strip()
    # pandas' Styler needs Jinja2 (the figures extra) at import: import it here so that a
    # base install can import this module (scripts/check_imports.py --base)
    from pandas.io.formats.style import Styler

    styler = Styler(table, cell_ids=False, uuid=name).format(escape="html")
    styler = styler.set_table_attributes('class="data"')
    return str(styler.hide(axis="index").set_td_classes(marks).to_html())


def stages(st: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Mean latency (s) per stage kind (rows) and scheduler (columns)."""
    if st.empty:
        return pd.DataFrame()
    lat = st.pivot_table(index="kind", columns="scheduler", values="mean_latency_s", sort=False)
    cols = [s for s in order if s in lat.columns]
    out = lat[cols].map(lambda v: num_text(v)).reset_index()
    return out.rename(columns={"kind": "stage kind"})


def fidelity(doc: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`topas-bench fidelity`'s fidelity.json: per cell and per workload's ranking."""
    cells = pd.DataFrame([
        {
            "workload": c["workload"], "scheduler": c["scheduler"], "seeds": c["seeds"],
            "mean JCT sim / ref (s)": f"{c['mean_jct_sim_s']:,.1f} / {c['mean_jct_ref_s']:,.1f}",
            "mean diff": f"{100 * c['mean_jct_diff']:+.2f}%",
            "p99 JCT sim / ref (s)": f"{c['p99_jct_sim_s']:,.1f} / {c['p99_jct_ref_s']:,.1f}",
            "p99 diff": f"{100 * c['p99_jct_diff']:+.2f}%",
            "hit-rate diff": f"{c['hit_rate_diff_pts']:+.2f} pts",
            "admission order agreement": f"{c['order_agreement']:.4f}",
        }
        for c in doc.get("cells", [])
    ])  # fmt: skip
    ranks = pd.DataFrame([
        {"workload": r["workload"], "ranking on sim": r["ranking_sim"],
         "ranking on sglang-cpu": r["ranking_ref"], "same": "yes" if r["same"] else "NO"}
        for r in doc.get("rankings", [])
    ])  # fmt: skip
    return cells, ranks


def reference_bench(doc: dict[str, Any]) -> pd.DataFrame:
    """benchmarks/bench_reference.py's JSON: sim against sglang-cpu, speed and mean JCT."""
    out = []
    for c in doc.get("cells", []):
        sim, ref = c.get("sim", {}), c.get("sglang-cpu", {})
        same = sim.get("mean_jct_s") == ref.get("mean_jct_s")
        out.append({
            "scheduler": c["scheduler"],
            "mean JCT sim / sglang-cpu (s)": f"{sim.get('mean_jct_s')} / {ref.get('mean_jct_s')}",
            "same": "yes" if same else "NO", "sim wall (s)": num_text(sim.get("wall_s"), "{:.1f}"),
            "sglang-cpu wall (s)": num_text(ref.get("wall_s"), "{:.1f}"),
        })  # fmt: skip
    return pd.DataFrame(out)


def history_latest(history: pd.DataFrame) -> pd.DataFrame:
    """Per workload and setting, TOPAS's margins at the last night."""
    t = history[history["scheduler"] == "topas"].sort_values(["date", "order"])
    last = t.groupby(["workload", "setting"], sort=False).tail(1)
    return pd.DataFrame([
        {
            "workload": r["workload"], "setting": r["setting"], "night": r["date"],
            "revision": str(r["revision"])[:12],
            "TOPAS mean reduction": _pct3(r, "reduction_mean"),
            "TOPAS p99 reduction": _pct3(r, "reduction_p99"),
        }
        for _, r in last.iterrows()
    ])  # fmt: skip


def _pct3(r: pd.Series, col: str) -> str:
    return f"{pct_text(r[col])} [{pct_text(r[f'{col}_lo'])}, {pct_text(r[f'{col}_hi'])}]"
