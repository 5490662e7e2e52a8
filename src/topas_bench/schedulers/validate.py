"""A scheduler parameter's checks: unknown names and values out of range fail as
`InvalidParameter`, naming the valid ones, when the policy is built.

A policy declares its parameters once, on its class, in the order its errors and its `params`
list them (`Policy.__init__` checks and sets them; `Policy.params` reads them back)::

    class Kairos(OrderingPolicy):
        slot_s = number(0.5, 0.01, high=3600.0)
        bias_factor = number(1.0, high=2.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from topas_bench.errors import TopasError

T = TypeVar("T")


class InvalidParameter(TopasError):
    """A scheduler parameter outside its valid range."""


def reject_unknown(policy: str, params: Mapping[str, Any], valid: Sequence[str] = ()) -> None:
    """`InvalidParameter` naming the first of `params` not in `valid`, and the valid names."""
    unknown = sorted(set(params) - set(valid))
    if not unknown:
        return
    if not valid:
        raise InvalidParameter(
            f"scheduler {policy!r} takes no parameters (got {', '.join(unknown)})"
        )
    raise InvalidParameter(
        f"scheduler {policy!r}: unknown parameter {unknown[0]!r}; valid: {', '.join(valid)}"
    )


#: The largest number (`require_number`) and integer (`require_int`) a parameter takes unless
#: it says otherwise: far beyond any setting that means something, and small enough that a
#: policy's products of parameters, times and token counts stay finite (`topas.rho=1e308` made
#: numpy overflow).
MAX_NUMBER = 1e12
MAX_INT = 2**31 - 1


def require_number(
    policy: str,
    name: str,
    value: object,
    low: float = 0.0,
    *,
    strict: bool = False,
    high: float = MAX_NUMBER,
) -> float:
    """`value` as a finite number >= `low` (> `low` if `strict`) and <= `high`, else
    `InvalidParameter`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidParameter(f"{policy}: {name} must be a finite number, got {value!r}")
    if value < low or (strict and value == low):
        rng = f"({low:g}, inf)" if strict else f"[{low:g}, inf)"
        op = ">" if strict else ">="
        raise InvalidParameter(
            f"{policy}: {name} must be {op} {low:g} (valid range {rng}), got {value!r}"
        )
    _at_most(policy, name, value, high)
    return float(value)


def require_int(policy: str, name: str, value: object, low: int, high: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidParameter(f"{policy}: {name} must be an integer >= {low}, got {value!r}")
    _at_most(policy, name, value, high)
    return value


def _at_most(policy: str, name: str, value: int | float, high: float) -> None:
    if value > high:
        shown = f"{value:,}" if isinstance(value, int) and value < 10**15 else f"{value:.3g}"
        raise InvalidParameter(f"{policy}: {name} must be at most {high:,g}, got {shown}")


def require_bool(policy: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameter(f"{policy}: {name} must be true or false, got {value!r}")
    return value


class Param(Generic[T]):
    """A scheduler parameter declared on its policy class: its default and its check, called
    as ``check(policy, name, value)``. On an instance it reads as the checked value, which
    `Policy.__init__` stores there under the parameter's name."""

    def __init__(self, default: T, check: Callable[[str, str, Any], T]) -> None:
        self.default = default
        self.check = check
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Param[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object, owner: type | None = None) -> Param[T] | T:
        if obj is None:
            return self
        raise AttributeError(f"{type(obj).__name__}: parameter {self.name} was never set")


def declared(cls: type) -> dict[str, Param[Any]]:
    """The parameters `cls` declares (`Param`), its bases' first, each in declaration order."""
    out: dict[str, Param[Any]] = {}
    for klass in reversed(cls.__mro__):
        out.update((k, v) for k, v in vars(klass).items() if isinstance(v, Param))
    return out


def number(
    default: float,
    low: float = 0.0,
    *,
    strict: bool = False,
    high: float = MAX_NUMBER,
    as_given: bool = False,
) -> Param[float]:
    """A number parameter (`require_number`), stored as a float unless `as_given`: an int then
    stays an int (as autellix's run identities have always recorded it; `Param[float]` all
    the same, an int being a float to the type checker)."""

    def check(policy: str, name: str, value: Any) -> float:
        got = require_number(policy, name, value, low, strict=strict, high=high)
        return value if as_given else got

    return Param(default, check)


def integer(default: int, low: int, high: int = MAX_INT) -> Param[int]:
    """An integer parameter (`require_int`)."""
    return Param(default, lambda policy, name, value: require_int(policy, name, value, low, high))


def flag(default: bool) -> Param[bool]:
    """A true-or-false parameter (`require_bool`)."""
    return Param(default, require_bool)


def one_of(default: str, choices: Sequence[str]) -> Param[str]:
    """A parameter taking one of `choices`."""

    def check(policy: str, name: str, value: Any) -> str:
        if value not in choices:
            raise InvalidParameter(
                f"{policy}: {name} must be one of {', '.join(choices)}, got {value!r}"
            )
        return str(value)

    return Param(default, check)
