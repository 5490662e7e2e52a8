"""Workloads: the workflow model, trace I/O and validation (the `trace` package), generators and
their registry.

`topas_bench.workloads.registry.generate(name, num_tasks=..., ...)` builds any registered
workload; `topas_bench.workloads.model` holds the data classes (docs/design.md section 2).
"""
