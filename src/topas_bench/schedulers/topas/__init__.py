"""TOPAS and its ablations."""

from topas_bench.schedulers.topas.params import TopasParams
from topas_bench.schedulers.topas.policy import (
    Topas,
    TopasBase,
    TopasExpectedPath,
    TopasNoAging,
    TopasNoJoint,
    TopasNoMoveStall,
    TopasNoPins,
    TopasNoPreempt,
    TopasNoReuse,
    TopasPrevScore,
)

__all__ = [
    "Topas", "TopasBase", "TopasExpectedPath", "TopasNoAging",
    "TopasNoJoint", "TopasNoMoveStall", "TopasNoPins", "TopasNoPreempt", "TopasNoReuse",
    "TopasParams", "TopasPrevScore",
]  # fmt: skip
