"""TOPAS and its ablations."""

from topas_bench.schedulers.topas.params import TopasParams
from topas_bench.schedulers.topas.policy import (
    Topas,
    TopasBase,
    TopasNoAging,
    TopasNoJoint,
    TopasNoReuse,
)

__all__ = ["Topas", "TopasBase", "TopasNoAging", "TopasNoJoint", "TopasNoReuse", "TopasParams"]
