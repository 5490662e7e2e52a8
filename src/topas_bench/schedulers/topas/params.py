"""TOPAS's parameters: every choice the paper leaves open, named, with its default and reason.

The paper (arXiv 2608.25523, as summarised in docs/design.md section 5) fixes the score's shape
but not its constants. Defaults marked (tuned) came from `topas-bench tune` on tuning seeds
101-103, kept apart from the evaluation seeds 0-9 (docs/topas.md gives the commands and numbers).

Time scales are the workload's own: T0, the mean unloaded JCT of the tasks seen so far (each
task's expected critical path when it is first seen, without queueing), measured online.

beta (1.0): weight of the reuse value `V_reuse` against the other terms.
rho (1.0, tuned), h_age_mult (2.0, tuned), h_age_s (None = h_age_mult x T0): aging
    `g = 1 + rho * log(1 + age / h_age)` multiplies admission gains; on the workload's time scale
    a task that has waited two unloaded JCTs gains 1 + rho log 2.
srpt_exponent (1.0): each task's gain is scaled by (mean remaining critical path of the waiting
    tasks / its own) ** srpt_exponent, so tasks nearer completion go first (SRPT on the
    expected remaining critical path; 0 = flat).
max_agents (M = 8): the search considers the M agents with the most waiting gain (each added,
    removed, swapped, or grown greedily), not every subset.
max_actions (K = 8, tuned): at most K admissions + preemptions per decision.
horizon_s (None = auto): the epoch over which an admission's gain is measured, i.e. how long a
    waiting request that is not admitted now is expected to wait for the next chance. Auto =
    the mean expected residual service of the running requests, at least one decode step.
preempt_margin_s (20.0): a preemption must gain this much more than its redo + revoke cost.
max_preemptions (1): a request is preempted at most this many times (no ping-pong).
scan_limit (32): candidates walked per pack (the best by gain; starving ones always).
refresh_limit (128): per decision, at most this many waiting tasks whose paths are stale only
    because the estimator learned since get recomputed (stalest first).
starvation_mult (4.0; 0 = off): a request waiting longer than starvation_mult x T0 goes first,
    oldest first, no later candidate may delay it (conservative backfill), and it is not
    preempted once running.
move_charge ("affected"): who pays a swap-in (the reload of an absent prefix an admission
    brings in). "affected" (the paper's J_move, "charged to each affected task"): every task
    the move stalls, i.e. every running task (decode waits for the prefill that computes it)
    and every task the pack admits (they wait in that prefill); "admitted": once per prefix,
    as the admitted task's own delay (ours, the default before issue 21); "running": once
    plus once per running task (ours, the former `move_stall` switch). docs/topas.md gives
    the tuning-seed comparison.
move_stall (False): the former switch, kept as an alias: True = move_charge "running".
reuse_users ("all"): who counts as an agent's users n_a, in V_reuse and in the swap-out of
    an evicted prefix. "all" (the paper's reuse as issue 21 reads it): the agent's waiting
    requests and its stages that become ready once the running stages finish; "next": only
    the latter, one hop (ours, the default before issue 21).
pins (True): False = no residency choice at all (the `topas-no-pins` ablation): no resident
    set is searched, nothing is pinned (kept prefixes are released), and the pack admits any
    candidate, as `joint` False does.
path_samples (0): L_i as LP(E[Z]) (0: the longest path over expected stage times) or, with
    N > 0, as E[LP(Z)] estimated from N samples of the stage times (`paths.py`).
joint (True): R' restricts packing to its agents' requests (the paper's joint choice); False
    packs any candidate and uses R' only for pins (the `topas-no-joint` ablation).
density (True, tuned): rank candidates by gain per budget token they take (admission need,
    lock cost, and their agent prefix when it is not paid for yet) instead of by gain: the
    knapsack order GREEDY-PACK approximates. Gains themselves, and the score, are unchanged.
use_reuse / use_aging: the ablation switches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from topas_bench.schedulers.validate import (
    InvalidParameter,
    require_bool,
    require_int,
    require_number,
)


def require_choice(policy: str, name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidParameter(
            f"{policy}: {name} must be one of {', '.join(choices)}, got {value!r}"
        )
    return value


NAME = "topas"
MOVE_CHARGES = ("affected", "admitted", "running")
REUSE_USERS = ("next", "all")
#: The paper's names for three parameters (docs/design.md section 5), accepted as aliases.
ALIASES = {"K": "max_actions", "M": "max_agents", "H_age": "h_age_s"}


@dataclass(frozen=True)
class TopasParams:
    beta: float = 1.0
    rho: float = 1.0
    h_age_mult: float = 2.0
    h_age_s: float | None = None
    srpt_exponent: float = 1.0
    max_agents: int = 8
    max_actions: int = 8
    horizon_s: float | None = None
    preempt_margin_s: float = 20.0
    max_preemptions: int = 1
    scan_limit: int = 32
    refresh_limit: int = 128
    starvation_mult: float = 4.0
    move_charge: str = "affected"
    move_stall: bool = False
    reuse_users: str = "all"
    pins: bool = True
    path_samples: int = 0
    joint: bool = True
    density: bool = True
    use_reuse: bool = True
    use_aging: bool = True

    def __post_init__(self) -> None:
        require_number(NAME, "beta", self.beta)
        require_number(NAME, "rho", self.rho)
        require_number(NAME, "h_age_mult", self.h_age_mult, strict=True)
        if self.h_age_s is not None:
            require_number(NAME, "h_age_s", self.h_age_s, strict=True)
        require_number(NAME, "srpt_exponent", self.srpt_exponent, high=16)  # a power
        require_int(NAME, "max_agents", self.max_agents, 1)
        require_int(NAME, "max_actions", self.max_actions, 1)
        if self.horizon_s is not None:
            require_number(NAME, "horizon_s", self.horizon_s, strict=True)
        require_number(NAME, "preempt_margin_s", self.preempt_margin_s)
        require_int(NAME, "max_preemptions", self.max_preemptions, 0)
        require_int(NAME, "scan_limit", self.scan_limit, 1)
        require_int(NAME, "refresh_limit", self.refresh_limit, 1)
        require_number(NAME, "starvation_mult", self.starvation_mult)
        for flag in ("move_stall", "pins", "joint", "density", "use_reuse", "use_aging"):
            require_bool(NAME, flag, getattr(self, flag))
        require_choice(NAME, "move_charge", self.move_charge, MOVE_CHARGES)
        require_choice(NAME, "reuse_users", self.reuse_users, REUSE_USERS)
        require_int(NAME, "path_samples", self.path_samples, 0, high=100_000)  # an array each

    @property
    def stall_charge(self) -> str:
        """`move_charge`, with the former `move_stall` switch applied."""
        return "running" if self.move_stall else self.move_charge

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_params(policy: str, params: dict[str, Any]) -> dict[str, Any]:
    """`params` with the paper's aliases renamed; an unknown name lists the valid ones."""
    out: dict[str, Any] = {}
    valid = [f.name for f in fields(TopasParams)]
    for key, value in params.items():
        name = ALIASES.get(key, key)
        if name not in valid:
            aliases = ", ".join(f"{a} = {n}" for a, n in ALIASES.items())
            raise InvalidParameter(
                f"{policy}: unknown parameter {key!r}; valid: {', '.join(valid)} "
                f"(aliases {aliases})"
            )
        if name in out:
            raise InvalidParameter(f"{policy}: {name} given twice (as {key!r} and {name!r})")
        out[name] = value
    return out
