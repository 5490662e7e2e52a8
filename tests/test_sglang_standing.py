"""Standing decisions on SGLang's own scheduler (`runners.sglang.bridge.Bridge`): reusing a
TOPAS decision while it stands (`schedulers.base.Standing`) changes nothing.

The reference engine (SGLang 0.5.23's real `Scheduler` on CPU through the plugin) serves the
lockstep module's random streams with TOPAS twice: reusing standing decisions, and asking the
policy at every iteration. Both must record the same iterations (admitted requests with their
cached and new tokens, decode batches, free KV, evictable cache, queue length), the reusing run
must have reused decisions, and reusing one decode step past the bound must be caught (on the
stream where the bound is exact, `lockstep.budget_flip_workload`).

Like `test_sglang_lockstep.py`, this file is both the pytest module (main venv) and the script
the SGLang venv runs (`make sglang-env`).
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings
from typing import Any

SEEDS = (0, 1, 2)

# -- pytest side (main venv) -----------------------------------------------------------------
if __name__ != "__main__":  # the SGLang venv has no pytest
    import pytest

    from sglang_venv import script_results

    @pytest.fixture(scope="module")
    def results() -> dict[str, Any]:
        return script_results(__file__)

    @pytest.mark.slow
    @pytest.mark.parametrize("seed", [-1, *SEEDS])
    def test_reuse_changes_nothing(results: dict[str, Any], seed: int) -> None:
        res = results[f"reuse_{seed}"]
        assert res.get("error") is None, res.get("error")
        assert res["divergence"] is None, res["divergence"]
        assert res["reused"] > 0 and res["asked"] < res["asked_always"]

    @pytest.mark.slow
    def test_reuse_one_step_late_is_caught(results: dict[str, Any]) -> None:
        res = results["late"]
        assert res.get("error") is None, res.get("error")
        assert res["divergences"] > 0, "reusing past the bound went unnoticed"


# -- the SGLang venv side --------------------------------------------------------------------
def serve(seed: int, reuse: bool) -> tuple[list[Any], int, int]:
    """TOPAS on the reference engine over the lockstep stream `seed` (-1: the budget-flip
    stream): its iterations, the decisions the policy made, the ones reused."""
    from topas_bench.runners.sglang_cpu import lockstep
    from topas_bench.runners.sglang_cpu.driver import reference_loop
    from topas_bench.runners.sglang_cpu.fakes import model_dir
    from topas_bench.runners.sglang_cpu.job import ServerSettings
    from topas_bench.runners.sglang_cpu.tokens import TokenIds

    if seed < 0:
        w, cfg = lockstep.budget_flip_workload(), lockstep.budget_flip_config()
    else:
        w, cfg = lockstep.random_workload(seed, 40), lockstep.lockstep_config()
    server = ServerSettings.of(cfg)
    path = model_dir(TokenIds.of(w).vocab_size, server.context_length)
    loop = reference_loop(w, "topas", {}, "h100-llama8b", server, path)
    bridge = loop.sched.topas
    bridge.reuse = reuse
    trace: list[Any] = []
    loop.trace = trace
    loop.run()
    return trace, bridge.decisions, bridge.reused


def reuse(seed: int) -> dict[str, Any]:
    from topas_bench.runners.sglang_cpu.lockstep import first_divergence

    fast, asked, reused = serve(seed, True)
    slow, asked_always, _ = serve(seed, False)
    div = first_divergence(fast, slow)
    return {
        "divergence": None if div is None else str(div),
        "asked": asked, "asked_always": asked_always, "reused": reused,
    }  # fmt: skip


def late() -> dict[str, Any]:
    """The Bridge reusing a decision at one scheduling point past its bound (the state still
    the one it was made on), on every stream: the budget-flip stream, where the bound is
    exact, must catch it."""
    from topas_bench.runners.sglang import bridge
    from topas_bench.runners.sglang_cpu.lockstep import first_divergence

    stands = bridge.Bridge.stands

    def one_late(self: Any, state: tuple[Any, ...], running: Any) -> Any:
        d = stands(self, state, running)
        last = getattr(self, "late", None)
        self.late = d
        if d is None and last is not None and self.standing and state == self.standing[1]:
            self.late = None
            return last  # once more, past the bound
        return d

    divergences = 0
    for seed in (-1, *SEEDS):
        slow, _, _ = serve(seed, False)
        bridge.Bridge.stands = one_late  # type: ignore[method-assign]
        try:
            fast, _, _ = serve(seed, True)
        finally:
            bridge.Bridge.stands = stands  # type: ignore[method-assign]
        divergences += first_divergence(fast, slow) is not None
    return {"divergences": divergences}


def main() -> None:
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    from topas_bench.runners.sglang_cpu.driver import set_env
    from topas_bench.runners.sglang_cpu.job import ServerSettings
    from topas_bench.runners.sglang_cpu.lockstep import lockstep_config

    set_env(ServerSettings.of(lockstep_config()))
    out: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        try:
            out[name] = {"error": None, **fn()}
        except Exception:
            out[name] = {"error": traceback.format_exc()[-3000:]}
        print(name, out[name], file=sys.stderr)

    for seed in (-1, *SEEDS):
        run(f"reuse_{seed}", lambda k=seed: reuse(k))
    run("late", late)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
