"""A workload family's parameters: overrides onto its frozen params dataclass (`parse_params`),
the checks its ``__post_init__`` runs (`check_params`), and the value checks the run parameters
share (`positive_int`, `number`). Here, not in `registry`, so that the registry and every
generator (the `trace` workload's too) import it without importing each other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads import lengths

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    P = TypeVar("P", bound=DataclassInstance)


def parse_params(
    workload: str, params_cls: type[P], overrides: Mapping[str, Any], extra: tuple[str, ...] = ()
) -> P:
    """`params_cls(**overrides)`, with one-line errors naming the parameter and the valid ones
    (with `extra`, those the caller took out of `overrides` before)."""
    valid = [f.name for f in fields(params_cls)]
    for key in overrides:
        if key not in valid:
            raise TopasError(
                f"workload {workload!r}: unknown parameter {key!r}; valid: "
                f"{', '.join([*valid, *extra])}"
            )
    try:
        return params_cls(**overrides)
    except TopasError as e:
        raise TopasError(f"workload {workload!r}: {e}") from None


def check_params(params: DataclassInstance) -> None:
    """Validate and normalise a frozen params dataclass in place (call from `__post_init__`).

    A field's kind is read from its default: an ``int`` is a positive token count; a
    ``tuple`` is an inclusive ``(low, high)`` token range, 0 < low <= high, which may also be
    given as a list or as one int (a fixed length); a ``float`` (a delay) is finite and >= 0.
    A ``max_tokens`` field (the client's length setting, `lengths`) is checked first.
    """
    if hasattr(params, lengths.MODE):
        lengths.check_mode(getattr(params, lengths.MODE))
    for f in fields(params):
        value = getattr(params, f.name)
        if isinstance(f.default, tuple):
            value = _token_range(f.name, value)
        elif isinstance(f.default, int):
            value = positive_int(None, f.name, value)
        elif isinstance(f.default, float):
            value = number(None, f.name, value, minimum=0.0)
        object.__setattr__(params, f.name, value)


def _where(workload: str | None) -> str:
    return f"workload {workload!r}: " if workload else ""


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def positive_int(workload: str | None, name: str, value: object, minimum: int = 1) -> int:
    if not _is_int(value) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise TopasError(f"{_where(workload)}{name} must be {what}, got {value!r}")
    return int(value)


def number(workload: str | None, name: str, value: object, minimum: float | None = None) -> float:
    """A finite number > 0, or >= `minimum` when given."""
    x = float(value) if _is_int(value) or isinstance(value, float | np.floating) else math.nan
    if not math.isfinite(x) or (x < minimum if minimum is not None else x <= 0):
        what = f"a number >= {minimum}" if minimum is not None else "a number > 0"
        raise TopasError(f"{_where(workload)}{name} must be {what}, got {value!r}")
    return x


def _token_range(name: str, value: object) -> tuple[int, int]:
    if _is_int(value):
        value = (value, value)
    if (
        not isinstance(value, tuple | list)
        or len(value) != 2
        or not all(_is_int(v) for v in value)
        or not 0 < value[0] <= value[1]
    ):
        raise TopasError(
            f"{name} must be a token range (low, high) with 0 < low <= high, got {value!r}"
        )
    return (int(value[0]), int(value[1]))
