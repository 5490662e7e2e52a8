"""The site's tables, as pandas DataFrames of text (rendered by pandas' `to_html`): the
headline (TOPAS against the best of all per workload and metric), each group's JCT and call
tables, ablations, fidelity and the nightly history's latest points."""

from __future__ import annotations

from typing import Any

import pandas as pd

from topas_bench.analysis.figures import main_groups
from topas_bench.analysis.plotting import common_setting, engine_of
from topas_bench.analysis.render import ci_text, num_text, pct_text, reduction_text
from topas_bench.analysis.report import PAPER_REDUCTIONS
from topas_bench.schedulers.registry import ABLATIONS


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
    return str(styler.hide(axis="index").set_td_classes(marks).to_html())


def verdict(verdicts: pd.DataFrame, r: pd.Series, m: str) -> str:
    """TOPAS's verdict against the best of all on metric `m` in `r`'s setting: `win` or
    `loss` as the protocol's table (`protocol.versus`, Holm-corrected) has it, `` for a tie
    or where the source has no such table (an uncorrected interval is no verdict)."""
    if verdicts.empty:
        return ""
    v = verdicts
    hit = v[(v["workload"] == r["workload"]) & (v["group_label"] == r["group_label"])
            & (v["other"] == r[f"best_any_{m}"]) & (v["metric"] == m)]  # fmt: skip
    word = str(hit.iloc[0]["verdict"]) if not hit.empty else ""
    return word if word in ("win", "loss") else ""


def signed(r: pd.Series, m: str, against: str = "") -> str:
    """A reduction with its interval, signed: `+17.3% [+7.7, +27.8]` (positive = faster)."""
    v = r.get(f"reduction_{against}{m}")
    if v is None or pd.isna(v):
        return "-"
    lo, hi = r[f"reduction_{against}{m}_lo"], r[f"reduction_{against}{m}_hi"]
    if r.get("n_seeds", 0) < 2:
        return f"{100 * v:+.1f}%"
    return f"{100 * v:+.1f}% [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def without_constant(table: pd.DataFrame, names: tuple[str, ...]) -> pd.DataFrame:
    """`table` without those of `names` that hold one value in every row (said elsewhere)."""
    same = [c for c in names if c in table and table[c].nunique() == 1]
    out = table.drop(columns=same)
    out.attrs = table.attrs
    return out


def _best(g: pd.DataFrame, name: str, col: str) -> str:
    hit = g[g["scheduler"] == name]
    return f"{name} {hit.iloc[0][col]:,.1f} s" if name and not hit.empty else "-"


def headline(rows: pd.DataFrame, verdicts: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per workload (its main setting): the best of all schedulers per metric and TOPAS's
    reduction against it with the 95% interval, seeds, engine; the paper's figures beside."""
    main = main_groups(rows)
    _, own = common_setting(main)
    v = verdicts if verdicts is not None else pd.DataFrame()
    records: list[dict[str, Any]] = []
    words: list[tuple[str, str]] = []
    for _, r in main[main["scheduler"] == "topas"].iterrows():
        g = main[main["group"] == r["group"]]
        paper = PAPER_REDUCTIONS.get(str(r["workload"]))
        records.append({
            "workload": r["workload"], "setting": own[str(r["group"])],
            "seeds": r["seeds"], "engine": engine_of(r).removeprefix("engine "),
            "best of all, mean JCT": _best(g, str(r["best_any_mean"]), "mean_jct_s"),
            "TOPAS mean JCT reduction": signed(r, "mean", "any_"),
            "best of all, p99 JCT": _best(g, str(r["best_any_p99"]), "p99_jct_s"),
            "TOPAS p99 JCT reduction": signed(r, "p99", "any_"),
            "paper (mean / p99)": f"{pct_text(paper[0])} / {pct_text(paper[1])}" if paper else "-",
        })  # fmt: skip
        words.append((verdict(v, r, "mean"), verdict(v, r, "p99")))
    table = pd.DataFrame(records)
    if words:
        means, p99s = zip(*words, strict=True)
        table.attrs["verdicts"] = {"TOPAS mean JCT reduction": list(means),
                                   "TOPAS p99 JCT reduction": list(p99s)}  # fmt: skip
    return table


def jct(g: pd.DataFrame) -> pd.DataFrame:
    """Every scheduler of one group: JCT with intervals, reductions, goodput and counters."""
    return pd.DataFrame([
        {
            "scheduler": r["scheduler"], "mean JCT (s)": ci_text(r, "mean_jct_s"),
            "p50": ci_text(r, "p50_jct_s"), "p90": ci_text(r, "p90_jct_s"),
            "p99": ci_text(r, "p99_jct_s"), "mean vs best baseline": reduction_text(r, "mean"),
            "p99 vs best baseline": reduction_text(r, "p99"),
            "mean / p99 vs best of all": f"{reduction_text(r, 'mean', 'any_')} / "
            f"{reduction_text(r, 'p99', 'any_')}",
            "goodput (tasks/s)": ci_text(r, "goodput_tps", "{:.4f}"),
            "SLO met": pct_text(r.get("slo_attainment")),
            "prefix hit": pct_text(r.get("prefix_hit_rate")),
            "preemptions": num_text(r.get("preemptions"), "{:.0f}"),
        }
        for _, r in g.iterrows()
    ])  # fmt: skip


def _pair(r: pd.Series, name: str, fmt: str, unit: str) -> str:
    a, b = r.get(f"{name}_mean{unit}"), r.get(f"{name}_p99{unit}")
    return "-" if a is None or pd.isna(a) else f"{fmt.format(a)} / {fmt.format(b)}"


def calls(g: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([
        {
            "scheduler": r["scheduler"], "TTFT mean / p99 (s)": _pair(r, "ttft", "{:.2f}", "_s"),
            "TPOT mean / p99 (ms)": _pair(r, "tpot", "{:.1f}", "_ms"),
            "queueing mean / p99 (s)": _pair(r, "queue", "{:.2f}", "_s"),
            "latency mean / p99 (s)": _pair(r, "latency", "{:.2f}", "_s"),
            "output tok/s": num_text(r.get("output_tok_s"), "{:.1f}"),
        }
        for _, r in g.iterrows()
    ])  # fmt: skip


def stages(st: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Mean latency (s) per stage kind (rows) and scheduler (columns)."""
    if st.empty:
        return pd.DataFrame()
    lat = st.pivot_table(index="kind", columns="scheduler", values="mean_latency_s", sort=False)
    cols = [s for s in order if s in lat.columns]
    out = lat[cols].map(lambda v: num_text(v)).reset_index()
    return out.rename(columns={"kind": "stage kind"})


def ablation(rows: pd.DataFrame) -> pd.DataFrame:
    d = rows[rows["scheduler"].isin(("topas", *ABLATIONS))]
    return pd.DataFrame([
        {
            "workload": r["workload"], "scheduler": r["scheduler"],
            "mean JCT (s)": ci_text(r, "mean_jct_s"), "p99 JCT (s)": ci_text(r, "p99_jct_s"),
            "mean vs best baseline": reduction_text(r, "mean"),
            "p99 vs best baseline": reduction_text(r, "p99"),
            "preemptions / run": num_text(r.get("preemptions"), "{:.0f}"),
        }
        for _, r in d.iterrows()
    ])  # fmt: skip


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
