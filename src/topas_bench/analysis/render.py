"""A `Report` as Markdown (tables by pandas' `to_markdown`) and CSV files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.protocol import GROUP_KEY, cell_text
from topas_bench.analysis.report import PAPER_KV_BUDGET, PAPER_PRESET, Report
from topas_bench.analysis.verdict import family_note
from topas_bench.schedulers.registry import BASELINES
from topas_bench.workloads.registry import DEFAULT_LOAD


def is_nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def ci_text(row: pd.Series, col: str, fmt: str = "{:.1f}") -> str:
    v, lo, hi = row[col], row[f"{col}_lo"], row[f"{col}_hi"]
    if is_nan(v):
        return "-"
    if row["n_seeds"] < 2:
        return fmt.format(v)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def pct_text(v: Any) -> str:
    return "-" if is_nan(v) else f"{100 * v:.1f}%"


def num_text(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if is_nan(v) else fmt.format(v)


def reduction_text(row: pd.Series, m: str, against: str = "") -> str:
    """The row's reduction vs the best baseline (`against=""`) or vs the best of all
    (`"any_"`)."""
    v = row[f"reduction_{against}{m}"]
    if is_nan(v):
        return "-"
    if row["scheduler"] == row[f"best_{against or 'baseline_'}{m}"]:
        return "best"
    if row["n_seeds"] < 2:
        return pct_text(v)
    lo, hi = row[f"reduction_{against}{m}_lo"], row[f"reduction_{against}{m}_hi"]
    return f"{pct_text(v)} [{pct_text(lo)}, {pct_text(hi)}]"


def _table(records: list[dict[str, str]]) -> list[str]:
    """A Markdown table; a `|` or line break in a cell (a stage kind or scheduler name from a
    trace) is escaped, so it stays in its cell."""
    cells = [{_cell(k): _cell(v) for k, v in r.items()} for r in records]
    return [pd.DataFrame(cells).to_markdown(index=False, disable_numparse=True), ""]


def _cell(v: Any) -> str:
    return " ".join(str(v).replace("|", "\\|").splitlines())


def to_markdown(rep: Report) -> str:
    lines = [
        "# topas-bench report",
        "",
        f"Results: `{rep.root}`: {rep.rows.groupby('group').ngroups} groups, "
        f"{len(rep.rows)} scheduler rows; {len(rep.problems)} run director"
        f"{'y' if len(rep.problems) == 1 else 'ies'} left out.",
        "",
        "JCT in seconds: the mean over seeds of each run's statistic, with a 95% bootstrap "
        "interval over seeds in brackets (10,000 resamples, seed 0). Reductions: "
        "1 - scheduler / best baseline, the best baseline chosen per metric among "
        f'{", ".join(BASELINES)}; positive = better than the best baseline; "vs best of all": '
        "the same against the best of every scheduler of the group that is not TOPAS or an "
        "ablation (the paper's baselines and the peers it left out, docs/schedulers.md). "
        "Goodput: tasks/s "
        f"that met the SLO ({rep.slo.describe()}). The paper's reductions are shown only for "
        f"runs in its setting ({PAPER_PRESET}, KV budget {PAPER_KV_BUDGET:,}, default workload "
        f"parameters and rate, load {DEFAULT_LOAD:g}; either max_tokens setting). max_tokens "
        "(in each setting): exact = every call sent its true output length (with ignore_eos), "
        "so the server, and TOPAS's admission need, saw every length; cap N = every call sent "
        "N and ended at EOS, so no policy saw a length it did not estimate.",
        "",
    ]
    lines += _summary(rep.rows)
    lines += protocol_markdown(rep)
    for workload, w in rep.rows.groupby("workload", sort=False):
        lines += [f"## {workload}", ""]
        for key, g in w.groupby("group", sort=False):
            lines += _group_tables(g, rep.stages[rep.stages["group"] == key])
    if rep.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in rep.notes] + [""]
    if rep.problems:
        lines += ["## Left out", ""] + [f"- {p}" for p in rep.problems] + [""]
    return "\n".join(lines)


def _summary(rows: pd.DataFrame) -> list[str]:
    t = rows[rows["scheduler"] == "topas"]
    if t.empty:
        return []
    records = [
        {
            "workload": r["workload"],
            "setting": r["group_label"],
            "mean: best baseline": r["best_baseline_mean"] or "-",
            "mean: reduction": reduction_text(r, "mean"),
            "paper (mean)": pct_text(r["paper_reduction_mean"]),
            "p99: best baseline": r["best_baseline_p99"] or "-",
            "p99: reduction": reduction_text(r, "p99"),
            "paper (p99)": pct_text(r["paper_reduction_p99"]),
        }
        for _, r in t.iterrows()
    ]
    out = ["## TOPAS vs the best baseline", "", *_table(records)]
    wider = t[(t["best_any_mean"] != t["best_baseline_mean"])
              | (t["best_any_p99"] != t["best_baseline_p99"])]  # fmt: skip
    if wider.empty:
        return out
    records = [
        {
            "workload": r["workload"],
            "setting": r["group_label"],
            "mean: best of all": r["best_any_mean"] or "-",
            "mean: reduction": reduction_text(r, "mean", "any_"),
            "p99: best of all": r["best_any_p99"] or "-",
            "p99: reduction": reduction_text(r, "p99", "any_"),
        }
        for _, r in t.iterrows()
    ]
    return [*out, "## TOPAS vs the best of all (paper baselines and peers)", "", *_table(records)]


def protocol_markdown(rep: Report) -> list[str]:
    """The protocol's tables (`protocol`): the focus against every other scheduler per group,
    its levers, and tuning against defaults; each cell a paired margin with its verdict."""
    out: list[str] = []
    v = rep.verdicts
    if not v.empty:
        out += [f"## Verdicts: {rep.focus} against every other scheduler", "",
                f"Margin = 1 - {rep.focus} / other over the seeds both ran (positive: "
                f"{rep.focus} faster), 95% paired bootstrap interval. "
                + family_note(len(v)) + f" {rep.focus} in its tuned form where the tree has "
                "one; every other scheduler in the better of its tuned and default forms per "
                "metric (form), which can only flatter it. Acts while full / preempts: what the "
                f"scheduler may do beyond ordering the queue ({rep.focus}: "
                f"{powers(rep.focus)}; docs/schedulers.md).", ""]  # fmt: skip
        for (workload, _, label), g in v.groupby(GROUP_KEY, sort=False):
            out += [f"### {workload} ({label})", ""]
            records = []
            for other, m in by_metric(g, "other_name"):
                records.append({
                    "scheduler": other,
                    "form (mean / p99)": f"{m['mean']['other_variant']} / "
                                         f"{m['p99']['other_variant']}",
                    "acts while full / preempts": powers(str(m["mean"]["other_name"])),
                    "mean JCT s": f"{m['mean']['other_value']:.1f}",
                    f"{rep.focus} mean margin": cell_text(m["mean"]),
                    "p99 JCT s": f"{m['p99']['other_value']:.1f}",
                    f"{rep.focus} p99 margin": cell_text(m["p99"]),
                    "seeds ahead (mean)": f"{m['mean']['ahead']} of {m['mean']['n_seeds']}",
                })  # fmt: skip
            out += _table(records)
    for title, t, what in (("Levers", rep.levers, "ablation"), ("Tuning", rep.tuning, "tuned")):
        if t.empty:
            continue
        out += [f"## {title}", "",
                (f"Margin of {rep.focus} over each ablation (positive: the lever helps)"
                 if what == "ablation" else "Margin of each tuned scheduler over its defaults "
                 "(positive: tuning helped)") + ", paired over seeds. " + family_note(len(t)),
                ""]  # fmt: skip
        records = []
        for (workload, _, label), g in t.groupby(GROUP_KEY, sort=False):
            for other, m in by_metric(g, "other_name"):
                records.append({"workload": str(workload), "setting": str(label),
                                "scheduler": other, "mean": cell_text(m["mean"]),
                                "p99": cell_text(m["p99"])})  # fmt: skip
        out += _table(records)
    return out


def powers(name: str) -> str:
    """A scheduler's declared capabilities (`registry.capabilities`): ``no / no`` for one that
    only orders the queue where SGLang asks any policy; ``?`` for one not installed here, or a
    plugin that cannot be loaded (a report reads files: it needs no scheduler to run)."""
    from topas_bench.errors import TopasError
    from topas_bench.schedulers.registry import SCHEDULERS, capabilities

    try:
        c = capabilities(name) if name in SCHEDULERS.names() else None
    except TopasError:
        c = None
    if c is None:
        return "?"
    return f"{'yes' if c.acts_while_full else 'no'} / {'yes' if c.preempts else 'no'}"


def by_metric(t: pd.DataFrame, key: str) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """A protocol table's rows by `key` (in order of appearance), each as metric -> row."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in t.to_dict("records"):
        out.setdefault(str(r[key]), {})[str(r["metric"])] = {str(k): v for k, v in r.items()}
    return list(out.items())


def _group_tables(g: pd.DataFrame, stages: pd.DataFrame) -> list[str]:
    first = g.iloc[0]
    out = [f"### {first['group_label']}, seeds {first['seeds']}", ""]
    jct = [
        {
            "scheduler": r["scheduler"],
            "mean JCT": ci_text(r, "mean_jct_s"),
            "p50": ci_text(r, "p50_jct_s"),
            "p90": ci_text(r, "p90_jct_s"),
            "p99": ci_text(r, "p99_jct_s"),
            "mean vs best": reduction_text(r, "mean"),
            "p99 vs best": reduction_text(r, "p99"),
            "mean / p99 vs best of all": f"{reduction_text(r, 'mean', 'any_')} / "
            f"{reduction_text(r, 'p99', 'any_')}",
            "tasks/s": num_text(r["throughput_tps"], "{:.4f}"),
            "goodput": ci_text(r, "goodput_tps", "{:.4f}"),
            "SLO met": pct_text(r["slo_attainment"]),
            "prefix hit": pct_text(r["prefix_hit_rate"]),
            "preempt": num_text(r["preemptions"], "{:.0f}"),
            "decision p50 / p99 ms": _decisions(r),
        }
        for _, r in g.iterrows()
    ]
    out += _table(jct)
    calls = [
        {
            "scheduler": r["scheduler"],
            "TTFT mean / p99 s": _pair(r, "ttft", "{:.2f}", "_s"),
            "TPOT mean / p99 ms": _pair(r, "tpot", "{:.1f}", "_ms"),
            "ITL mean ms": num_text(r["itl_mean_ms"], "{:.1f}"),
            "queueing mean / p99 s": _pair(r, "queue", "{:.2f}", "_s"),
            "latency mean / p99 s": _pair(r, "latency", "{:.2f}", "_s"),
            "requests/s": num_text(r["request_tps"], "{:.3f}"),
            "output tok/s": num_text(r["output_tok_s"], "{:.1f}"),
        }
        for _, r in g.iterrows()
    ]
    out += ["Calls (request level, finished calls):", "", *_table(calls)]
    if not stages.empty:
        lat = stages.pivot_table(index="kind", columns="scheduler", values="mean_latency_s",
                                 sort=False)  # fmt: skip
        order = [s for s in g["scheduler"] if s in lat.columns]
        records = [
            {"stage kind": str(kind), **{s: num_text(lat.loc[kind, s]) for s in order}}
            for kind in lat.index
        ]
        out += ["Mean latency per stage kind (s, send to finish):", "", *_table(records)]
    if first["best_baseline_mean"]:
        out.append(
            f"Best baseline: mean JCT `{first['best_baseline_mean']}`, "
            f"p99 JCT `{first['best_baseline_p99']}`. Best of all: mean JCT "
            f"`{first['best_any_mean']}`, p99 JCT `{first['best_any_p99']}`."
        )
        out.append("")
    return out


def _decisions(r: pd.Series) -> str:
    if is_nan(r["decision_p50_ms"]):
        return "-"
    return f"{r['decision_p50_ms']:.3f} / {r['decision_p99_ms']:.3f}"


def _pair(r: pd.Series, name: str, fmt: str, unit: str) -> str:
    a, b = r[f"{name}_mean{unit}"], r[f"{name}_p99{unit}"]
    return "-" if is_nan(a) else f"{fmt.format(a)} / {fmt.format(b)}"


def write_report(rep: Report, out: Path) -> list[Path]:
    """`out/report.md`, `out/report.csv` (one row per group and scheduler) and
    `out/report-stages.csv` (per group, scheduler and stage kind)."""
    out.mkdir(parents=True, exist_ok=True)
    md, csv, stages = out / "report.md", out / "report.csv", out / "report-stages.csv"
    md.write_text(to_markdown(rep) + "\n")
    # the SLO goodput was measured under travels with the rows (the site names it)
    rows = rep.rows.drop(columns=["group"]).assign(slo=rep.slo.describe())
    rows.to_csv(csv, index=False, float_format="%.6g")
    first = rep.rows.drop_duplicates("group").set_index("group")
    st = rep.stages.assign(
        workload=rep.stages["group"].map(first["workload"]),
        group_label=rep.stages["group"].map(first["group_label"]),
    ).drop(columns=["group"])
    st.to_csv(stages, index=False, float_format="%.6g")
    written = [md, csv, stages]
    for name, table in (("verdicts", rep.verdicts), ("levers", rep.levers),
                        ("tuning", rep.tuning)):  # fmt: skip
        path = out / f"{name}.csv"
        if table.empty:
            path.unlink(missing_ok=True)  # a stale table of an earlier report would mislead
            continue
        table.to_csv(path, index=False, float_format="%.6g")
        written.append(path)
    runs = out / RUNS_FILE
    rep.runs.to_csv(runs, index=False, float_format="%.8g",
                    compression={"method": "gzip", "mtime": 0})  # fmt: skip
    return [*written, runs]


#: The compact per-run table a report writes beside its summaries: what the protocol's tables,
#: and the docs generated from them, are computed from (`protocol.COMPACT`).
RUNS_FILE = "runs.csv.gz"
