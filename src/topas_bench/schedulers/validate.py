"""A scheduler parameter's checks: unknown names and values out of range fail as
`InvalidParameter`, naming the valid ones, when the policy is built."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from topas_bench.errors import TopasError


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
