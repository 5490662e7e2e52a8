"""Schedulers from other packages: entry points in the group `topas_bench.schedulers`.

A distribution declares one entry point per scheduler, its name the scheduler's name, its value
`module:object`, where the object is a `Policy` subclass (the common case: as a built-in
registers its class) or a factory: a callable that takes the scheduler's parameters as keywords
and returns a fresh `Policy`, and that builds one with its defaults when called with none (the
registry reads the policy's class facts, `capabilities` and the simulator-only flags, from it).

Discovery reads the installed distributions' metadata once per process (`discovered`, cached),
without importing anything; an entry point's object is imported when its scheduler is first
used (`load`). A name that a built-in has, or two distributions share, is refused with one line
naming both; a plugin that fails to import is one line naming its distribution and the
exception, raised where it is used (`schedulers list` shows it as a note instead).

A plugin's cells record its distribution's name and version (`source`, in the identity's
`scheduler_source`), so a changed plugin's results are never reused as the old one's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.schedulers.base import Policy

#: The entry-point group a package declares its schedulers in.
GROUP = "topas_bench.schedulers"


class PluginError(TopasError):
    """A scheduler plugin that cannot be used: a name clash, an import failure, a bad object."""


@dataclass(frozen=True)
class Plugin:
    """An entry point of the group, as the metadata declares it (nothing imported)."""

    name: str
    distribution: str
    version: str
    value: str  # `module:object`
    entry_point: EntryPoint

    @property
    def source(self) -> dict[str, str]:
        """What a cell's identity records of the plugin (`RunIdentity.scheduler_source`)."""
        return {"distribution": self.distribution, "version": self.version}

    def describe(self) -> str:
        return f"{self.value} from {self.distribution} {self.version}"


@functools.cache
def discovered(builtins: frozenset[str]) -> dict[str, Plugin]:
    """The group's entry points by name, in name order; `PluginError` for a name that a
    built-in (in `builtins`) has or two distributions declare. Read once per process."""
    found: dict[str, Plugin] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        dist = ep.dist
        plugin = Plugin(
            name=ep.name,
            distribution=dist.metadata["Name"] if dist is not None else "?",
            version=dist.version if dist is not None else "?",
            value=ep.value,
            entry_point=ep,
        )
        if ep.name in builtins:
            raise PluginError(
                f"scheduler plugin {ep.name!r} ({plugin.describe()}) has the name of the "
                f"built-in scheduler {ep.name!r}; refused: rename its entry point in group {GROUP}"
            )
        if ep.name in found:
            raise PluginError(
                f"scheduler plugin {ep.name!r} is declared twice: {found[ep.name].describe()} "
                f"and {plugin.describe()}; refused: uninstall or rename one"
            )
        found[ep.name] = plugin
    return found


@functools.cache
def load(plugin: Plugin) -> Callable[..., Policy]:
    """The plugin's factory (its `Policy` subclass or its factory), imported once; a failure is
    one line naming the distribution and the exception (`PluginError`)."""
    try:
        obj = plugin.entry_point.load()
    except Exception as e:  # any failure of a foreign import is the plugin's, reported as such
        raise PluginError(
            f"scheduler plugin {plugin.name!r} ({plugin.describe()}) failed to import: "
            f"{type(e).__name__}: {_one_line(e)}"
        ) from None
    if isinstance(obj, type) and not issubclass(obj, Policy):
        raise PluginError(
            f"scheduler plugin {plugin.name!r} ({plugin.describe()}) is a class that is not a "
            "topas_bench Policy subclass"
        )
    if not callable(obj):
        raise PluginError(
            f"scheduler plugin {plugin.name!r} ({plugin.describe()}) is neither a Policy "
            f"subclass nor a factory (got {type(obj).__name__})"
        )
    return obj  # type: ignore[no-any-return]


def build(plugin: Plugin, params: dict[str, Any]) -> Policy:
    """A fresh policy from the plugin, named by its entry point (the name the engines and the
    SGLang plugin's log line use)."""
    policy = load(plugin)(**params)
    if not isinstance(policy, Policy):
        raise PluginError(
            f"scheduler plugin {plugin.name!r} ({plugin.describe()}) returned "
            f"{type(policy).__name__}, not a topas_bench Policy"
        )
    if policy.name != plugin.name:
        policy.name = plugin.name
    return policy


def policy_class(plugin: Plugin) -> type[Policy]:
    """The plugin's policy class: the object itself, or the class a factory builds with its
    defaults."""
    obj = load(plugin)
    return obj if isinstance(obj, type) else type(build(plugin, {}))


def note(plugin: Plugin) -> str | None:
    """Why the plugin cannot be used (the one line `load` raises), or None."""
    try:
        policy_class(plugin)
    except TopasError as e:
        return str(e)
    return None


def names(builtins: Collection[str]) -> list[str]:
    """The installed plugins' scheduler names."""
    return list(discovered(frozenset(builtins)))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:199] + "…"
