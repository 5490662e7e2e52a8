"""The reference engine `sglang-cpu`: SGLang's own `Scheduler` on CPU, on a virtual clock.

SGLang 0.5.23's real scheduler (waiting queue, `SchedulePolicy`, `PrefillAdder`, radix cache,
token-to-KV pool, retraction, the `batch_is_full` latch) runs in its own venv (`make sglang-env`)
with a fake model worker that computes nothing: it emits each request's scripted output tokens,
and the cost model (`runners.sim.cost`) times every iteration on a virtual clock. It is the ruler
the simulator (`sim`) is measured against (`topas-bench fidelity`, docs/fidelity.md).

`engine` is the side that runs in the project's own environment (it launches the driver and
writes the run directory); `driver`, `fakes` and `loop` run inside the SGLang venv.
"""
