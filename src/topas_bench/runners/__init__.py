"""Engines that run a workload under a scheduler: the simulator (`sim`) and, later, SGLang."""
