"""The evaluation protocol's tables as the docs show them: the headline, TOPAS against every
other scheduler, the levers, preemption, tuning, the mechanism, per-seed margins, the
summary, what each scheduler can do and the peers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.docgen.data import label_of, md_table, runs_of, seeds_text, workload_order
from topas_bench.analysis.protocol import (
    GROUP_KEY,
    best_others,
    cell_text,
    is_family,
    levers,
    pct,
    representatives,
    tuning_table,
    versus,
)
from topas_bench.analysis.regime import NO_PINS
from topas_bench.analysis.render import powers
from topas_bench.analysis.report import PAPER_REDUCTIONS
from topas_bench.analysis.verdict import family_note
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import ABLATIONS


def headline(root: Path, dir: str, focus: str = "topas", paper: str = "yes") -> str:
    """Per group (a workload at one setting): the strongest other scheduler on mean and p99
    JCT, the focus's margin over it with the verdict, the focus's verdicts against every other,
    and (`paper=yes`) the paper's reduction."""
    runs = runs_of(root, dir)
    table = versus(runs, focus)
    best = best_others(table)
    records = []
    for key, g in best.groupby(GROUP_KEY, sort=False):
        w = str(key[0])
        row: dict[str, Any] = {"workload (setting)": _setting(runs, w, str(key[2]))}
        for m in ("mean", "p99"):
            b = g[g["metric"] == m].iloc[0]
            row[f"strongest other: {m}"] = f"{b['other_name']} {b['other_value']:.1f} s"
            row[f"{focus} {m}"] = cell_text(b)
            row[f"vs every other ({m}): win / tie / loss"] = (
                f"{b['n_win']} / {b['n_tie']} / {b['n_loss']} of {b['n_others']}"
            )
        if paper == "yes":
            ref = PAPER_REDUCTIONS.get(w)
            row["paper (mean / p99)"] = f"{100 * ref[0]:.1f}% / {100 * ref[1]:.1f}%" if ref else "-"
        records.append((w, row))
    order = workload_order([w for w, _ in records])
    records.sort(key=lambda wr: order.index(wr[0]))  # stable: a workload's settings in order
    rows = [r for _, r in records]
    cols = ["workload (setting)"] + [
        c for m in ("mean", "p99") for c in (f"strongest other: {m}", f"{focus} {m}",
                                             f"vs every other ({m}): win / tie / loss")
    ] + (["paper (mean / p99)"] if paper == "yes" else [])  # fmt: skip
    return md_table([{c: r[c] for c in cols} for r in rows]) + _caption(
        runs, len(table), f"{focus} against every other"
    )


def _setting(runs: pd.DataFrame, workload: str, label: str) -> str:
    """A workload's row name: its rate, and what else tells its settings apart."""
    mine = runs[runs["workload"] == workload]
    g = mine[mine["group_label"] == label].iloc[0]
    parts = [f"{float(g['rate_per_s']):.4g}/s"]
    if mine["max_tokens"].nunique() > 1:
        parts.append(str(g["max_tokens"]))
    return f"{workload} ({', '.join(parts)})"


def _caption(runs: pd.DataFrame, cells: int, what: str) -> str:
    return (
        f"\n(Seeds {seeds_text(runs)}, engine {', '.join(sorted(set(runs['engine'])))}, "
        f"{', '.join(sorted(set(runs['preset'])))}, {int(runs['num_tasks'].iloc[0])} tasks per "
        f"run. {family_note(cells)} Family: {what}.)\n"
    )


def versus_matrix(root: Path, dir: str, metric: str = "mean", focus: str = "topas") -> str:
    """Every other scheduler (rows) against the focus per workload (columns), one metric."""
    runs = runs_of(root, dir)
    table = versus(runs, focus)
    t = table[table["metric"] == metric]
    workloads = workload_order(list(t["workload"].unique()))
    records = []
    for name, d in t.groupby("other_name", sort=False):
        row = {"scheduler": label_of(str(name), d), "acts while full / preempts": powers(str(name))}
        for w in workloads:
            hit = d[d["workload"] == w]
            row[w] = cell_text(hit.iloc[0]) if not hit.empty else "-"
        records.append(row)
    records.sort(key=lambda r: r["scheduler"])
    return md_table(records) + _caption(
        runs, len(table), f"{focus} against every other, mean and p99"
    )


def lever_table(root: Path, dir: str, focus: str = "topas") -> str:
    """The focus against each of its ablations present, per workload (mean / p99)."""
    runs = runs_of(root, dir)
    present = [a for a in ABLATIONS if a in set(runs["scheduler_name"])]
    table = levers(runs, present, focus)
    workloads = workload_order(list(table["workload"].unique()))
    records = []
    for w in workloads:
        row = {"workload": w}
        for a in present:
            d = table[(table["workload"] == w) & (table["other_name"] == a)]
            cells = {str(r["metric"]): r for _, r in d.iterrows()}
            row[a] = (f"{cell_text(cells['mean'])} / {cell_text(cells['p99'])}"
                      if {"mean", "p99"} <= set(cells) else "-")  # fmt: skip
        records.append(row)
    return md_table(records) + _caption(runs, len(table), f"{focus} against each ablation")


def preemption(
    root: Path, dir: str, focus: str = "topas", without: str = "topas-no-preempt"
) -> str:
    """How much of the focus's margin is preemption: the focus against its non-preempting
    variant (its own lever table family), and that variant against the strongest other."""
    runs = runs_of(root, dir)
    lever = levers(runs, [without], focus)
    plain = best_others(versus(runs, without))
    full = best_others(versus(runs, focus))
    records = []
    for w in workload_order(list(lever["workload"].unique())):
        row: dict[str, Any] = {"workload": w}
        for m in ("mean", "p99"):
            f = full[(full["workload"] == w) & (full["metric"] == m)].iloc[0]
            p = plain[(plain["workload"] == w) & (plain["metric"] == m)].iloc[0]
            lv = lever[(lever["workload"] == w) & (lever["metric"] == m)].iloc[0]
            row[f"{focus} vs strongest other ({m})"] = f"{f['other_name']}: {cell_text(f)}"
            row[f"{without} vs strongest other ({m})"] = f"{p['other_name']}: {cell_text(p)}"
            row[f"preemption's worth ({m})"] = cell_text(lv)
        records.append(row)
    return md_table(records) + (
        f"\n(Seeds {seeds_text(runs)}. Three families, each Holm-corrected: {focus} against every "
        f"other ({len(versus(runs, focus))} cells), {without} against every other "
        f"({len(versus(runs, without))}), {focus} against {without} ({len(lever)}).)\n"
    )


def tuning(root: Path, dir: str, tuned: str) -> str:
    """Each tuned scheduler: its parameters, the objective before and after, and the effect
    of tuning per workload on the evaluation seeds; the budget every one of them had."""
    from topas_bench.tuned import load_tuned

    runs = runs_of(root, dir)
    found = load_tuned(root / tuned)
    table = tuning_table(runs, None)
    workloads = workload_order(list(runs["workload"].unique()))
    records = []
    for name, entry in sorted(found.entries.items()):
        row: dict[str, Any] = {
            "scheduler": name,
            "tuned parameters": ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(
                entry.params.items())) or "defaults kept",
            "trials (grid)": f"{entry.trials} ({entry.grid_points:,})",
            "objective: defaults -> tuned": f"{entry.default.objective:.3f} -> "
                                            f"{entry.tuned.objective:.3f}",
        }  # fmt: skip
        d = table[(table["other_name"] == name) & (table["metric"] == "mean")]
        for w in workloads:
            hit = d[d["workload"] == w]
            row[f"{w} (mean)"] = cell_text(hit.iloc[0]) if not hit.empty else "-"
        records.append(row)
    return md_table(records) + (
        f"\n(Budget: {found.describe_budget()}. Objective: lower is better, 1 = the best "
        "default baseline. The workload columns: the tuned form against the defaults on the "
        f"evaluation seeds {seeds_text(runs)}, mean JCT, positive = tuning helped, '-' where "
        f"tuning kept the defaults. {family_note(len(table))} Family: every tuned scheduler "
        "against its defaults, mean and p99.)\n"
    )


def mechanism(root: Path, dir: str, focus: str = "topas") -> str:
    """Per workload: the focus, its ablations and the strongest other on mean JCT: decode
    batch, distinct agents per decode batch, prefix hit rate, preemptions per run and the mean
    wait from a call being ready to its first admission, averaged over seeds."""
    runs = runs_of(root, dir)
    best = best_others(versus(runs, focus))
    records = []
    for key, g in runs.groupby(GROUP_KEY, sort=False):
        w = str(key[0])
        reps = representatives(g)
        if focus not in reps:
            continue
        strongest = best[(best["workload"] == w) & (best["metric"] == "mean")]
        names = [focus, *(a for a in ABLATIONS if a in reps)]
        names += [str(strongest.iloc[0]["other_name"])] if not strongest.empty else []
        for name in names:
            d = g[g["scheduler"] == reps[name]]
            records.append({
                "workload": w, "scheduler": name, "decode batch": f"{d['decode_batch'].mean():.2f}",
                "agents / batch": f"{d['agents_per_batch'].mean():.2f}",
                "prefix hit": f"{100 * d['prefix_hit_rate'].mean():.1f}%",
                "preemptions / run": f"{d['preemptions'].mean():.0f}",
                "wait to admission (s)": f"{d['queue_mean_s'].mean():.1f}",
            })  # fmt: skip
    order = workload_order(list({r["workload"] for r in records}))
    records.sort(key=lambda r: order.index(r["workload"]))  # stable: a workload's rows in order
    return md_table(records) + f"\n(Means over seeds {seeds_text(runs)}.)\n"


def per_seed(root: Path, dir: str, focus: str = "topas") -> str:
    """The focus's mean-JCT margin over the strongest other (chosen on the mean over all the
    seeds), seed by seed: how much one seed carries."""
    runs = runs_of(root, dir)
    best = best_others(versus(runs, focus))
    seeds = sorted(int(s) for s in runs["seed"].unique())
    records = []
    for _, b in best[best["metric"] == "mean"].iterrows():
        g = runs[(runs["workload"] == b["workload"]) & (runs["group_label"] == b["group_label"])]
        f = g[g["scheduler"] == b["focus"]].set_index("seed")["mean_jct_s"]
        o = g[g["scheduler"] == b["other"]].set_index("seed")["mean_jct_s"]
        row = {"workload": str(b["workload"]), "strongest other": str(b["other_name"])}
        for s in seeds:
            row[str(s)] = f"{100 * (1 - f[s] / o[s]):+.1f}" if s in f and s in o else "-"
        row["all seeds"] = pct(float(b["margin"]))
        records.append(row)
    order = workload_order([r["workload"] for r in records])
    records.sort(key=lambda r: order.index(r["workload"]))
    return md_table(records) + "\n(Per seed: 1 - focus / other on that seed's mean JCT, in %.)\n"


def capability(root: Path, dir: str) -> str:
    """Per scheduler of a report: what it may do beyond ordering the queue (declared,
    `registry.capabilities`), the preemptions per run it caused or suffered (engine
    retractions included), and the form it ran in (tuned, defaults kept, no parameters)."""
    from topas_bench.schedulers.registry import make_policy

    runs = runs_of(root, dir)
    records = []
    names = sorted(set(runs["scheduler_name"]), key=lambda n: (n.startswith("topas"), n))
    for name in names:
        d = runs[runs["scheduler_name"] == name]
        forms = set(d["variant"])
        if "tuned" in forms:
            tuned = d[d["variant"] == "tuned"]
            params = json.loads(str(tuned["scheduler_params"].iloc[0]) or "{}")
            form = "tuned: " + (", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(
                params.items())) or "defaults kept")  # fmt: skip
        elif not make_policy(name).params:
            form = "no parameters"
        else:
            form = "defaults (not tuned)"
        rep = d[d["variant"] == ("tuned" if "tuned" in forms else "default")]
        records.append({
            "scheduler": name, "acts while full / preempts": powers(name),
            "preemptions / run": f"{rep['preemptions'].mean():.1f}", "ran as": form,
        })  # fmt: skip
    return md_table(records) + (
        f"\n(Preemptions per run: the mean over {seeds_text(runs)} and every workload of the runs "
        "of the form shown; it counts SGLang's own retractions too, which any scheduler may "
        "suffer when decode memory over-commits.)\n"
    )


def _said(r: pd.Series) -> str:
    """``a win, +14.3% [+8.4, +20.5] over routing-key`` for a verdict row."""
    word = {"win": "a win", "loss": "a loss", "tie": "a tie"}[str(r["verdict"])]
    form = " (tuned)" if r.get("other_variant") == "tuned" else ""
    return f"{word}, {pct(r['margin'], r['lo'], r['hi'])} over {r['other_name']}{form}"


def summary(root: Path, dir: str, focus: str = "topas", without: str = "topas-no-preempt",
            pins: str = NO_PINS) -> str:  # fmt: skip
    """One line per workload of a report: the focus against the strongest other (mean, p99)
    with its verdicts against every other, then without preemption, then the residency lever."""
    runs = runs_of(root, dir)
    full = best_others(versus(runs, focus))
    plain = best_others(versus(runs, without)) if without in set(runs["scheduler_name"]) else None
    present = [a for a in ABLATIONS if a in set(runs["scheduler_name"])]
    lever = levers(runs, present, focus)  # the lever table's own family
    what = {pins: f"residency (against {pins})", without: f"preemption (against {without})"}
    lines = []
    for w in workload_order(list(full["workload"].unique())):
        f = {m: full[(full["workload"] == w) & (full["metric"] == m)].iloc[0] for m in ("mean",
             "p99")}  # fmt: skip
        text = (
            f"- **{w}**: mean JCT {_said(f['mean'])}; p99 {_said(f['p99'])}. Against all "
            f"{f['mean']['n_others']} others: {f['mean']['n_win']} wins, {f['mean']['n_loss']} "
            f"losses on the mean, {f['p99']['n_win']} wins, {f['p99']['n_loss']} losses on the p99."
        )
        if plain is not None:
            p = plain[(plain["workload"] == w) & (plain["metric"] == "mean")].iloc[0]
            text += f" Without preemption ({without}), mean: {_said(p)}."
        lv = lever[(lever["workload"] == w) & (lever["metric"] == "mean")]
        for _, r in lv[lv["other_name"].isin(list(what))].iterrows():
            margin = pct(r["margin"], r["lo"], r["hi"])
            text += f" The lever {what[str(r['other_name'])]}, mean: {r['verdict']}, {margin}."
        lines.append(text)
    return "\n".join(lines) + (
        f"\n\n(Seeds {seeds_text(runs)}; verdicts Holm-corrected within each table of the sections "
        "below: the focus against every other, the non-preempting variant against every other, "
        "the focus against its ablations.)\n"
    )


def peers(root: Path, dir: str, names: str, focus: str = "topas") -> str:
    """Per workload and each of `names` (comma-separated): where it stands. Its own paired
    verdict against the strongest scheduler outside the focus's family (one Holm family per
    peer: it against every such scheduler), its wins / ties / losses against all of them, the
    focus's margin over it (from the focus's own table), and what its timeline shows: prefix
    hit rate, wait to first admission, decode batch, preemptions."""
    runs = runs_of(root, dir)
    field = runs[~runs["scheduler_name"].map(lambda n: is_family(str(n), focus))]
    top = versus(runs, focus)
    records = []
    for name in (n for n in names.split(",") if n):
        if name not in set(runs["scheduler_name"]):
            raise TopasError(f"peers: {name} has no runs in {dir}")
        own = best_others(versus(field, name))
        for _, b in own[own["metric"] == "mean"].iterrows():
            w, label = b["workload"], b["group_label"]
            g = runs[(runs["workload"] == w) & (runs["group_label"] == label)]
            d = g[g["scheduler"] == b["focus"]]
            t = top[(top["workload"] == w) & (top["group_label"] == label)
                    & (top["metric"] == "mean") & (top["other_name"] == name)]  # fmt: skip
            form = str(d["variant"].iloc[0]) if "variant" in d and len(d) else "default"
            records.append({
                "workload": w, "scheduler": f"{name} ({form})",
                "mean JCT s": f"{d['mean_jct_s'].mean():.1f}",
                "vs the strongest other (mean)": f"{cell_text(b)} over {b['other_name']}",
                "win / tie / loss": f"{b['n_win']} / {b['n_tie']} / {b['n_loss']} of "
                                    f"{b['n_others']}",
                f"{focus} over it (mean)": cell_text(t.iloc[0]) if len(t) else "-",
                "prefix hit": f"{100 * d['prefix_hit_rate'].mean():.1f}%",
                "wait to admission (s)": f"{d['queue_mean_s'].mean():.1f}",
                "decode batch": f"{d['decode_batch'].mean():.2f}",
                "preemptions / run": f"{d['preemptions'].mean():.0f}",
            })  # fmt: skip
    order = workload_order(list({r["workload"] for r in records}))
    records.sort(key=lambda r: order.index(r["workload"]))
    return md_table(records) + (
        f"\n(Means over seeds {seeds_text(runs)}; each scheduler in its representative form, tuned "
        'where it has one. "vs the strongest other": the scheduler against every other but '
        f'{focus}\'s ablations, one Holm family per scheduler; "{focus} over it": from '
        f"{focus}'s own table.)\n"
    )
