"""A cell's life in one place: one scheduler of a run plan, from identity to stored result.

identity (`cell.identity`: `RunIdentity`, `cell_identity`, the workload sample's digest) ->
is it done, may it be reused (`cell.stored.lookup`, `check_cell`) -> write it whole, with its
digests (`cell.write.write_run`) -> read it back verified (`cell.stored.load_cell`). The
harness, the sweep runner and the experiment layer call it; `plan.py` says what to run and
`results.py` is the file format. Engines never import it: they serve, the harness stores.
"""
