"""Tuned parameters as a file, `OUT/tuned.toml` (written by `topas-bench tune`), and its reader
for sweeps, runs and reports (`load_tuned` -> `TunedSet`).

The file is TOML, one table per scheduler under `schedulers`, plus the budget every one of
them was tuned with:

    [budget]                    # the same for every scheduler of the file
    trials = 30                 # per scheduler; a smaller grid is enumerated whole
    seeds = [101, 102, 103]     # tuning seeds (never the evaluation seeds)
    workloads = ["chain3", "dag4", "dag10-wide", "metagpt-sop", "metagpt-tl"]
    tasks = 80
    load = 0.8
    load_reference = ["fcfs", "lpm", "spf", "parrot", "autellix"]
    preset = "a100-qwen32b"
    kv_budget_tokens = 18692
    kv_budget_derived = true
    engine = "sim"
    objective = "..."           # `OBJECTIVE`, in words

    [schedulers.lpm-aging]
    trials = 16                 # trials run (its grid has 16 points)
    grid_points = 16
    study = "lpm-aging-1a2b3c4d5e"
    default = { objective = 1.04, mean_ratio = 1.02, p99_ratio = 1.06 }
    tuned = { objective = 0.98, mean_ratio = 0.99, p99_ratio = 0.97 }

    [schedulers.lpm-aging.params]   # only what differs from the defaults; empty = they won
    k = 8

    [schedulers.lpm-aging.grid]     # the values searched
    k = [2, 4, 8, 16]
    aging_tokens_per_pass = [0.0, 32.0, 128.0, 512.0]

TOML has no null: a None is written as the string "null", as the command line spells it
(`--scheduler-param topas.horizon_s=null`). A TOPAS ablation or variant without a table of its
own takes `topas`'s parameters that it accepts (`TunedSet.params_for`), so it differs from
tuned TOPAS in exactly its lever.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import BASELINES, SCHEDULERS, is_policy_class, make_policy
from topas_bench.schedulers.topas import Topas

#: What the tuning minimises, in words (`tune.search`).
OBJECTIVE = (
    "the mean over workloads x tuning seeds of mean JCT / the best default baseline's mean "
    "JCT and, apart, of p99 JCT / the best default baseline's p99 JCT (the best of "
    f"{', '.join(BASELINES)} on the same sample, each metric on its own); the objective is "
    "the average of the two ratios (lower is better, 1 = the best baseline)"
)
NULL = "null"


@dataclass(frozen=True)
class Score:
    """A setting's objective and its two ratios to the best default baseline."""

    objective: float
    mean_ratio: float
    p99_ratio: float


@dataclass(frozen=True)
class Budget:
    """What every scheduler of a tuned file was tuned with."""

    trials: int
    seeds: tuple[int, ...]
    workloads: tuple[str, ...]
    tasks: int
    load: float
    load_reference: tuple[str, ...]
    preset: str
    kv_budget_tokens: int
    kv_budget_derived: bool
    engine: str = "sim"
    objective: str = OBJECTIVE

    def describe(self) -> str:
        """The budget in one line."""
        budget = f"KV {self.kv_budget_tokens:,}" + " (derived)" * self.kv_budget_derived
        return (
            f"{self.trials} trials per scheduler (a smaller grid: every point), tuning seeds "
            f"{_seeds(self.seeds)}, workloads {', '.join(self.workloads)}, {self.tasks} tasks, "
            f"load {self.load:g} x best of {'/'.join(self.load_reference)}, {self.preset}, "
            f"{budget}, engine {self.engine}; objective: {self.objective}"
        )


@dataclass(frozen=True)
class Tuned:
    """One scheduler's tuning: the parameters found (non-default only), the scores of the
    defaults and of the tuned setting, the trials run and the grid searched."""

    scheduler: str
    params: Mapping[str, Any]
    default: Score
    tuned: Score
    trials: int
    grid_points: int
    grid: Mapping[str, tuple[Any, ...]]
    study: str


@dataclass(frozen=True)
class TunedSet:
    """A tuned file: its budget and one `Tuned` per scheduler tuned."""

    budget: Budget
    entries: Mapping[str, Tuned]
    source: str = "tuned parameters"

    def covers(self, name: str) -> bool:
        """Whether `name` was tuned, itself or (a TOPAS variant) through `topas`."""
        return name in self.entries or (_inherits(name) and "topas" in self.entries)

    def params_for(self, name: str) -> dict[str, Any]:
        """`name`'s tuned parameters, only those that differ from its defaults ({}: the
        defaults, also for a scheduler not tuned). A TOPAS ablation or variant without an
        entry of its own takes `topas`'s that it accepts."""
        if name in self.entries:
            return dict(self.entries[name].params)
        if _inherits(name) and "topas" in self.entries:
            base = make_policy(name).params
            got = self.entries["topas"].params
            return {k: v for k, v in got.items() if k in base and base[k] != v}
        return {}

    def is_tuned(self, name: str, params: Mapping[str, Any]) -> bool:
        """Whether a run of `name` with `params` runs its tuned setting: `name` is covered and
        `params`, defaults aside, are `params_for(name)` (also true of the defaults of a
        scheduler whose tuning kept them)."""
        if not self.covers(name):
            return False
        base = make_policy(name).params
        given = {k: v for k, v in params.items() if k not in base or base[k] != v}
        return given == self.params_for(name)

    def variants(self, schedulers: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The schedulers of `schedulers` whose tuned setting is not their default, with it:
        what a sweep or run with this file adds beside the defaults."""
        return {s: p for s in schedulers if (p := self.params_for(s))}

    def describe_budget(self) -> str:
        return self.budget.describe()

    def check_seeds(self, seeds: Iterable[int], where: str) -> None:
        """Refuse to evaluate tuned settings on the seeds they were tuned on."""
        both = sorted(set(seeds) & set(self.budget.seeds))
        if both:
            raise TopasError(
                f"{where}: seeds {both} are the tuning seeds of {self.source}; evaluate tuned "
                "settings on other seeds"
            )

    def merged(self, new: TunedSet) -> TunedSet:
        """This set with `new`'s entries added or replacing; both must share one budget."""
        if new.budget != self.budget:
            diff = [
                f"{f.name} {getattr(self.budget, f.name)!r} -> {getattr(new.budget, f.name)!r}"
                for f in fields(Budget)
                if getattr(self.budget, f.name) != getattr(new.budget, f.name)
            ]
            raise TopasError(
                f"{self.source} was tuned with another budget ({'; '.join(diff)}); its "
                "schedulers would not share one: tune into another --out, or delete it"
            )
        return TunedSet(self.budget, {**self.entries, **new.entries}, self.source)


def _inherits(name: str) -> bool:
    return name != "topas" and is_policy_class(name, Topas)


def _seeds(seeds: tuple[int, ...]) -> str:
    s = sorted(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ",".join(map(str, s))


# -- reading --------------------------------------------------------------------------------


def load_tuned(path: str | os.PathLike[str]) -> TunedSet:
    """The tuned file at `path`; a missing or malformed one is a one-line `TopasError`."""
    where = os.fspath(path)
    try:
        doc = tomllib.loads(Path(where).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TopasError(f"{where}: no such tuned file (`topas-bench tune` writes one)") from None
    except OSError as e:
        raise TopasError(f"{where}: cannot read the tuned file: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise TopasError(f"{where}: not a tuned file: invalid TOML ({e})") from None
    try:
        return _parse(doc, where)
    except _Bad as e:
        raise TopasError(f"{where}: not a tuned file: {e}") from None


class _Bad(Exception):
    """What is wrong, where (`at`: a table, or "" for the file's top level)."""


def _parse(doc: Mapping[str, Any], where: str) -> TunedSet:
    _keys(doc, {"budget", "schedulers"}, "", optional={"schedulers"})
    b = _table(doc, "budget", "")
    budget_keys = {f.name for f in fields(Budget)}
    _keys(b, budget_keys, "[budget]")
    budget = Budget(
        trials=_get(b, "trials", int, "[budget]"),
        seeds=tuple(_list(b, "seeds", int, "[budget]")),
        workloads=tuple(_list(b, "workloads", str, "[budget]")),
        tasks=_get(b, "tasks", int, "[budget]"),
        load=float(_get(b, "load", (int, float), "[budget]")),
        load_reference=tuple(_list(b, "load_reference", str, "[budget]")),
        preset=_get(b, "preset", str, "[budget]"),
        kv_budget_tokens=_get(b, "kv_budget_tokens", int, "[budget]"),
        kv_budget_derived=_get(b, "kv_budget_derived", bool, "[budget]"),
        engine=_get(b, "engine", str, "[budget]"),
        objective=_get(b, "objective", str, "[budget]"),
    )
    entries = {}
    for name, raw in _table({"schedulers": {}} | dict(doc), "schedulers", "").items():
        at = f"[schedulers.{name}]"
        if name not in SCHEDULERS:
            raise _Bad(f"{at}: unknown scheduler; known: {', '.join(SCHEDULERS.names())}")
        if not isinstance(raw, dict):
            raise _Bad(f"{at} must be a table")
        _keys(raw, {f.name for f in fields(Tuned)} - {"scheduler"}, at)
        params = {k: _from_toml(v) for k, v in _table(raw, "params", at).items()}
        try:
            make_policy(name, **params)
        except TopasError as e:
            raise _Bad(f"{at}.params: {e}") from None
        grid = {k: tuple(_from_toml(x) for x in _list(_table(raw, "grid", at), k, object, at))
                for k in _table(raw, "grid", at)}  # fmt: skip
        entries[name] = Tuned(
            scheduler=name, params=params, default=_score(raw, "default", at),
            tuned=_score(raw, "tuned", at), trials=_get(raw, "trials", int, at),
            grid_points=_get(raw, "grid_points", int, at), grid=grid,
            study=_get(raw, "study", str, at),
        )  # fmt: skip
    return TunedSet(budget, entries, where)


def _keys(
    table: Mapping[str, Any], known: set[str], at: str, optional: set[str] | None = None
) -> None:
    missing = sorted(known - set(table) - (optional or set()))
    unknown = sorted(set(table) - known)
    if unknown:
        raise _Bad(f"{_at(at)}unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if missing:
        raise _Bad(f"{_at(at)}`{missing[0]}` is missing")


def _at(at: str) -> str:
    return f"{at}: " if at else ""


def _table(table: Mapping[str, Any], key: str, at: str) -> dict[str, Any]:
    value = table.get(key)
    if not isinstance(value, dict):
        raise _Bad(f"{_at(at)}`{key}` must be a table")
    return value


def _get(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], at: str) -> Any:
    value = table.get(key)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise _Bad(f"{at}: `{key}` has a value of the wrong type: {value!r}")
    return value


def _list(table: Mapping[str, Any], key: str, kind: type, at: str) -> list[Any]:
    value = table.get(key)
    if not isinstance(value, list) or not all(
        isinstance(x, kind) and (kind is object or not isinstance(x, bool)) for x in value
    ):
        raise _Bad(f"{at}: `{key}` must be a list of {kind.__name__}s, got {value!r}")
    return value


def _score(table: Mapping[str, Any], key: str, at: str) -> Score:
    s = _table(table, key, at)
    _keys(s, {"objective", "mean_ratio", "p99_ratio"}, f"{at}.{key}")
    return Score(*(float(_get(s, k, (int, float), f"{at}.{key}"))
                   for k in ("objective", "mean_ratio", "p99_ratio")))  # fmt: skip


def _from_toml(value: Any) -> Any:
    return None if value == NULL else value


# -- writing --------------------------------------------------------------------------------


def dumps_tuned(tuned: TunedSet) -> str:
    """The file's text (module docstring): machine-readable, with a comment per scheduler."""
    b = tuned.budget
    lines = [
        "# Tuned parameters, written by `topas-bench tune` (src/topas_bench/tune/); read them",
        "# with topas_bench.tuned.load_tuned, or run them beside the defaults with `sweep",
        "# --tuned FILE` / the sweep file's `tuned` key. Every scheduler below had [budget].",
        f"# A null is written {json.dumps(NULL)} (TOML has none), as on the command line.",
        "",
        "[budget]",
    ]
    lines += [f"{f.name} = {_to_toml(getattr(b, f.name))}" for f in fields(Budget)]
    for name, t in sorted(tuned.entries.items()):
        at = f"schedulers.{_key(name)}"
        found = ", ".join(f"{k}={_to_toml(v)}" for k, v in t.params.items()) or "the defaults"
        new, old = t.tuned, t.default
        lines += [
            "",
            f"# {name}: {found}; objective {new.objective:.4f} (mean x{new.mean_ratio:.3f}, "
            f"p99 x{new.p99_ratio:.3f}) against the defaults' {old.objective:.4f} "
            f"(mean x{old.mean_ratio:.3f}, p99 x{old.p99_ratio:.3f}); "
            f"{t.trials} trials, {t.grid_points:,} grid points",
            f"[{at}]",
            f"trials = {t.trials}",
            f"grid_points = {t.grid_points}",
            f"study = {_to_toml(t.study)}",
        ]
        for key in ("default", "tuned"):
            s: Score = getattr(t, key)
            lines.append(
                f"{key} = {{ objective = {s.objective!r}, mean_ratio = {s.mean_ratio!r}, "
                f"p99_ratio = {s.p99_ratio!r} }}"
            )
        for sub, table in (("params", t.params), ("grid", t.grid)):
            lines += ["", f"[{at}.{sub}]"]
            lines += [f"{_key(k)} = {_to_toml(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_tuned(path: str | os.PathLike[str], tuned: TunedSet) -> None:
    """Write `tuned` to `path` whole (a temporary sibling renamed into place)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(dumps_tuned(tuned), encoding="utf-8")
    os.replace(tmp, target)


def _to_toml(value: Any) -> str:
    if value is None:
        return json.dumps(NULL)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_to_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to a tuned file")


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


__all__ = [
    "OBJECTIVE", "Budget", "Score", "Tuned", "TunedSet", "dumps_tuned", "load_tuned",
    "write_tuned",
]  # fmt: skip
