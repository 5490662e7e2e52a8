"""TOPAS and its ablations."""

from topas_bench.schedulers.topas.params import TopasParams
from topas_bench.schedulers.topas.policy import (
    Topas,
    TopasBase,
    TopasExpectedPath,
    TopasMoveStall,
    TopasNoAging,
    TopasNoJoint,
    TopasNoPins,
    TopasNoReuse,
)

__all__ = [
    "Topas", "TopasBase", "TopasExpectedPath", "TopasMoveStall", "TopasNoAging",
    "TopasNoJoint", "TopasNoPins", "TopasNoReuse", "TopasParams",
]  # fmt: skip
