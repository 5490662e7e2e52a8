"""The Makefile's user-facing targets, as a newcomer meets them.

`make run` ends by saying how to call topas-bench (it is installed in the venv, not on PATH);
the targets that draw figures install the `figures` extra, not the dev extras (Ray, Optuna,
openai).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)  # the venv running the tests: make's $(VENV)

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def make(*args: str) -> str:
    res = subprocess.run(
        ["make", "-C", str(ROOT), "--no-print-directory", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_make_run_prints_the_table_then_how_to_call_topas_bench(tmp_path: Path) -> None:
    # -o: the venv's install stamp counts as done, so this runs the recipe, installing nothing
    args = f"--workload chain3 --scheduler fcfs --tasks 2 --out {tmp_path}"
    out = make("-o", f"{VENV}/.installed", "run", f"VENV={VENV}", f"RUN_ARGS={args}")
    assert "mean JCT" in out  # what .ci/run looks for
    tail = out.rstrip().splitlines()[-2:]
    assert f"call {VENV}/bin/topas-bench --help" in tail[0]
    assert f"(. {VENV}/bin/activate) and call topas-bench --help." in tail[1]


@pytest.mark.parametrize("target", ["figures", "reference", "nightly", "nightly-history"])
def test_figure_targets_install_only_the_figures_extra(target: str, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # what it would run from an empty venv (a recursive $(MAKE) runs with -n too)
    plan = make("-n", "-B", target, f"VENV={venv}")
    installs = [x for x in plan.splitlines() if " -m pip install " in x]
    assert {x.split("txt ", 1)[1] for x in installs} == {"-e .", "-e '.[figures]'"}
    assert "installed-dev" not in plan
