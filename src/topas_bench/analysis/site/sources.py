"""What a site shows: the sources of a RESULTS directory (STYLE 8: analysis only reads files).

A source is a named set of report rows:

- a run tree (cells at `<workload>/<scheduler>/<cell>/run.json`): collected and reported here,
  with every figure (CDFs and timelines need the per-task and timeline files);
- a report directory (`report.csv`, `report-stages.csv`, as `topas-bench report` writes them)
  whose runs are not committed: tables, relative JCT, load curves, regime maps, stage latency
  and ablations are drawn from the rows; CDFs and timelines are named as needing the runs.

RESULTS itself is one run tree (`runs/nightly`) or a directory of sources (`results/`: each
subdirectory that is a run tree or holds a report.csv). `RESULTS/site.toml` (optional) orders
them (the first is the headline), titles them, names the commands that regenerate their data
and, for reports written before report.csv recorded them, their engine and code revision;
`--runs NAME=DIR` puts a run tree behind a report directory.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.collect import Collection, check_revisions, collect, unverified_note
from topas_bench.analysis.compact import cdf_table, read_compact, timeline_table
from topas_bench.analysis.metrics import Slo
from topas_bench.analysis.report import COMPARED, build_report
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import BASELINES

CONFIG = "site.toml"
SOURCE_KEYS = {"dir", "title", "about", "commands", "code", "engine"}


@dataclass
class Source:
    """`rows`: one per group and scheduler, as `report.Report.rows` (with `group`); `coll`:
    the runs behind them, None for a report directory."""

    name: str
    title: str
    about: str
    rows: pd.DataFrame
    stages: pd.DataFrame
    slo: str
    commands: list[str]
    code: str
    coll: Collection | None = None
    notes: list[str] = field(default_factory=list)
    #: what the tables and figures come from, in words
    data: str = "the runs (every figure)"
    #: one row per run (`protocol.COMPACT`) and the protocol's verdicts (`report.Report`):
    #: from the runs, or from a report directory's runs.csv.gz and verdicts.csv when it has them
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: the protocol's lever table (levers.csv); the compact CDF and timeline tables
    #: (`compact`): from the runs, or from a report directory's cdf.csv.gz / timeline.csv.gz
    levers: pd.DataFrame = field(default_factory=pd.DataFrame)
    cdf: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: the directory it was read from
    path: Path | None = None

    @property
    def has_runs(self) -> bool:
        return self.coll is not None

    @property
    def report_dir(self) -> Path | None:
        """The report directory it was read from (None for a run tree)."""
        return self.path if self.path is not None and not is_run_tree(self.path) else None

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(self.rows["workload"]))


@dataclass(frozen=True)
class Options:
    slo: Slo = field(default_factory=Slo)
    skip_bad: bool = False
    allow_mixed: bool = False


def is_run_tree(path: Path) -> bool:
    return any(True for _ in path.glob("*/*/*/run.json"))


def read_config(results: Path) -> dict[str, Any]:
    path = results / CONFIG
    if not path.is_file():
        return {}
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: TOMLDecodeError, UnicodeDecodeError
        raise TopasError(f"{path}: unreadable ({' '.join(str(e).split())[:200]})") from None
    unknown = set(doc) - {"title", "about", "source"}
    for i, s in enumerate(doc.get("source", [])):
        unknown |= {f"source[{i}].{k}" for k in set(s) - SOURCE_KEYS}
        if "dir" not in s:
            raise TopasError(f"{path}: source[{i}] has no `dir`")
    if unknown:
        raise TopasError(f"{path}: unknown keys {', '.join(sorted(unknown))}")
    return doc


def discover(results: Path, runs: dict[str, Path], opts: Options) -> list[Source]:
    """The sources of `results` in the order `site.toml` gives (then by name)."""
    if not results.is_dir():
        raise TopasError(f"{results}: not a directory of results")
    config = read_config(results)
    listed = {str(s["dir"]): s for s in config.get("source", [])}
    if is_run_tree(results):
        found = {results.resolve().name: results}
    else:
        # RESULTS/fidelity holds fidelity.json (its own page), and may hold the cells it ran
        found = {
            d.name: d
            for d in sorted(results.iterdir())
            if d.is_dir()
            and not (d / "fidelity.json").is_file()
            and (is_run_tree(d) or (d / "report.csv").is_file())
        }
    for name, path in runs.items():
        if name not in found:
            raise TopasError(f"--runs {name}={path}: RESULTS has no source {name!r}")
    missing = [n for n in listed if n not in found]
    if missing:
        raise TopasError(f"{results / CONFIG} names {', '.join(missing)}, not in {results}")
    if not found:
        raise TopasError(
            f"{results}: nothing to show (no run tree and no directory with a report.csv)"
        )
    order = [*listed, *(n for n in found if n not in listed)]
    return [_load(n, found[n], runs.get(n), listed.get(n, {}), opts) for n in order]


def _load(name: str, path: Path, runs: Path | None, conf: dict[str, Any], opts: Options) -> Source:
    commands = [str(c) for c in conf.get("commands", [])]
    title, about = str(conf.get("title", name)), str(conf.get("about", ""))
    if is_run_tree(path):
        if runs is not None:
            raise TopasError(f"--runs {name}={runs}: {path} holds its own runs")
        coll = _collect(path, opts)
        rep = build_report(coll)
        codes = "; ".join(sorted(set(coll.runs["code"])))
        notes = [*rep.notes, *(f"left out: {p}" for p in rep.problems)]
        notes += [n for n in (unverified_note(coll),) if n]
        if not commands:
            commands = [f"topas-bench report {path}"]
        cdf, timeline = cdf_table(coll, rep.rows), timeline_table(coll, rep.rows)
        return Source(name, title, about, rep.rows, rep.stages, rep.slo.describe(), commands,
                      str(conf.get("code", codes)), coll, notes, runs=rep.runs,
                      verdicts=rep.verdicts, levers=rep.levers, cdf=cdf, timeline=timeline,
                      path=path)  # fmt: skip
    rows, stages, slo = read_report(path)
    if "engine" in conf:  # a report written before report.csv recorded the engine
        rows["engine"] = rows["engine"].replace("", str(conf["engine"]))
    code = str(conf.get("code", "; ".join(sorted(set(rows["code"]) - {""})) or "not recorded"))
    data = "the report's rows (report.csv, report-stages.csv); its runs are not here"
    src = Source(name, title, about, rows, stages, slo, commands, code, data=data, path=path)
    src.runs, src.verdicts = read_protocol(path)
    src.levers = _read_csv(path / "levers.csv")
    src.cdf, src.timeline = read_compact(path)
    if not src.cdf.empty or not src.timeline.empty:
        src.data = ("the report's rows, per-run table and compact JCT distributions and "
                    "timelines (cdf.csv.gz, timeline.csv.gz); its runs are not here")  # fmt: skip
    if runs is not None:
        src.coll, src.notes = _behind(name, runs, rows, opts)
        src.cdf, src.timeline = cdf_table(src.coll, rows), timeline_table(src.coll, rows)
        src.data = (f"the report's rows; JCT distributions and timelines from the runs in "
                    f"{runs}, which reproduce the report's JCTs")  # fmt: skip
    return src


def _read_csv(f: Path) -> pd.DataFrame:
    """A report directory's table, empty when the report predates it."""
    try:
        return pd.read_csv(f, keep_default_na=False, na_values=[""]) if f.is_file() \
            else pd.DataFrame()  # fmt: skip
    except (OSError, ValueError, EOFError) as e:  # EOFError: a cut gzip file
        raise TopasError(f"{f}: unreadable ({e})") from None


def _behind(
    name: str, runs: Path, rows: pd.DataFrame, opts: Options
) -> tuple[Collection, list[str]]:
    """The runs behind a report, keyed like its rows, after checking that they reproduce it:
    every (setting, scheduler) both have must agree on mean and p99 JCT (report.csv keeps six
    significant digits). The report's rows stay the tables; the runs draw CDFs and timelines."""
    coll = _collect(runs, opts)
    rep = build_report(coll)
    firsts = rep.rows.drop_duplicates("group")
    labels = firsts["workload"] + " | " + firsts["group_label"]
    key = dict(zip(firsts["group"], labels, strict=True))
    coll.runs["group"] = coll.runs["group"].map(key)
    mine = rep.rows.assign(group=rep.rows["group"].map(key))
    both = mine.merge(rows, on=["group", "scheduler"], suffixes=("_runs", ""))
    for _, r in both.iterrows():
        for col in ("mean_jct_s", "p99_jct_s"):
            a, b = float(r[f"{col}_runs"]), float(r[col])
            if abs(a - b) > 1e-5 * max(abs(b), 1.0):
                raise TopasError(
                    f"--runs {name}={runs}: its runs do not reproduce the report: "
                    f"{r['group']}, {r['scheduler']}: {col} {a:.6g} from the runs, {b:.6g} in "
                    "report.csv (different code or settings?)"
                )
    if both.empty:
        raise TopasError(f"--runs {name}={runs}: no setting in common with the report")
    extra = sorted(set(mine["group"]) - set(rows["group"]))
    notes = [f"runs of settings not in the report, not shown: {'; '.join(extra)}"] if extra else []
    return coll, notes


def _collect(tree: Path, opts: Options) -> Collection:
    coll = collect(tree, opts.slo)
    if coll.problems and not opts.skip_bad:
        n = len(coll.problems)
        raise TopasError(
            f"{tree}: {n} bad run{'s' * (n != 1)} (first: {coll.problems[0]}); pass --skip-bad "
            "to leave them out"
        )
    if not opts.allow_mixed:
        check_revisions(coll)
    return coll


def read_report(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """A report directory's rows (with a `group` per workload and setting), stage rows and
    SLO; columns newer than the report are filled in where they follow from it."""
    csv = path / "report.csv"
    try:
        rows = pd.read_csv(csv, keep_default_na=False, na_values=[""])
        stages_path = path / "report-stages.csv"
        stages = pd.read_csv(stages_path) if stages_path.is_file() else pd.DataFrame()
    except (OSError, ValueError) as e:
        raise TopasError(f"{csv}: unreadable report ({e})") from None
    need = {"workload", "group_label", "scheduler", "mean_jct_s", "p99_jct_s", "reduction_mean"}
    if not need <= set(rows.columns):
        raise TopasError(f"{csv}: not a report.csv (no {', '.join(sorted(need - set(rows)))})")
    rows["group"] = rows["workload"].astype(str) + " | " + rows["group_label"].astype(str)
    for col, default in (("engine", ""), ("code", ""), ("preset", "")):
        if col not in rows:
            rows[col] = default
        rows[col] = rows[col].fillna(default).astype(str)
    for m in COMPARED:
        rows[f"best_baseline_{m}"] = rows[f"best_baseline_{m}"].fillna("").astype(str)
        if f"best_any_{m}" not in rows:
            _best_of_all(rows, m)
    if not stages.empty:
        stages = _stage_groups(stages, rows)
    return rows, stages, _slo(rows, path)


def read_protocol(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A report directory's compact runs (runs.csv.gz) and verdicts (verdicts.csv), each empty
    when the report predates them."""
    from topas_bench.analysis.render import RUNS_FILE

    runs, verdicts = _read_csv(path / RUNS_FILE), _read_csv(path / "verdicts.csv")
    if not runs.empty:
        runs["scheduler_params"] = runs["scheduler_params"].fillna("{}").astype(str)
    return runs, verdicts


def _stage_groups(stages: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Stage rows keyed like the report's rows. Reports older than the `workload` column of
    report-stages.csv name only the setting: a label that one workload has is that workload's;
    one that several share cannot be attributed and is left out."""
    if "workload" not in stages:
        owners = rows.groupby("group_label")["workload"].unique()
        one = {str(k): str(v[0]) for k, v in owners.items() if len(v) == 1}
        stages = stages[stages["group_label"].isin(one)].copy()
        stages["workload"] = stages["group_label"].map(one)
    stages["group"] = stages["workload"].astype(str) + " | " + stages["group_label"].astype(str)
    return stages


def _best_of_all(rows: pd.DataFrame, m: str) -> None:
    """Reports older than `reduction_any`: where a group ran no scheduler beyond the baselines
    and TOPAS's family, the best of all is the best baseline; elsewhere it is not known."""
    plain = rows.groupby("group")["scheduler"].transform(
        lambda s: all(x in BASELINES or str(x).startswith("topas") for x in s)
    )
    rows[f"best_any_{m}"] = np.where(plain, rows[f"best_baseline_{m}"], "")
    for suffix in ("", "_lo", "_hi"):
        rows[f"reduction_any_{m}{suffix}"] = rows[f"reduction_{m}{suffix}"].where(plain)


def _slo(rows: pd.DataFrame, path: Path) -> str:
    if "slo" in rows and rows["slo"].notna().any():
        return str(rows["slo"].dropna().iloc[0])
    md = path / "report.md"  # written beside report.csv by `report`, which names the SLO
    found = re.search(r"met the SLO \((.+?)\)", md.read_text()) if md.is_file() else None
    return found.group(1) if found else "not recorded"
