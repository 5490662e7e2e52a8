"""What a sweep covers: schedulers x workloads x output scales x loads (or rates) x seeds x
presets x KV budgets.

Each group of the product is a run specification (`SweepSpec.runs`: a `spec.RunSpec`, as
`topas-bench run` takes), planned and run as `run` plans and runs its own.

A sweep comes from flags or a TOML file. The file's top-level keys are the settings; an
optional `[[sweep]]` array adds several sweeps that share them (each entry overrides the
top-level keys), e.g. a main comparison plus an ablation and a load curve:

    tasks = 60
    seeds = [0, 1]
    presets = ["a100-qwen32b"]

    [[sweep]]
    workloads = ["chain3", "dag4"]
    schedulers = "all"
    loads = [0.8]

    [[sweep]]
    workloads = ["chain3"]
    schedulers = ["topas", "topas-base"]
    loads = [0.5, 0.95]

    [scheduler_params.topas]
    beta = 0.2

Keys: workloads (registered names or trace files, docs/workload-format.md), schedulers (names or
groups as in `run --scheduler`: `all`, `baselines`, `ablations`, `peers-2026`, `everything`,
`fcfs,lpm`; a list is their union in order), seeds, loads or rates (never both; neither = each
workload's default rate), presets, kv_budgets (tokens, or "derived" for the preset's), tasks
(default: 200; a trace file: all of its), length_hint, host_tier_tokens, workload_params and
scheduler_params (tables keyed by workload / scheduler name), out. An unknown key, a value of
the wrong type or an unknown name is a `TopasError` naming the file and key.

The regime map's axes (`units`; docs/evaluation.md, "Regime map: how to run it"):
`kv_budget_multiples` (instead of kv_budgets: multiples of each workload's agent-prefix working
set, numbers or "one-agent"; m -> ceil(m x W) + C tokens, `units.WorkingSet`), `output_scales`
(every call's output times each, the workload parameter `output_scale`; 1 = as generated) and
`load_reference` (the schedulers, names or groups, whose best saturation rate a load is a
fraction of; default FCFS, the measured capacity; needs `loads`).

Tuned settings (`tune`, docs/topas.md "Tuning every scheduler"): `tuned` names a tuned file
(`OUT/tuned.toml` of `topas-bench tune`; a relative path is read from the sweep file's
directory). Every group then also runs each of its schedulers whose tuned setting is not its
default (`TunedSet.params_for`; a TOPAS ablation inherits TOPAS's), with that setting, beside
the default one: on the same workload sample, as `name[k=v,...]` in reports. Evaluation seeds
must not be the file's tuning seeds, and a scheduler it tunes takes no `scheduler_params`.
`tuned_only = true` runs the tuned variants instead of the defaults (a scheduler whose tuning
kept its defaults runs them): each scheduler once, in its tuned form, where a grid is too large
to run both (the regime map).

Clusters (docs/cluster.md): `replicas` (replica counts; absent = one server, no router) and
`routers` (router names, default sglang-router's `cache-aware`; needs `replicas`) are two more
dimensions, `router_params` their parameters (tables keyed by router name). A load, and the
default rate, are per replica: a group of N replicas gets N times the single server's rate;
`tasks_per_replica = true` scales the task count with N too (`tasks` per replica).
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError, not_utf8
from topas_bench.runners.cluster.config import ClusterConfig
from topas_bench.runners.sim.config import LengthHint, SimOptions
from topas_bench.spec import DEFAULT_LOAD_REFERENCE, DEFAULT_PRESET, RunSpec, parse_schedulers
from topas_bench.tuned import TunedSet, load_tuned
from topas_bench.units import ONE_AGENT, Multiple, check_multiple, working_set
from topas_bench.workloads.registry import OUTPUT_SCALE, run_defaults

KEYS = (
    "workloads", "schedulers", "seeds", "loads", "rates", "presets", "kv_budgets", "tasks",
    "length_hint", "host_tier_tokens", "workload_params", "scheduler_params", "out",
    "replicas", "routers", "router_params", "tasks_per_replica", "kv_budget_multiples",
    "output_scales", "load_reference", "tuned", "tuned_only",
)  # fmt: skip


@dataclass(frozen=True)
class SweepSpec:
    workloads: tuple[str, ...]
    schedulers: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    loads: tuple[float, ...] = ()
    rates: tuple[float, ...] = ()
    presets: tuple[str, ...] = (DEFAULT_PRESET,)
    kv_budgets: tuple[int | None, ...] = (None,)
    num_tasks: int | None = None  # None: each workload's default (200; a trace file: all)
    length_hint: LengthHint = "none"
    host_tier_tokens: int = 0
    workload_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    scheduler_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    replicas: tuple[int, ...] = ()
    routers: tuple[str, ...] = ()
    router_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tasks_per_replica: bool = False
    kv_budget_multiples: tuple[Multiple, ...] = ()
    output_scales: tuple[float, ...] = (1.0,)
    load_reference: tuple[str, ...] = DEFAULT_LOAD_REFERENCE
    #: A tuned file's settings, run beside the defaults (module docstring); None: none.
    tuned: TunedSet | None = None
    #: run the tuned variants instead of the defaults, not beside them
    tuned_only: bool = False

    def __post_init__(self) -> None:
        for name in ("workloads", "schedulers", "seeds", "presets", "kv_budgets", "output_scales",
                     "load_reference"):  # fmt: skip
            values = getattr(self, name)
            if not values:
                raise TopasError(f"sweep: `{name}` is empty")
            if len(set(values)) != len(values):
                raise TopasError(f"sweep: `{name}` lists a value twice: {list(values)}")
        multiples = list(self.kv_budget_multiples)
        if len(set(multiples)) != len(multiples):
            raise TopasError(f"sweep: `kv_budget_multiples` lists a value twice: {multiples}")
        for m in self.kv_budget_multiples:
            try:
                check_multiple(m)
            except TopasError as e:
                raise TopasError(f"sweep: `kv_budget_multiples`: {e}") from None
        if self.kv_budget_multiples and self.kv_budgets != (None,):
            raise TopasError("sweep: give either kv_budgets or kv_budget_multiples, not both")
        if any(not (0 < x < float("inf")) for x in self.output_scales):
            raise TopasError("sweep: `output_scales` must be positive numbers")
        given_scale = [w for w, p in self.workload_params.items() if OUTPUT_SCALE in p]
        if given_scale and self.output_scales != (1.0,):
            raise TopasError(f"sweep: `workload_params` of {given_scale[0]!r} sets "
                             f"{OUTPUT_SCALE}, which `output_scales` sets")  # fmt: skip
        if self.load_reference != DEFAULT_LOAD_REFERENCE and not self.loads:
            raise TopasError("sweep: `load_reference` needs `loads`")
        if self.loads and self.rates:
            raise TopasError("sweep: give either loads or rates, not both")
        for name in ("loads", "rates"):
            if any(not (v > 0 and v != float("inf")) for v in getattr(self, name)):
                raise TopasError(f"sweep: `{name}` must be positive numbers")
        if any(s < 0 for s in self.seeds):
            raise TopasError("sweep: `seeds` must be >= 0")
        if any(b is not None and b < 1 for b in self.kv_budgets):
            raise TopasError("sweep: `kv_budgets` must be positive token counts or 'derived'")
        if self.num_tasks is not None and self.num_tasks < 1:
            raise TopasError(f"sweep: `tasks` must be a positive integer, got {self.num_tasks}")
        if self.host_tier_tokens < 0:
            raise TopasError("sweep: `host_tier_tokens` must be >= 0")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.replicas):
            raise TopasError("sweep: `replicas` must be positive integers")
        for name in ("replicas", "routers"):
            if len(set(getattr(self, name))) != len(getattr(self, name)):
                raise TopasError(
                    f"sweep: `{name}` lists a value twice: {list(getattr(self, name))}"
                )
        if (self.routers or self.router_params or self.tasks_per_replica) and not self.replicas:
            raise TopasError(
                "sweep: `routers`, `router_params` and `tasks_per_replica` need `replicas`"
            )
        for key, names in (("workload_params", self.workloads),
                           ("scheduler_params", self.schedulers),
                           ("router_params", self.cluster_routers())):  # fmt: skip
            extra = sorted(set(getattr(self, key)) - set(names))
            if extra:
                raise TopasError(f"sweep: `{key}` for {extra[0]!r}, which is not in this sweep")
        if self.tuned_only and self.tuned is None:
            raise TopasError("sweep: `tuned_only` needs `tuned` (a tuned file)")
        if self.tuned is not None:
            self.tuned.check_seeds(self.seeds, "sweep")
            both = sorted(set(self.tuned.variants(self.schedulers)) & set(self.scheduler_params))
            if both:
                raise TopasError(
                    f"sweep: `scheduler_params` for {both[0]!r}, which {self.tuned.source} "
                    "tunes: give one or the other"
                )

    def runs(self, out: Path) -> list[RunSpec]:
        """Every group of the sweep (workload x output scale x preset x budget x load or rate x
        cluster x seed, in that nesting) as the run of all its schedulers on one workload
        sample, followed, with `tuned`, by the run of the group's tuned variants (the same
        group but for its schedulers and their parameters: `run_sweep` plans it on the same
        sample). A group's tasks: `tasks` (or the workload's default), times the replicas with
        `tasks_per_replica` (the default is read from a trace file). Budget multiples become
        tokens per workload and output scale (`units.working_set`, which samples the
        workload)."""
        levels: list[tuple[float | None, float | None]] = (
            [(x, None) for x in self.loads] or [(None, x) for x in self.rates] or [(None, None)]
        )
        clusters: list[ClusterConfig | None] = [
            ClusterConfig(n, r, self.router_params.get(r, {}))
            for n in self.replicas
            for r in self.cluster_routers()
        ] or [None]
        engine = SimOptions(self.length_hint, self.host_tier_tokens)

        def tasks(workload: str, cluster: ClusterConfig | None) -> int | None:
            if not (self.tasks_per_replica and cluster is not None):
                return self.num_tasks
            params = self.workload_params.get(workload, {})
            return (self.num_tasks or run_defaults(workload, params)[0]) * cluster.replicas

        def budgets(workload: str, params: Mapping[str, Any]) -> list[int | None]:
            if not self.kv_budget_multiples:
                return list(self.kv_budgets)
            ws = working_set(workload, params)
            return list(dict.fromkeys(ws.budget_tokens(m) for m in self.kv_budget_multiples))

        variants = self.tuned.variants(self.schedulers) if self.tuned is not None else {}
        base = self.schedulers
        if self.tuned_only:
            base = tuple(s for s in self.schedulers if s not in variants)
        runs = []
        for w, x in itertools.product(self.workloads, self.output_scales):
            params = dict(self.workload_params.get(w, {}))
            if x != 1.0:  # x1 keeps the identities of cells made without the parameter
                params[OUTPUT_SCALE] = int(x) if x.is_integer() else x  # as a flag gives 2
            for p, b, (load, rate), c, s in itertools.product(
                self.presets, budgets(w, params), levels, clusters, self.seeds
            ):
                run = RunSpec(
                    workload=w, schedulers=base or tuple(variants), num_tasks=tasks(w, c), seed=s,
                    rate_per_s=rate, load=load, load_reference=self.load_reference, preset=p,
                    kv_budget_tokens=b, workload_params=params,
                    scheduler_params=self.scheduler_params, cluster=c, engine=engine, out=out,
                )  # fmt: skip
                if base:
                    runs.append(run)
                if variants:
                    runs.append(replace(run, schedulers=tuple(variants),
                                        scheduler_params=variants))  # fmt: skip
        return runs

    def cluster_routers(self) -> tuple[str, ...]:
        """The routers of the sweep's clusters (sglang-router's default when none is named)."""
        from topas_bench.runners.cluster.routers import DEFAULT_ROUTER

        return self.routers or ((DEFAULT_ROUTER,) if self.replicas else ())


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise TopasError(f"{path}: cannot read sweep file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:  # before TOMLDecodeError: both are ValueErrors
        raise TopasError(f"{path}: not a sweep file: {not_utf8(e)}") from None
    except tomllib.TOMLDecodeError as e:
        raise TopasError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise TopasError(f"{path}: invalid TOML: nested too deeply") from None


def load_specs(
    doc: Mapping[str, Any], flags: Mapping[str, Any], source: str, base: Path | None = None
) -> list[tuple[SweepSpec, Any]]:
    """The sweeps of a parsed TOML document, flags overriding it; each with its `out` or None.
    `base`: the document's directory, which its relative `tuned` paths are read from (a
    flag's are the working directory's).

    Flags that were given (not None) override the file's top-level keys and every `[[sweep]]`
    entry; a `loads` flag replaces the file's `rates` and vice versa (`rates` drop its
    `load_reference` too), `kv_budgets` its `kv_budget_multiples` and vice versa, and a
    `workloads` flag drops the file's `workload_params` of workloads it leaves out."""
    given = {k: v for k, v in flags.items() if v is not None}
    top = _located({k: v for k, v in doc.items() if k != "sweep"}, base)
    entries = doc.get("sweep", [{}])
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(e, dict) for e in entries)
    ):
        raise TopasError(f"{source}: `sweep` must be an array of tables ([[sweep]])")
    specs = []
    tuned: dict[str, TunedSet] = {}  # each file read once
    for entry in entries:
        merged = top | _located(entry, base)
        for a, b in (("loads", "rates"), ("rates", "loads"), ("kv_budgets", "kv_budget_multiples"),
                     ("kv_budget_multiples", "kv_budgets")):  # fmt: skip
            if a in given:
                merged.pop(b, None)
        if "rates" in given and "load_reference" not in given:
            merged.pop("load_reference", None)  # rates have no reference
        params = merged.get("workload_params")
        if "workloads" in given and isinstance(params, dict):
            names = given["workloads"]
            kept = set(names) if isinstance(names, list | tuple) else {names}
            merged["workload_params"] = {k: v for k, v in params.items() if k in kept}
        specs.append(_spec(merged | given, source, tuned))
    return specs


def _located(table: Mapping[str, Any], base: Path | None) -> dict[str, Any]:
    """`table` with a relative `tuned` path made relative to `base` (the file's directory)."""
    out = dict(table)
    path = out.get("tuned")
    if base is not None and isinstance(path, str) and not Path(path).is_absolute():
        out["tuned"] = str(base / path)
    return out


def _spec(
    raw: Mapping[str, Any], source: str, tuned: dict[str, TunedSet] | None = None
) -> tuple[SweepSpec, Any]:
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise TopasError(f"{source}: unknown key {unknown[0]!r}; known: {', '.join(KEYS)}")
    if "workloads" not in raw:
        raise TopasError(f"{source}: `workloads` is missing")
    schedulers = _schedulers(source, "schedulers", raw.get("schedulers", "all"))
    reference = DEFAULT_LOAD_REFERENCE
    if "load_reference" in raw:
        reference = _schedulers(source, "load_reference", raw["load_reference"])
    multiples = _list(source, "kv_budget_multiples", raw.get("kv_budget_multiples", []),
                      (int, float, str))  # fmt: skip
    scales = _list(source, "output_scales", raw.get("output_scales", [1.0]), (int, float))
    for m in multiples:
        if isinstance(m, str) and m != ONE_AGENT:
            raise TopasError(f"{source}: `kv_budget_multiples` takes positive numbers or "
                             f"{ONE_AGENT!r}, got {m!r}")  # fmt: skip
    kv = [None if b == "derived" else b for b in _list(source, "kv_budgets",
          raw.get("kv_budgets", ["derived"]), (int, str))]  # fmt: skip
    if any(isinstance(b, str) for b in kv):
        raise TopasError(f"{source}: `kv_budgets` takes token counts or 'derived'")
    tuned_set = None
    if "tuned" in raw:
        path = _scalar(source, "tuned", raw["tuned"], str)
        cache = {} if tuned is None else tuned
        tuned_set = cache[path] = cache.get(path) or load_tuned(path)
    hint = raw.get("length_hint", "none")
    if hint not in ("none", "oracle"):
        raise TopasError(f"{source}: `length_hint` must be 'none' or 'oracle', got {hint!r}")
    spec = SweepSpec(
        workloads=tuple(_list(source, "workloads", raw["workloads"], str)),
        schedulers=schedulers,
        seeds=tuple(_list(source, "seeds", raw.get("seeds", [0]), int)),
        loads=tuple(float(x) for x in _list(source, "loads", raw.get("loads", []), (int, float))),
        rates=tuple(float(x) for x in _list(source, "rates", raw.get("rates", []), (int, float))),
        presets=tuple(_list(source, "presets", raw.get("presets", [DEFAULT_PRESET]), str)),
        kv_budgets=tuple(kv),
        num_tasks=_scalar(source, "tasks", raw["tasks"], int) if "tasks" in raw else None,
        length_hint="oracle" if hint == "oracle" else "none",
        host_tier_tokens=_scalar(source, "host_tier_tokens", raw.get("host_tier_tokens", 0), int),
        workload_params=_tables(source, "workload_params", raw.get("workload_params", {})),
        scheduler_params=_tables(source, "scheduler_params", raw.get("scheduler_params", {})),
        replicas=tuple(_list(source, "replicas", raw.get("replicas", []), int)),
        routers=tuple(_routers(source, raw.get("routers", []))),
        router_params=_tables(source, "router_params", raw.get("router_params", {})),
        tasks_per_replica=_scalar(
            source, "tasks_per_replica", raw.get("tasks_per_replica", False), bool
        ),
        kv_budget_multiples=tuple(m if isinstance(m, str) else float(m) for m in multiples),
        output_scales=tuple(float(x) for x in scales),
        load_reference=reference,
        tuned=tuned_set,
        tuned_only=_scalar(source, "tuned_only", raw.get("tuned_only", False), bool),
    )
    out = raw.get("out")
    if out is not None and not isinstance(out, str):
        raise TopasError(f"{source}: `out` must be a path string")
    return spec, out


def _schedulers(source: str, key: str, value: Any) -> tuple[str, ...]:
    """Scheduler names and groups (a list, or comma-separated), expanded in order, each once."""
    names: list[str] = []
    for item in _list(source, key, value, str):
        for part in item.split(",") or [""]:  # groups expand in place: "baselines,topas"
            try:
                names += [n for n in parse_schedulers(part) if n not in names]
            except TopasError as e:
                raise TopasError(f"{source}: `{key}`: {e}") from None
    return tuple(names)


def _routers(source: str, value: Any) -> list[str]:
    """Router names (a list, or comma-separated as on the command line), each checked."""
    from topas_bench.runners.cluster.routers import ROUTERS

    names = [n.strip() for item in _list(source, "routers", value, str) for n in item.split(",")]
    for name in names:
        if name not in ROUTERS:
            raise TopasError(f"{source}: `routers`: unknown router {name!r}; known: "
                             f"{', '.join(ROUTERS.names())}")  # fmt: skip
    return names


def _list(source: str, key: str, value: Any, kind: type | tuple[type, ...]) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    for item in items:
        # bool is an int subclass; TOML's `true` is never a seed or a budget.
        if isinstance(item, bool) or not isinstance(item, kind):
            raise TopasError(f"{source}: `{key}` has a value of the wrong type: {item!r}")
    return items


def _scalar(source: str, key: str, value: Any, kind: type) -> Any:
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise TopasError(f"{source}: `{key}` must be {kind.__name__}, got {value!r}")
    return value


def _tables(source: str, key: str, value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise TopasError(f"{source}: `{key}` must be tables keyed by name ([{key}.NAME])")
    return {k: dict(v) for k, v in value.items()}


#: The most values one list flag takes (`--seeds 0-99999`): more is a typo, not a sweep.
MAX_LIST = 100_000


def parse_list(text: str, flag: str, kind: type[int] | type[float]) -> list[Any]:
    """A flag's comma-separated values; integer flags also take ranges `a-b` (inclusive); at
    most `MAX_LIST` values."""
    items: list[Any] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            if kind is int and "-" in part[1:]:
                lo, hi = (int(x) for x in part.split("-", 1))
                if (total := len(items) + max(hi - lo + 1, 0)) > MAX_LIST:
                    alone = f" ({part[:60]} alone is {hi - lo + 1:,})" if items else ""
                    raise TopasError(
                        f"{flag}: {total:,} values{alone}; a list takes at most {MAX_LIST:,}"
                    )
                items.extend(range(lo, hi + 1))
            elif part:
                items.append(kind(part))
        except ValueError:
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise TopasError(f"{flag}: not a list of {kind.__name__}s: {shown!r}") from None
        if len(items) > MAX_LIST:
            raise TopasError(f"{flag}: more than {MAX_LIST:,} values")
    if not items:
        raise TopasError(f"{flag} is empty")
    return items


__all__: Sequence[str] = ("SweepSpec", "load_specs", "parse_list", "read_toml")
