"""CLI commands of the SGLang engine: `serve` and `calibrate` (`run --engine sglang` is a hook in
the `run` command that builds `SglangOptions`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    from topas_bench.cli_common import handles_errors

    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        handles_errors(serve)
    )
    app.command()(handles_errors(calibrate))


def serve(
    ctx: typer.Context,
    scheduler: Annotated[
        str, typer.Option("--scheduler", "-s", help="Scheduler the plugin installs.")
    ] = "topas",
    scheduler_param: Annotated[
        list[str] | None,
        typer.Option(
            "--scheduler-param",
            help="Scheduler parameter, name.key=value as in `run` (repeatable).",
        ),
    ] = None,
    preset: Annotated[
        str, typer.Option(help="Cost-model preset for the estimator's prior.")
    ] = "a100-qwen32b",
    python: Annotated[
        str | None, typer.Option(help="Interpreter with SGLang 0.5.23 (default: this one).")
    ] = None,
) -> None:
    """Start an SGLang server with the topas plugin, for users who bring their own client.

    Everything after `--` goes to `python -m sglang.launch_server` unchanged. Send task metadata
    in `custom_params` (see docs/gpu.md); requests without it are served as independent tasks.

    Examples:
      topas-bench serve --scheduler topas -- --model-path Qwen/Qwen2.5-32B-Instruct --port 30000
      topas-bench serve -s topas --scheduler-param topas.beta=0.2 -- --model-path M --port 30000
    """
    from topas_bench.cli_common import parse_scheduler_params
    from topas_bench.errors import TopasError
    from topas_bench.runners.sglang.launcher import (
        check_server_python,
        plugin_env,
        policy_server_args,
    )
    from topas_bench.runners.sim.cost import load_preset
    from topas_bench.schedulers.registry import make_policy

    grouped = parse_scheduler_params(scheduler_param or [])
    for name in grouped:
        if name != scheduler:
            raise TopasError(
                f"--scheduler-param for {name!r}, but this server runs {scheduler!r} "
                f"(write {scheduler}.KEY=VALUE)"
            )
    params = grouped.get(scheduler, {})
    needs = make_policy(scheduler, **params).needs  # a bad name or parameter fails here
    preset = load_preset(preset).source or preset  # a file: its absolute path, for the server
    exe = python or sys.executable
    check_server_python(exe, "--python")
    import os

    argv = [exe, "-m", "sglang.launch_server", *ctx.args]
    argv += policy_server_args(needs, ctx.args)
    env = {**os.environ, **plugin_env(scheduler, params, preset)}
    typer.echo(f"starting: {' '.join(argv)} (TOPAS_SCHEDULER={scheduler})", err=True)
    raise typer.Exit(subprocess.call(argv, env=env))


def calibrate(
    log: Annotated[
        Path, typer.Argument(help="An SGLang server log (e.g. a run's server.log).", readable=False)
    ],
    preset: Annotated[str, typer.Option(help="Preset to start from (GPU and model).")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Preset file to write (TOML).", readable=False)
    ],
    name: Annotated[str | None, typer.Option(help="Name of the new preset.")] = None,
) -> None:
    """Fit the cost model's efficiencies and overheads to an SGLang log; write a preset.

    Reads the per-batch `Prefill batch` / `Decode batch` lines SGLang logs by default.

    Example:
      topas-bench calibrate runs/.../server.log --preset a100-qwen32b -o a100-qwen32b-cal.toml
    """
    from topas_bench.runners.sglang.calibrate import calibrate_file
    from topas_bench.runners.sim.cost import load_preset

    base = load_preset(preset)
    fit = calibrate_file(log, base, output, name)
    e = fit.efficiency
    dropped = f" ({fit.decode_outliers} decode outliers dropped)" if fit.decode_outliers else ""
    typer.echo(
        f"fitted from {fit.decode_lines} decode and {fit.prefill_lines} prefill lines{dropped}: "
        f"eta_c {e.eta_c}, eta_w {fit.eta_w}, eta_kv {fit.eta_kv}, c_req_us {e.c_req_us} "
        f"(+-{fit.c_req_se_us:.1f}) (kept: c_step_us {e.c_step_us}, c_layer_us {e.c_layer_us})"
    )
    for warning in fit.warnings:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(
        f"median relative error: decode {fit.decode_rel_err:.1%}, prefill "
        f"{fit.prefill_rel_err:.1%}; wrote {output}"
    )
