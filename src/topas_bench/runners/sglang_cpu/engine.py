"""`--engine sglang-cpu`, the project side: checks, the driver subprocess, the served tables.

The driver (`driver.py`) runs in SGLang's CPU venv (`make sglang-env`, `.venvs/sglang`, or the
interpreter in `TOPAS_SGLANG_PYTHON`). One subprocess serves every pending cell of a plan, so
SGLang's import (about 10 s) is paid once; each cell's tables come back through a temporary
folder and go to the harness, which writes them exactly as it writes the simulator's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd

from topas_bench.errors import TopasError
from topas_bench.plan import Cell, CellProgress, RunPlan, Served
from topas_bench.results import TABLES
from topas_bench.runners.sglang_cpu.job import Cell as JobCell
from topas_bench.runners.sglang_cpu.job import Job, ServerSettings
from topas_bench.spec import RunSpec
from topas_bench.workloads.trace import dumps_workload

ENV_PYTHON = "TOPAS_SGLANG_PYTHON"
MAKE_TARGET = "make sglang-env"


def sglang_python() -> Path:
    """The SGLang venv's interpreter: `TOPAS_SGLANG_PYTHON`, else the checkout's
    `.venvs/sglang` (built by `make sglang-env`)."""
    if env := os.environ.get(ENV_PYTHON):
        return Path(env)
    root = Path(__file__).resolve().parents[4]
    return root / ".venvs" / "sglang" / "bin" / "python"


class ReferenceServer:
    """`plan.Server` for the reference engine: every pending cell in one driver subprocess."""

    def prepare(self, spec: RunSpec) -> RunSpec:
        """The venv must be there before anything starts (the options refused the rest)."""
        py = sglang_python()
        if not py.exists():
            raise TopasError(
                f"--engine sglang-cpu needs SGLang 0.5.23's CPU venv ({py} is missing): run "
                f"`{MAKE_TARGET}` in the checkout, or set {ENV_PYTHON} to its python"
            )
        return spec

    def serve(
        self, plan: RunPlan, cells: Sequence[Cell], progress: CellProgress | None
    ) -> Iterator[Served]:
        plan.out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".sglang-cpu-", dir=plan.out))
        try:
            job = _job(plan, cells, tmp)
            _drive(job, tmp, progress)
            for cell in job.cells:
                yield _served(Path(cell.out))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


SERVER = ReferenceServer()


def _job(plan: RunPlan, cells: Sequence[Cell], tmp: Path) -> Job:
    trace = tmp / "workload.jsonl"
    trace.write_text(dumps_workload(plan.workload))
    preset = plan.preset.source if "@" in plan.preset.name and plan.preset.source else None
    jobs = tuple(
        JobCell(c.scheduler, str(tmp / f"cell{i}"), dict(c.params)) for i, c in enumerate(cells)
    )
    job = Job(str(trace), preset or plan.preset.name, ServerSettings.of(plan.sim), jobs)
    job.write(tmp / "job.json")
    return job


def _drive(job: Job, tmp: Path, progress: CellProgress | None) -> None:
    log = tmp / "driver.log"
    cmd = [
        str(sglang_python()),
        "-m",
        "topas_bench.runners.sglang_cpu.driver",
        str(tmp / "job.json"),
    ]
    env = {**os.environ, "PYTHONPATH": _src_path()}
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if progress is not None and "tasks_done" in msg:
                    progress(int(msg["cell"]), int(msg["tasks_done"]))
        except BaseException:
            proc.kill()
            raise
        finally:
            code = proc.wait()
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise TopasError(f"the sglang-cpu driver failed (exit {code}): {tail[0]}")


def _src_path() -> str:
    """This checkout's sources first, so the driver runs the same code as this process."""
    here = str(Path(__file__).resolve().parents[3])
    rest = os.environ.get("PYTHONPATH")
    return here if not rest else here + os.pathsep + rest


def _served(cell_dir: Path) -> Served:
    info = json.loads((cell_dir / "counters.json").read_text())
    tables = {name: pd.read_parquet(cell_dir / f"{name}.parquet") for name in TABLES}
    counters = {k: float(v) for k, v in info["counters"].items()}
    return Served(tables, counters, info["sim_time_s"], info["wall_s"])


__all__ = ["SERVER", "sglang_python"]
