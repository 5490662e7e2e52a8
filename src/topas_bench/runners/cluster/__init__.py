"""N simulated SGLang servers behind a router: the cluster is an engine made of engines.

`sim.ClusterSim` runs the client (task DAGs, arrivals, tool delays) once and routes every
request through a router (`routers`) to one of N replicas (`replica.Replica`, the single-server
simulator with its own scheduler instance and KV budget), all on one event heap and one clock.
`runner.serve_cluster` returns the usual tables with a `replica` column (docs/cluster.md).
"""
