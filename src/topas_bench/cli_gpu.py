"""CLI commands for real GPUs: `serve` and `calibrate` of the SGLang engine, and `profile`, which
measures a GPU for `calibrate --profile` (`run --engine sglang` is a hook in the `run` command
that builds `SglangOptions`)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from topas_bench.runners.sim.cost import Preset


def register(app: typer.Typer) -> None:
    from topas_bench.cli_common import handles_errors

    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        handles_errors(serve)
    )
    app.command()(handles_errors(calibrate))
    app.command()(handles_errors(profile))


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
        Path | None,
        typer.Argument(
            help="An SGLang server log (e.g. a run's server.log); or give --profile.",
            readable=False,
        ),
    ] = None,
    preset: Annotated[str, typer.Option(help="Preset to start from (GPU and model).")] = "",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Preset file to write (TOML).", readable=False),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Name of the new preset.")] = None,
    profile: Annotated[
        list[Path] | None,
        typer.Option(
            help="A GPU iteration profile (JSON lines, docs/gpu.md; repeatable) to fit instead "
            "of a log."
        ),
    ] = None,
    shape: Annotated[
        str | None, typer.Option(help="The profile's model shape to fit (its `model` field).")
    ] = None,
    hold_out: Annotated[
        list[str] | None,
        typer.Option(
            help="Profile points to hold out of the fit and report apart: KEY=V[,V...] with KEY "
            "cached, new, batch or context (repeatable; any match holds a point out)."
        ),
    ] = None,
    gemm_tflops: Annotated[
        float | None, typer.Option(help="GEMM check bounding eta_c (default: the profile's).")
    ] = None,
    copy_tbps: Annotated[
        float | None,
        typer.Option(help="Copy check bounding eta_kv, giving eta_w (default: the profile's)."),
    ] = None,
    vocab: Annotated[
        int | None,
        typer.Option(
            help="Profile: vocabulary size, to split an untied embedding and LM head out of a "
            "preset whose model has not (default: the profile's shape line)."
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option("--check", help="Profile: only the --preset's error per region; no fit."),
    ] = False,
) -> None:
    """Fit the cost model to an SGLang log or to a GPU iteration profile; write a preset.

    A log: the per-batch `Prefill batch` / `Decode batch` lines SGLang logs by default. A
    profile (`--profile`, e.g. from `topas-bench profile`): iteration times of one model shape,
    fitted with the profile's peak checks as bounds; prints the error per region (prefill with a
    short / long cached prefix, decode of a small / large batch) before and after, on the fit
    split and the held-out points (docs/fidelity.md, "Clock").

    Examples:
      topas-bench calibrate runs/.../server.log --preset a100-qwen32b -o a100-qwen32b-cal.toml
      topas-bench calibrate --profile results/gpu/h200-profile-graphs.jsonl --shape llama3-8b \
          --preset h200-llama8b --copy-tbps 4.25 --gemm-tflops 770 --hold-out cached=2048 -o my.toml
    """
    from topas_bench.errors import TopasError
    from topas_bench.runners.sim.cost import load_preset

    if not preset:
        raise TopasError("--preset is required (the preset to start from)")
    base = load_preset(preset)
    if profile:
        if log is not None:
            raise TopasError("give a server log or --profile, not both")
        _calibrate_profile(profile, shape, preset, base, output, name, hold_out or [],
                           gemm_tflops, copy_tbps, vocab, check)  # fmt: skip
        return
    if log is None or output is None:
        raise TopasError("give a server log and -o FILE (or --profile FILE --shape NAME)")
    from topas_bench.runners.sglang.calibrate import calibrate_file

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


def _calibrate_profile(
    paths: list[Path],
    shape: str | None,
    preset_spec: str,
    base: Preset,
    output: Path | None,
    name: str | None,
    hold_out: list[str],
    gemm_tflops: float | None,
    copy_tbps: float | None,
    vocab: int | None,
    check: bool,
) -> None:
    from topas_bench.errors import TopasError
    from topas_bench.runners.sim.clock_fit import (
        FITTED,
        fit_profile,
        fitted_toml,
        region_rows,
        rel_errors,
        render_rows,
    )
    from topas_bench.runners.sim.iteration_profile import held_out, hold_out_rule, read_profile

    if shape is None:
        raise TopasError("--profile needs --shape NAME (the profile's `model` field)")
    if output is None and not check:
        raise TopasError("give -o FILE to write the fitted preset (or --check)")
    prof = read_profile(paths, shape)
    rule = hold_out_rule(hold_out)
    held = [held_out(p, rule) for p in prof.points]
    gpu = base.gpu.name.split("-")[0].lower()
    for device in prof.devices:
        if gpu not in device.lower():
            typer.echo(f"warning: profiled on {device!r}, the preset's GPU is {base.gpu.name}",
                       err=True)  # fmt: skip
    split = "; ".join(hold_out)
    if check:
        splits = ("rest", "held out") if any(held) else ("all", "held out")
        rows = region_rows(prof.points, held, rel_errors(base, prof.points), splits=splits)
        typer.echo(f"{shape}: {len(prof.points)} points; absolute error of {base.name}'s GPU time:")
        typer.echo(render_rows(rows))
        return
    fit = fit_profile(prof, base, held, gemm_tflops, copy_tbps, vocab)
    n_held = sum(fit.held)
    typer.echo(
        f"{shape}: {len(fit.points)} {fit.points[0].timing}-timed points, fitted on "
        f"{len(fit.points) - n_held}" + (f", held out {n_held} ({split})" if n_held else "")
        + (f"; {fit.skipped_eager} eager-timed points not compared" if fit.skipped_eager else "")
    )  # fmt: skip
    typer.echo(f"bounds: {fit.bounds.why}")
    e = fit.preset.efficiency
    typer.echo(
        "fitted: "
        + ", ".join(
            f"{n} {getattr(e, n)}" + (" (at its bound)" if n in fit.at_bound else "")
            for n in FITTED
        )
        + f"; eta_w {e.eta_w}; kept: c_step_us {e.c_step_us}, c_req_us {e.c_req_us}"
    )
    typer.echo(f"absolute error of the GPU time, {base.name} before and fitted after:")
    typer.echo(render_rows(fit.rows()))
    assert output is not None
    argv = ["topas-bench", "calibrate", *(a for p in paths for a in ("--profile", str(p)))]
    argv += ["--shape", shape, "--preset", preset_spec]
    for flag, value in (("--vocab", vocab), ("--gemm-tflops", gemm_tflops),
                        ("--copy-tbps", copy_tbps)):  # fmt: skip
        argv += [flag, f"{value:g}"] if value is not None else []
    argv += [a for rule_spec in hold_out for a in ("--hold-out", rule_spec)]
    argv += ["--name", name] if name else []
    command = shlex.join([*argv, "-o", str(output)])
    output.write_text(fitted_toml(fit, name or output.stem, command))
    typer.echo(f"wrote {output}")


def profile(
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile file to write (JSONL).")],
    preset: Annotated[
        str, typer.Option(help="Preset whose model shape to build (random weights).")
    ] = "h200-llama8b",
    vocab: Annotated[
        int | None,
        typer.Option(help="Vocabulary size, for a preset that does not split it out."),
    ] = None,
    tiny: Annotated[
        bool, typer.Option("--tiny", help="A tiny shape on the CPU: checks the code path only.")
    ] = False,
    graphs: Annotated[
        bool, typer.Option("--graphs/--no-graphs", help="Also time replayed CUDA graphs.")
    ] = True,
    reps: Annotated[int, typer.Option(help="Timed repetitions per point (median kept).")] = 5,
) -> None:
    """Time prefill and decode iterations of a preset's model shape on this GPU; write a profile.

    Needs torch (its CUDA build). The profile (docs/gpu.md, "The iteration profile format") holds
    the GPU's GEMM and copy peak checks, and each point's eager and CUDA-graph times; fit it with
    `topas-bench calibrate --profile FILE --shape NAME --preset NAME -o FILE`. About 10 minutes
    for an 8B model on an H200.

    Examples:
      topas-bench profile --preset h200-llama8b -o h200-llama8b-profile.jsonl
      topas-bench profile --tiny -o /tmp/tiny.jsonl
    """
    from topas_bench.errors import TopasError
    from topas_bench.runners.sim.cost import load_preset
    from topas_bench.runners.sim.gpu_profiler import TINY, Shape
    from topas_bench.runners.sim.gpu_profiler import profile as run_profile

    if reps < 1:
        raise TopasError("--reps must be at least 1")
    shape = TINY if tiny else Shape.from_preset(load_preset(preset), vocab)
    timed = run_profile(shape, output, "cpu" if tiny else "cuda", graphs, reps,
                        echo=lambda line: typer.echo(line, err=True))  # fmt: skip
    typer.echo(f"{shape.name}: {timed} points timed; wrote {output}")
