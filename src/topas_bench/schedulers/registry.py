"""The scheduler registry: name -> what builds the policy (a policy class, or a row of SGLang's
stock table, `sglang_stock.STOCK`). Adding a policy = one file + one line here; a policy from
another package = an entry point in group `topas_bench.schedulers` (`schedulers.plugins`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from topas_bench.errors import TopasError, UnknownNameError
from topas_bench.registry import Registry
from topas_bench.schedulers import plugins
from topas_bench.schedulers.astraea import Astraea, AstraeaOracle
from topas_bench.schedulers.autellix import Autellix
from topas_bench.schedulers.base import Capabilities, Policy, sim_only_error
from topas_bench.schedulers.cachesage import CacheSage
from topas_bench.schedulers.continuum import Continuum
from topas_bench.schedulers.fcfs import FCFS
from topas_bench.schedulers.kairos import Kairos
from topas_bench.schedulers.kvflow import KVFlow
from topas_bench.schedulers.lpm import LPM
from topas_bench.schedulers.lpm_aging import LPMAging
from topas_bench.schedulers.parrot import ParrotFCFS
from topas_bench.schedulers.sglang_stock import STOCK, Stock, StockRow
from topas_bench.schedulers.sglang_ttl import SglangTTL
from topas_bench.schedulers.spf import SPF
from topas_bench.schedulers.tokencake import TokenCake
from topas_bench.schedulers.topas import policy as topas
from topas_bench.schedulers.validate import reject_unknown

#: A policy class, or a `StockRow`: called with a scheduler's parameters, a fresh policy.
PolicyFactory = Callable[..., Policy]


class SchedulerRegistry(Registry[PolicyFactory]):
    """The built-in schedulers, then the installed plugins' (`schedulers.plugins`), found when
    a name is first looked up or listed. A plugin's name never shadows a built-in's: the
    clash is refused (`plugins.discovered`)."""

    def builtin_names(self) -> list[str]:
        """The built-in schedulers alone: what the groups (`everything` too) are made of, so
        that what is installed never changes what a committed sweep runs."""
        return list(self._items)

    def plugin(self, name: str) -> plugins.Plugin | None:
        """The installed plugin of that name, or None (a built-in, or unknown)."""
        found = plugins.discovered(frozenset(self._items))
        return None if name in self._items else found.get(name)

    def get(self, name: str) -> PolicyFactory:
        plugin = self.plugin(name)
        if plugin is not None:
            return plugins.load(plugin)  # imported here, at first use
        if name not in self._items:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {', '.join(self)}")
        return self._items[name]

    def plugin_names(self) -> list[str]:
        """The installed plugins' schedulers (the group `plugins`)."""
        return plugins.names(self._items)

    def names(self) -> list[str]:
        return [*self._items, *self.plugin_names()]

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


SCHEDULERS = SchedulerRegistry("scheduler")
SCHEDULERS.add("fcfs", FCFS)
SCHEDULERS.add("lpm", LPM)
SCHEDULERS.add("spf", SPF)
SCHEDULERS.add("parrot", ParrotFCFS)
SCHEDULERS.add("autellix", Autellix)
SCHEDULERS.add("topas", topas.Topas)
SCHEDULERS.add("topas-base", topas.TopasBase)
SCHEDULERS.add("topas-no-reuse", topas.TopasNoReuse)
SCHEDULERS.add("topas-no-aging", topas.TopasNoAging)
SCHEDULERS.add("topas-no-joint", topas.TopasNoJoint)
SCHEDULERS.add("topas-no-pins", topas.TopasNoPins)
SCHEDULERS.add("topas-no-move-stall", topas.TopasNoMoveStall)
SCHEDULERS.add("topas-no-preempt", topas.TopasNoPreempt)
SCHEDULERS.add("topas-prev-score", topas.TopasPrevScore)
SCHEDULERS.add("topas-expected-path", topas.TopasExpectedPath)
SCHEDULERS.add("kvflow", KVFlow)
SCHEDULERS.add("continuum", Continuum)
SCHEDULERS.add("lpm-aging", LPMAging)
SCHEDULERS.add("tokencake", TokenCake)
SCHEDULERS.add("astraea", Astraea)
SCHEDULERS.add("astraea-oracle", AstraeaOracle)
SCHEDULERS.add("cachesage", CacheSage)
SCHEDULERS.add("sglang-ttl", SglangTTL)
SCHEDULERS.add("kairos", Kairos)
for _row in STOCK:
    SCHEDULERS.add(_row.name, _row)

#: The paper's baselines, in the order tables show them.
BASELINES = ("fcfs", "lpm", "spf", "parrot", "autellix")
#: SGLang 0.5.23's own choices beyond `fcfs` and `lpm` (`sglang_stock`), in groups. Not
#: `shortest-prefill-first`: its chunk cap runs SGLang out of memory on metagpt-tl (a crash,
#: in both engines), so a group with it would stop a sweep; it runs by name.
SGLANG_STOCK = (
    "dfs-weight", "lof", "random", "hrrn", "routing-key", "lpm-slru", "lpm-lfu", "lpm-priority",
)  # fmt: skip
#: The agent-aware schedulers of 2025-26 (issue 32, docs/schedulers.md): the ones that run on
#: every engine join `peers`; `astraea-oracle` (true output lengths) and `sglang-ttl` (refresh
#: on a hit) are simulator-only, so they run by name or in the group `peers-2026`.
PEERS_2026 = ("tokencake", "astraea", "cachesage", "kairos", "sglang-ttl", "astraea-oracle")
#: The peers the paper left out: systems that decide what to keep, and stock SGLang.
PEERS = (
    "kvflow", "continuum", "lpm-aging", "tokencake", "astraea", "cachesage", "kairos",
    *SGLANG_STOCK,
)  # fmt: skip
#: Registered and run by name, in no group, and why (`topas-bench schedulers list` says it).
UNGROUPED = {
    "topas-expected-path": "a variant, not an ablation: the paper's E[LP(Z)] for L_i, equal to "
    "the default LP(E[Z]) on chains and fixed-length stages (docs/evaluation.md)",
    "shortest-prefill-first": "its chunk cap runs SGLang 0.5.23 out of memory on metagpt-tl "
    "(a crash in both engines), so a group with it would stop a sweep (docs/schedulers.md)",
}
#: TOPAS's ablations (docs/design.md section 5).
ABLATIONS = (
    "topas-base", "topas-no-reuse", "topas-no-aging", "topas-no-joint", "topas-no-pins",
    "topas-no-move-stall", "topas-no-preempt", "topas-prev-score",
)  # fmt: skip


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy instance; unknown names list the known ones, bad params name the field."""
    factory = SCHEDULERS.get(name)
    signature = inspect.signature(factory).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in signature):  # else the factory checks **params
        reject_unknown(name, params, [p.name for p in signature])
    plugin = SCHEDULERS.plugin(name)
    return factory(**params) if plugin is None else plugins.build(plugin, params)


def summary(name: str) -> str:
    """A registered scheduler's description: its docstring's first paragraph, on one line."""
    factory = SCHEDULERS.get(name)
    doc = factory.summary if isinstance(factory, StockRow) else factory.__doc__
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def role(name: str) -> str:
    """The group `topas-bench schedulers list` shows: `paper` (a baseline or `topas`),
    `ablation`, `peer`, `plugin` (from another package), or `by name` (in `UNGROUPED`, which
    says why)."""
    if name in BASELINES or name == "topas":
        return "paper"
    if name in ABLATIONS:
        return "ablation"
    if name in (*PEERS, *PEERS_2026):
        return "peer"
    if SCHEDULERS.plugin(name) is not None:
        return "plugin"
    return "by name" if name in UNGROUPED else ""


def policy_class(name: str) -> type[Policy]:
    """The class of the policies `name` builds: its registered class, `Stock` for a row of
    SGLang's stock table, a plugin's class (or the class its factory builds)."""
    plugin = SCHEDULERS.plugin(name)
    if plugin is not None:
        return plugins.policy_class(plugin)
    factory = SCHEDULERS.get(name)
    cls = Stock if isinstance(factory, StockRow) else factory
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise TypeError(f"scheduler {name!r} is registered as {factory!r}, not a policy class")
    return cls


def capabilities(name: str) -> Capabilities:
    """What a registered scheduler may do beyond ordering the queue (`base.Capabilities`): a
    fact of its class (`policy_class`)."""
    return policy_class(name).capabilities


def refuse_sim_only(schedulers: tuple[str, ...], engine: str) -> None:
    """`TopasError` naming the first of `schedulers` that needs what only the simulator has
    (`sim_only_error`)."""
    for name in schedulers:
        error = sim_only_error(policy_class(name), name, engine)
        if error is not None:
            raise TopasError(error)


def source(name: str) -> dict[str, str]:
    """What a cell's identity records of where the scheduler comes from: a plugin's
    distribution and version; nothing for a built-in (whose identities stay as they were)."""
    plugin = SCHEDULERS.plugin(name)
    return {} if plugin is None else plugin.source


def is_policy_class(name: str, base: type[Policy]) -> bool:
    """Whether `name` is registered as `base` or a subclass of it."""
    factory = SCHEDULERS.get(name)
    return isinstance(factory, type) and issubclass(factory, base)
