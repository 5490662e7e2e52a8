"""Run the fuzz suite's targets at scale and count what happened to every input (issue 13).

The targets and the classification (ok / rejected / fallback / crash) are the fuzz suite's
own (`tests/fuzz_targets.py`); here each target draws `--examples` hostile inputs (random,
unless `--seed`) and nothing stops at the first crash: every outcome is counted, and the first
crashing inputs are shown (cut to 300 characters). The goal is zero crashes.

    python benchmarks/fuzz_census.py [--examples 1000] [--seed 0] [--only TARGET] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fuzz_stored import (
    check_encoded_preset,
    check_encoded_sweep,
    check_stored_damage,
    damages,
    encoded_presets,
    encoded_sweeps,
)
from fuzz_targets import OUTCOMES, TARGETS, PluginState
from trace_mutations import run_both, traces

#: issue 24: mutated traces through `workloads validate` and `run`, result invariants checked;
#: issue 30: damaged stored results (never a silent change), sweep and preset file encodings
TARGETS = {
    **TARGETS,
    "traces end to end": (traces(), lambda data: run_both(data)[0]),
    "stored results": (damages(), check_stored_damage),
    "sweep file encodings": (encoded_sweeps, check_encoded_sweep),
    "preset encodings": (encoded_presets, check_encoded_preset),
}


def census(name: str, examples: int, rng_seed: int | None) -> dict[str, Any]:
    strategy, check = TARGETS[name]
    counts: collections.Counter[str] = collections.Counter()
    crashes: list[str] = []
    state = PluginState()

    def one(value: Any) -> None:
        outcome = check(state, value) if name == "custom_params" else check(value)
        counts[outcome] += 1
        if outcome == "crash" and len(crashes) < 3:
            crashes.append(repr(value)[:300])

    run = settings(
        max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(given(strategy)(one))  # fmt: skip
    if rng_seed is not None:
        run = seed(rng_seed)(run)
    started = time.monotonic()
    run()
    result: dict[str, Any] = {o: counts[o] for o in OUTCOMES}
    result |= {o: n for o, n in counts.items() if o not in OUTCOMES}  # e.g. run-refused
    result |= {"inputs": sum(counts.values()), "seconds": round(time.monotonic() - started, 1)}
    if name == "custom_params":
        result["fallback_reasons"] = len(state.tracker.untagged)
    result["first_crashes"] = crashes
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--only", choices=sorted(TARGETS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    for name in [args.only] if args.only else TARGETS:
        r = results[name] = census(name, args.examples, args.seed)
        line = ", ".join(f"{o} {n}" for o, n in r.items() if isinstance(n, int) and o != "inputs")
        extra = f", {r['fallback_reasons']} distinct reasons" if "fallback_reasons" in r else ""
        print(f"{name}: {r['inputs']} inputs: {line}{extra} ({r['seconds']} s)", flush=True)
        for c in r["first_crashes"]:
            print(f"  crash: {c}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
