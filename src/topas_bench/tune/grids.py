"""Every tunable scheduler's search grid, declared once (`GRIDS`), and the points a grid spans.

A grid maps each parameter searched to the values tried; every value is one the scheduler
accepts, and its default is among them, so a study can start from the defaults
(tests/test_tune.py checks both). Values sit around the published default on the parameter's
own scale (factors of 2 to 4 either side, or every choice of a switch); where each grid comes
from: docs/topas.md, "Tuning every scheduler". A scheduler is tunable when it has a grid; what
is not searched stays at its default (`random`'s `seed` is a shuffle's seed, not a knob).

A point is one value per parameter. Some parameters act only beside a value of another
(`ONLY_WITH`: SGLang's slru protected threshold only under slru eviction): a point that sets
one without it is the same policy as the point with the default there, so `canonical` folds
it, and a grid's size counts distinct policies.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import SCHEDULERS, is_policy_class, make_policy
from topas_bench.schedulers.topas import Topas

#: Parameter -> the values tried.
Grid = Mapping[str, tuple[Any, ...]]

#: TOPAS's search space: the one-parameter-at-a-time variations that set its defaults on the
#: tuning seeds (docs/topas.md, "Parameters"), the paper's score forms and our own.
TOPAS_GRID: dict[str, tuple[Any, ...]] = {
    "preempt_margin_s": (2.0, 5.0, 10.0, 20.0, 40.0),
    "beta": (0.0, 0.25, 0.5, 1.0),
    "horizon_s": (None, 5.0, 10.0, 30.0),
    "srpt_exponent": (0.0, 0.5, 1.0, 2.0),
    "rho": (0.0, 0.5, 1.0, 2.0),
    "h_age_mult": (0.5, 1.0, 2.0, 4.0),
    "max_actions": (2, 4, 8, 16),
    "move_charge": ("admitted", "affected", "running"),
    "reuse_users": ("next", "all"),
    "starvation_mult": (0.0, 2.0, 4.0, 8.0),
    "density": (False, True),
}
#: SGLang's radix eviction policies (`--radix-eviction-policy`) and the slru protected
#: threshold (`--radix-eviction-policy-config`, default 2), for the stock rows that take them.
EVICTION_GRID: dict[str, tuple[Any, ...]] = {
    "eviction": ("lru", "lfu", "slru", "priority"),
    "slru_protected_threshold": (1, 2, 4),
}

#: Astraea's level-0 quota and aging (ours: 2,048 tokens, 30 s), for it and its oracle variant.
ASTRAEA_GRID: dict[str, tuple[Any, ...]] = {
    "base_quota_tokens": (512, 2048, 8192),
    "aging_s": (5.0, 30.0, 120.0),
}
GRIDS: dict[str, Grid] = {
    "topas": TOPAS_GRID,
    # SGLang's constants (WAITING_QUEUE_PREFIX_MATCH_MAX 128, the in-batch thresholds 32): the
    # queue length above which it stops matching, and the token thresholds of in-batch caching
    "lpm": {
        "fallback_above": (64, 128, 256, 1024),
        "in_batch_check_tokens": (0, 32, 256),
        "in_batch_deprioritize_tokens": (32, 256),
    },
    # Autellix's quantum (first level's attained service), level count and starvation ratio
    "autellix": {
        "quantum_s": (0.5, 2.0, 8.0),
        "levels": (4, 8, 12),
        "starvation_ratio": (1.0, 2.0, 4.0),
    },
    # KVFlow's `evict_pri_level` (its server default 4; at least 2). `prefetch_steps` is not
    # searched: it loads from the host tier, which tuning runs have none of
    "kvflow": {"hold_steps": (2, 3, 4, 6, 8)},
    # the exchange rate of pinned memory against job time (ours, 1.0); 0 = memory is free
    "continuum": {"memory_price": (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)},
    # k-LPM's k (1 = FCFS, infinite = LPM) and SGLang PR #31723's aging (off by default)
    "lpm-aging": {"k": (2, 4, 8, 16), "aging_tokens_per_pass": (0.0, 32.0, 128.0, 512.0)},
    # CacheSage's survival weight (code default 4) and horizon (code default K = 3)
    "cachesage": {"weight": (1.0, 2.0, 4.0, 8.0), "horizon": (1, 2, 3, 5)},
    # SGLang's pin TTL (Dynamo clamps to [300, 3600] s; ours 300)
    "sglang-ttl": {"ttl_s": (10.0, 60.0, 300.0, 900.0, 3600.0)},
    # Kairos's slot length (its PREDICT_INTERVAL 0.5 s) and Bias_factor (1), and the share of
    # the KV budget its projection may fill (MAX_TOKENS; ours, 1.0)
    "kairos": {
        "slot_s": (0.25, 0.5, 1.0, 2.0),
        "bias_factor": (0.5, 1.0, 1.5),
        "mem_fraction": (0.8, 0.9, 1.0, 1.2),
    },
    "lpm-slru": {"slru_protected_threshold": (1, 2, 3, 4, 8)},
    # TokenCake's reserve bounds (its defaults 0.05-0.30) and critical share (0.75); its time
    # scheduler needs a host tier, which tuning runs have none of
    "tokencake": {"reserve_max": (0.15, 0.30, 0.45), "critical_ratio": (0.25, 0.5, 0.75, 1.0)},
    "astraea": ASTRAEA_GRID,
    "astraea-oracle": ASTRAEA_GRID,
    **dict.fromkeys(
        ("dfs-weight", "lof", "random", "hrrn", "routing-key", "shortest-prefill-first"),
        EVICTION_GRID,
    ),
}

#: TOPAS parameters a variant accepts but never reads (its lever switches them off).
INERT: dict[str, tuple[str, ...]] = {
    "topas-base": ("beta", "rho", "h_age_mult"),
    "topas-no-reuse": ("beta",),
    "topas-no-aging": ("rho", "h_age_mult"),
}
#: TOPAS's ablations and variants (registered subclasses of `Topas`).
TOPAS_VARIANTS = tuple(
    n for n in SCHEDULERS.builtin_names() if n != "topas" and is_policy_class(n, Topas)
)
for _name in TOPAS_VARIANTS:  # TOPAS's grid on what each variant accepts and reads
    _accepts = make_policy(_name).params
    GRIDS[_name] = {
        k: v for k, v in TOPAS_GRID.items() if k in _accepts and k not in INERT.get(_name, ())
    }
GRIDS = {n: GRIDS[n] for n in SCHEDULERS.builtin_names() if n in GRIDS}  # the registry's order

#: The most combinations `size` enumerates (TOPAS's grid has 983,040).
ENUMERATE_UP_TO = 10_000
#: parameter -> (another parameter, the value it needs): it acts only beside that value.
ONLY_WITH: dict[str, tuple[str, Any]] = {"slru_protected_threshold": ("eviction", "slru")}


def tunable(names: tuple[str, ...] | list[str]) -> list[str]:
    """Those of `names` that have a grid, in order."""
    return [n for n in names if n in GRIDS]


def grid_for(name: str) -> Grid:
    """`name`'s grid; a scheduler without one fails with the list of those that have one."""
    SCHEDULERS.get(name)  # an unknown name: the registry's message
    if name not in GRIDS:
        raise TopasError(
            f"{name} has no parameters to tune; tunable: {', '.join(GRIDS)} (or a group: "
            "its tunable schedulers)"
        )
    return GRIDS[name]


def defaults(name: str) -> dict[str, Any]:
    return make_policy(name).params


def canonical(
    name: str, point: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`point` with every parameter that cannot act (`ONLY_WITH`) at its default (`base`:
    `name`'s defaults, when the caller has them)."""
    out = dict(point)
    base = defaults(name) if base is None else base
    for param, (other, needed) in ONLY_WITH.items():
        if param in out and other in out and out[other] != needed:
            out[param] = base[param]
    return out


def strip_defaults(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The values that differ from `name`'s defaults: a default is the default (same run,
    same identity)."""
    base = defaults(name)
    return {k: v for k, v in params.items() if k not in base or base[k] != v}


def points(name: str, grid: Grid) -> list[dict[str, Any]]:
    """The grid's distinct policies as full points (`canonical`), the defaults first when the
    grid holds them, then in the grid's order."""
    base = defaults(name)
    start = {k: base[k] for k in grid if k in base}
    product = (dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values()))
    seen: dict[str, dict[str, Any]] = {}
    for p in itertools.chain([start], product):
        c = canonical(name, p, base)
        if all(c[k] in grid[k] for k in grid):  # the defaults may lie outside a given grid
            seen.setdefault(key(c), c)
    return list(seen.values())


def size(name: str, grid: Grid) -> int:
    """How many distinct policies the grid spans (`points`; a grid of more than
    `ENUMERATE_UP_TO` combinations is not enumerated: its combinations are counted, exact
    when none of its parameters is in `ONLY_WITH`)."""
    n = math.prod(len(v) for v in grid.values())
    return len(points(name, grid)) if n <= ENUMERATE_UP_TO else n


def key(point: Mapping[str, Any]) -> str:
    """A point's identity (`repr` tells 1 from 1.0 and True from 1, as a run's identity does)."""
    return repr(sorted(point.items()))


def describe(grid: Grid) -> str:
    """`beta=0,0.25,0.5,1 rho=0,1`: a grid on one line."""
    return " ".join(f"{k}={','.join(_fmt(v) for v in vs)}" for k, vs in grid.items())


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)
