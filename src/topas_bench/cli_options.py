"""Command-line options several commands take, declared once (typer `Annotated` aliases).

They are `run`'s, and those of the commands that read a results tree; `sweep` (a
comma-separated list of most settings) and `tune` declare their own where their help has always
said it differently, so that every command's help reads as it did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SCHEDULER_HELP = (
    "`paper` (the paper's five baselines + topas), `peers` (the schedulers the paper left out: "
    "kvflow, continuum, lpm-aging, tokencake, astraea, cachesage, kairos, stock SGLang's), `all` "
    "(paper + peers), `baselines`, "
    "`sglang`, `ablations`, `peers-2026`, `everything`, names, or a comma-separated mix "
    "(paper,topas-base)."
)

Workload = Annotated[
    str,
    typer.Option(
        "--workload",
        "-w",
        help="Workload name (see `workloads list`) or a trace file (docs/workload-format.md).",
    ),
]
Schedulers = Annotated[str | None, typer.Option("--scheduler", "-s", help=SCHEDULER_HELP)]
Tasks = Annotated[
    int | None,
    typer.Option("--tasks", "-n", help="Number of tasks (default: 200; a file: all of its)."),
]
Rate = Annotated[
    float | None, typer.Option(help="Poisson arrival rate, tasks/s (default: the workload's).")
]
Load = Annotated[
    float | None,
    typer.Option(help="Arrival rate as a fraction of measured capacity (instead of --rate)."),
]
Seed = Annotated[int, typer.Option(help="Seed of the workload sample.")]
Preset = Annotated[
    str,
    typer.Option(
        help="Hardware/model preset: a name (see `presets list`) or a preset .toml file "
        "(e.g. from `calibrate`)."
    ),
]
KvBudget = Annotated[
    int | None,
    typer.Option(
        "--kv-budget", help="KV cache budget in tokens (default: derived from the preset)."
    ),
]
LengthHint = Annotated[
    str, typer.Option(help="`none`, or `oracle` to show policies true output lengths.")
]
HostTierTokens = Annotated[
    int, typer.Option(help="Host-memory KV tier capacity in tokens (0 = off).")
]
WorkloadParams = Annotated[
    list[str] | None,
    typer.Option(
        "--workload-param", help="Override a generator parameter, key=value (repeatable)."
    ),
]
SchedulerParams = Annotated[
    list[str] | None,
    typer.Option("--scheduler-param", help="Scheduler parameter, name.key=value (repeatable)."),
]
Tuned = Annotated[
    Path | None,
    typer.Option(
        "--tuned",
        help="A tuned file (`tune`'s OUT/tuned.toml): each scheduler's tuned setting also runs, "
        "beside its default, as name[k=v,...].",
    ),
]
AllowLarge = Annotated[
    bool,
    typer.Option(help="Run even if the estimated memory exceeds half of this machine's RAM."),
]

#: Options of the commands that read a results tree (report, figures, compare, site).
SkipBad = Annotated[
    bool,
    typer.Option(
        "--skip-bad", help="Leave out unreadable, partial or corrupt runs (listed) and go on."
    ),
]
AllowMixed = Annotated[
    bool,
    typer.Option(
        "--allow-mixed-revisions",
        help="Report runs written by different code revisions (or results formats) together.",
    ),
]
