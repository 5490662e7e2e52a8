"""The SGLang CPU venv from the main venv's tests: built on first use (`make sglang-env`, ~5
min, then cached in .venvs/sglang), and a test module run there as a script
(`test_sglang_adapter.py`, `test_sglang_standing.py`, `test_sglang_lockstep.py`: each is both
the pytest module and the script, which prints one JSON line of results)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV_PYTHON = REPO / ".venvs" / "sglang" / "bin" / "python"


def build() -> None:
    """Build the venv unless it is up to date (a failure fails the test that needs it)."""
    if shutil.which("make") is None:
        pytest.fail("`make` is needed to build the SGLang CPU venv (make sglang-env)")
    subprocess.run(["make", "-s", "sglang-env"], cwd=REPO, check=True, timeout=2400)


def script_results(script: str, timeout: int = 2400) -> dict[str, Any]:
    """Run `script` in the venv (this checkout's src first on its path, no plugin scheduler
    in the environment) and return the last JSON line it printed."""
    build()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO / "src")}
    env.pop("TOPAS_SCHEDULER", None)
    proc = subprocess.run(
        [str(VENV_PYTHON), script], capture_output=True, text=True, timeout=timeout, env=env,
        cwd=REPO,
    )  # fmt: skip
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    out: dict[str, Any] = json.loads(lines[-1])
    return out
