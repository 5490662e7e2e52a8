"""`topas-bench fidelity`: the simulator against SGLang's own scheduler (`topas_bench.fidelity`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from topas_bench.cli_common import check_out_dir, err, handles_errors, out
from topas_bench.errors import TopasError

PAPER_WORKLOADS = "chain3,dag4,dag10-wide,metagpt-sop,metagpt-tl"


@handles_errors
def fidelity(
    workload: Annotated[
        str, typer.Option("--workload", "-w", help="Workloads, comma-separated.")
    ] = PAPER_WORKLOADS,
    scheduler: Annotated[
        str, typer.Option("--scheduler", "-s", help="Schedulers: names or groups (`all`).")
    ] = "all",
    tasks: Annotated[int, typer.Option("--tasks", "-n", help="Tasks per cell.")] = 200,
    seeds: Annotated[str, typer.Option(help="Seeds, comma-separated.")] = "0",
    load: Annotated[
        float | None,
        typer.Option(
            help="Rate as a fraction of measured capacity (default: the "
            "workload's default rate, 0.8 x capacity)."
        ),
    ] = None,
    preset: Annotated[str, typer.Option(help="Hardware/model preset.")] = "a100-qwen32b",
    kv_budget: Annotated[int | None, typer.Option(help="KV budget in tokens.")] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Results directory.", readable=False)
    ] = Path("runs/fidelity"),
    report: Annotated[
        Path | None,
        typer.Option(
            help="Write the Markdown tables here (default OUT/fidelity.md).", readable=False
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Re-run cells whose results already exist.")] = False,
) -> None:
    """Run the same cells on the simulator and on SGLang's own scheduler (`sglang-cpu`), and
    compare: mean and p99 JCT difference, prefix-hit-rate difference, admission-order agreement
    per workload and scheduler, and whether the schedulers rank the same.

    Needs the SGLang CPU venv (`make sglang-env`). Writes OUT/fidelity.md and fidelity.json.

    Examples:
      topas-bench fidelity
      topas-bench fidelity -w metagpt-tl -s fcfs,topas -n 100 --seeds 0,1
    """
    from topas_bench.fidelity import as_json, markdown, run_fidelity
    from topas_bench.spec import parse_schedulers
    from topas_bench.workloads.registry import WORKLOADS

    names = [w.strip() for w in workload.split(",") if w.strip()]
    if not names:
        raise TopasError("--workload is empty")
    for w in names:
        WORKLOADS.get(w)
    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise TopasError(f"--seeds must be integers separated by commas, got {seeds!r}") from None
    if not seed_list or min(seed_list) < 0:
        raise TopasError(f"--seeds must be non-negative integers, got {seeds!r}")
    out_dir = check_out_dir(out_dir)
    schedulers = parse_schedulers(scheduler)
    total = 2 * len(names) * len(seed_list) * len(schedulers)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("cells"),
        TimeElapsedColumn(), console=err,
    ) as bar:  # fmt: skip
        task = bar.add_task("fidelity", total=total)

        def advance(engine: str, w: str, seed: int, name: str) -> None:
            bar.update(task, advance=1, description=f"{engine} {w} s{seed} {name}")

        result = run_fidelity(
            names, schedulers, num_tasks=tasks, seeds=seed_list, out=out_dir, load=load,
            preset=preset, kv_budget_tokens=kv_budget, force=force, progress=advance,
        )  # fmt: skip
    command = "topas-bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = report or out_dir / "fidelity.md"
    path.write_text(markdown(result, command))
    doc = {"command": command, **as_json(result)}  # the site shows what made it
    (out_dir / "fidelity.json").write_text(json.dumps(doc, indent=2) + "\n")
    table = Table(title="sim against sglang-cpu", title_justify="left")
    for col in ("workload", "scheduler", "mean JCT diff", "p99 JCT diff", "hit diff", "order"):
        table.add_column(col, justify="left" if col in ("workload", "scheduler") else "right")
    for r in result.cells.to_dict("records"):
        table.add_row(
            str(r["workload"]), str(r["scheduler"]), f"{100 * r['mean_jct_diff']:+.2f}%",
            f"{100 * r['p99_jct_diff']:+.2f}%", f"{r['hit_rate_diff_pts']:+.2f} pts",
            f"{r['order_agreement']:.4f}",
        )  # fmt: skip
    for r in result.rankings.to_dict("records"):
        verdict = "agree" if r["same"] else "DIFFER"
        out.print(f"{r['workload']}: rankings {verdict} ({r['ranking_sim']})")
    out.print(f"written: {path}, {out_dir / 'fidelity.json'}")
