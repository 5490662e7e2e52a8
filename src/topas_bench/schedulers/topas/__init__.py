"""TOPAS and its ablations."""

from topas_bench.schedulers.topas.params import TopasParams
from topas_bench.schedulers.topas.policy import Topas, TopasBase, TopasNoAging, TopasNoReuse

__all__ = ["Topas", "TopasBase", "TopasNoAging", "TopasNoReuse", "TopasParams"]
