"""The trace format's fields and bounds, JSON rows onto the model (`Parser`), and the small
predicates every check shares (`bad_count`, `bad_secs`, ...: each the message of a problem, or
None). `check.Checker` names the problems; `fast` accepts clean rows fast."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload
from topas_bench.workloads.trace.errors import TraceProblem
from topas_bench.workloads.trace.read import show

SCHEMA = "topas-bench/trace"
VERSION = 1
HEADER = ("schema", "version", "name", "agents", "provenance")
AGENT = ("name", "prefix_tokens")
TASK = ("id", "workflow", "arrival_s", "stages")
STAGE = ("id", "agent", "kind", "prompt", "output_tokens", "max_new_tokens", "deps", "delay_s")
_STAGE_REQUIRED = ("id", "agent", "prompt", "output_tokens")

#: The latest time (s) a trace may give (`arrival_s`, `delay_s`), and a run's arrivals may reach:
#: about 31.7 years. A double still resolves 0.12 microseconds there; far beyond it, a call's
#: service time is lost in rounding (at 1e301 s, adding a minute changes nothing).
MAX_TIME_S = 1e9
#: The largest token count (a prompt segment, an output, a KV budget): int32's, far beyond any
#: model's context, and safe in the engines' int64 sums.
MAX_TOKENS = 2**31 - 1
_READS = f"this build reads version {VERSION}"
_HEAD = f'expected {{"schema": "{SCHEMA}", "version": {VERSION}, ...}}'

MISSING: Any = object()  # an absent field, which the checks report as "missing"


class Parser:
    """JSON onto the model, permissively: absent fields become `MISSING` and ill-typed values stay
    as they are, for `Checker` to report. Only what `Checker` cannot see is reported here."""

    def __init__(self) -> None:
        self.problems: list[TraceProblem] = []

    def fields(self, obj: dict[str, Any], known: Sequence[str], n: int, at: str) -> dict[str, Any]:
        for k in obj:
            if k not in known:
                self.problems.append(TraceProblem(n, join(at, name(k)), "unknown field"))
        return {k: obj.get(k, MISSING) for k in known}

    def header(self, n: int, h: Any) -> Workload | None:
        """The header's workload (no tasks), or None (reported) when the file is not a trace."""
        if not isinstance(h, dict):
            self.problems.append(TraceProblem(n, "header", bad("a JSON object", h)))
            return None
        schema, version = h.get("schema", MISSING), h.get("version", MISSING)
        if schema is MISSING and "stages" in h:
            fatal = ("header", f"the first line must be the trace header, not a task; {_HEAD}")
        elif schema != SCHEMA:
            fatal = ("header.schema", bad(repr(SCHEMA), schema))
        elif not is_int(version):
            fatal = ("header.version", bad("an integer", version))
        elif version != VERSION:
            fatal = ("header.version", f"unsupported trace version {version}; {_READS}")
        else:
            return self.workload(n, h)
        self.problems.append(TraceProblem(n, *fatal))
        return None

    def workload(self, n: int, h: dict[str, Any]) -> Workload:
        kw = self.fields(h, HEADER, n, "header")
        agents = kw["agents"]
        if isinstance(agents, list):
            agents = tuple(self.agent(n, i, a) for i, a in enumerate(agents))
        prov = kw["provenance"]  # keys other than generator, params and seed are ignored
        if not isinstance(prov, dict):
            self.problems.append(TraceProblem(n, "header.provenance", bad("an object", prov)))
            prov = {}
        params = prov.get("params", {})
        if not isinstance(params, dict):
            field = "header.provenance.params"
            self.problems.append(TraceProblem(n, field, bad("an object", params)))
            params = {}
        return Workload(kw["name"], agents, (), params, prov.get("seed"), prov.get("generator"))

    def agent(self, n: int, i: int, a: Any) -> Any:
        return (
            Agent(**self.fields(a, AGENT, n, f"header.agents[{i}]")) if isinstance(a, dict) else a
        )

    def task(self, n: int, obj: Any) -> Task | None:
        if not isinstance(obj, dict):
            self.problems.append(TraceProblem(n, "task", bad("a JSON object", obj)))
            return None
        kw = self.fields(obj, TASK, n, "")
        if isinstance(stages := kw["stages"], list):
            kw["stages"] = tuple(self.stage(n, i, s) for i, s in enumerate(stages))
        return Task(**{**kw, "arrival_s": _float(kw["arrival_s"])})

    def stage(self, n: int, i: int, s: Any) -> Any:
        if not isinstance(s, dict):
            return s
        kw = self.fields(s, STAGE, n, f"stages[{i}]")
        kw = {k: v for k, v in kw.items() if v is not MISSING or k in _STAGE_REQUIRED}
        if isinstance(kw["prompt"], list):
            kw["prompt"] = tuple(_segment(g) for g in kw["prompt"])
        if isinstance(kw.get("deps"), list):
            kw["deps"] = tuple(kw["deps"])
        if "delay_s" in kw:
            kw["delay_s"] = _float(kw["delay_s"])
        return Stage(**kw)


def _segment(g: Any) -> Any:
    return Segment(g[0], g[1]) if isinstance(g, list) and len(g) == 2 else g


def _float(v: Any) -> Any:
    """Seconds as a float; an invalid value stays as it is, so that problems quote it."""
    try:
        return float(v) if is_int(v) and v >= 0 else v
    except OverflowError:
        return math.inf


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def bad(expected: str, v: Any) -> str:
    return "missing" if v is MISSING else f"expected {expected}, got {show(v)}"


def bad_str(v: Any) -> str | None:
    return None if isinstance(v, str) else bad("a string", v)


def bad_name(v: Any) -> str | None:
    return None if isinstance(v, str) and v else bad("a non-empty string", v)


def bad_count(v: Any) -> str | None:
    if not (is_int(v) and v > 0):
        return bad("a positive integer", v)
    return None if v <= MAX_TOKENS else f"{show(v)} is more than {MAX_TOKENS:,} tokens"


def bad_secs(v: Any) -> str | None:
    ok = is_int(v) or (isinstance(v, float) and math.isfinite(v))
    if not (ok and v >= 0):
        return bad("a finite number of seconds >= 0", v)
    if v > MAX_TIME_S:
        return (
            f"{show(v)} s is past the limit of {MAX_TIME_S:g} s (31.7 years) a run's clock resolves"
        )
    return None


def label(obj: Any, i: int) -> str:
    sid = getattr(obj, "id", None)
    return name(sid) if isinstance(sid, str) and sid else f"#{i}"


def name(k: Any) -> str:
    """A user's key or id as a field path shows it: as it is if short and plain, else quoted."""
    plain = isinstance(k, str) and 0 < len(k) <= 60 and k.isprintable() and not set(k) & set(".[]")
    return k if plain else show(k)


def join(*parts: str) -> str:
    return ".".join(p for p in parts if p)
