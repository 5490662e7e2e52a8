"""`topas-bench trace ...`: import recorded MetaGPT call traces, record new ones.

Registered in `topas_bench.cli` as a sub-app; the consoles and error handling come from
`topas_bench.cli_common`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from topas_bench.cli_common import handles_errors, lists_problems, out
from topas_bench.cli_progress import ImportBars
from topas_bench.errors import TopasError
from topas_bench.workloads.model import Workload

trace_app = typer.Typer(
    no_args_is_help=True,
    help="Recorded MetaGPT call traces: import them as workloads, record new ones.",
)


def _default_out(path: Path) -> Path:
    """Beside FILE (never silently into the current directory), its `.jsonl` ending replaced by
    `.workload.jsonl` (`calls.jsonl` -> `calls.workload.jsonl`), or that appended to a name
    without it (`calls.txt` -> `calls.txt.workload.jsonl`)."""
    return path.with_name(path.name.removesuffix(".jsonl") + ".workload.jsonl")


def _write(w: Workload, output: Path, bars: ImportBars | None = None) -> None:
    from topas_bench.workloads.trace import dump_workload

    if bars is not None:
        bars("write", 0, 1)
    dump_workload(w, output)  # atomic: a temporary file renamed into place
    if bars is not None:
        bars("write", 1, 1)


def _max_tokens(w: Workload) -> str:
    mode = w.params.get("max_tokens", "exact")
    return f"cap {w.params.get('max_tokens_cap')}" if mode == "cap" else str(mode)


def _wrote(w: Workload, output: Path) -> None:
    from topas_bench.cli_common import out

    calls = sum(len(t.stages) for t in w.tasks)
    prefixes = ", ".join(f"{a.name} {a.prefix_tokens}" for a in w.agents)
    out.print(
        f"wrote {output}: {len(w.tasks)} task(s), {calls} calls, prefix mode "
        f"{w.params.get('prefix_mode', '-')}, max_tokens {_max_tokens(w)}; agent prefixes: "
        f"{prefixes}",
        markup=False,
    )
    out.print(f"run it: topas-bench run -w {output}", markup=False)
    if len(w.tasks) == 1:
        out.print(
            "one task: nothing ever queues behind it, so every scheduler gives the same JCT. "
            "Replicate the job as N tasks with Poisson arrivals when importing "
            "(`trace import FILE -n 50 --rate R`), or let `run` do it "
            f"(`topas-bench run -w {output} -n 50 --rate R --workload-param arrivals=poisson`)",
            markup=False,
        )


@trace_app.command("import")
@lists_problems
def trace_import(
    file: Annotated[
        Path, typer.Argument(help="Recorded MetaGPT call trace (JSONL).", readable=False)
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Workload trace to write (default: beside FILE, with its .jsonl ending "
            "replaced by .workload.jsonl: calls.jsonl -> calls.workload.jsonl).",
            readable=False,
        ),
    ] = None,
    tasks: Annotated[int, typer.Option("--tasks", "-n", help="Replicate the job as N tasks.")] = 1,
    rate: Annotated[
        float | None, typer.Option(help="Poisson arrival rate of the N tasks, tasks/s.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the arrivals.")] = 0,
    prefix_mode: Annotated[
        str,
        typer.Option(
            help="`cache-friendly` (system prompts whole, timestamps frozen, SOP templates in "
            "front of the content, as the MetaGPT workloads) or `faithful` (as recorded)."
        ),
    ] = "cache-friendly",
    kv_budget: Annotated[
        int | None, typer.Option("--kv-budget", help="Also check every call fits this KV budget.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Workload name (default: FILE's stem).")] = None,
    max_tokens: Annotated[
        str,
        typer.Option(
            help="What each call sends as max_tokens: `cap` (--max-tokens-cap on every call, "
            "ending at EOS after its recorded output, as MetaGPT sends it) or `exact` (the "
            "recorded length, with ignore_eos)."
        ),
    ] = "cap",
    max_tokens_cap: Annotated[
        int | None,
        typer.Option(help="The cap of --max-tokens cap (default 4096, MetaGPT's max_token)."),
    ] = None,
) -> None:
    """Turn a recorded MetaGPT call trace into a validated workload trace.

    The trace goes beside FILE unless -o: calls.jsonl -> calls.workload.jsonl. The command
    prints where it wrote and how to run it.

    Examples:
      topas-bench trace import sop-2048-offline.jsonl
      topas-bench trace import tl-2048-offline.jsonl -n 50 --rate 0.002 -o tl50.jsonl
    """
    from topas_bench.cli_common import check_not_input, check_writable_file, err
    from topas_bench.workloads.lengths import METAGPT_CAP
    from topas_bench.workloads.metagpt_import import import_trace

    if max_tokens_cap is not None and max_tokens != "cap":
        raise TopasError(f"--max-tokens-cap applies only to --max-tokens cap, not {max_tokens!r}")
    target = output or _default_out(file)
    check_writable_file(check_not_input(target, {"the call trace being imported": file}, "-o"))
    with ImportBars(err) as bars:
        w = import_trace(
            file, num_tasks=tasks, rate_per_s=rate, seed=seed, prefix_mode=prefix_mode,
            name=name, kv_budget_tokens=kv_budget, progress=bars, max_tokens=max_tokens,
            max_tokens_cap=METAGPT_CAP if max_tokens_cap is None else max_tokens_cap,
        )  # fmt: skip
        _write(w, target, bars)
    _wrote(w, target)


@trace_app.command("record")
@handles_errors
def trace_record(
    idea: Annotated[str, typer.Option(help="The one-line software idea to build.")],
    base_url: Annotated[
        str, typer.Option(help="OpenAI-compatible server, e.g. http://host:30000/v1.")
    ],
    model: Annotated[str, typer.Option(help="Model name the server serves.")],
    workflow: Annotated[str, typer.Option(help="`sop` (MetaGPT 0.8.2) or `tl` (main).")] = "sop",
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Call trace to write (JSONL).", readable=False)
    ] = Path("metagpt-calls.jsonl"),
    workload_output: Annotated[
        Path | None,
        typer.Option(
            help="Imported workload (default: beside OUTPUT, with its .jsonl ending replaced "
            "by .workload.jsonl: calls.jsonl -> calls.workload.jsonl).",
            readable=False,
        ),
    ] = None,
    keep_text: Annotated[bool, typer.Option(help="Also store prompts and completions.")] = False,
    run_tests: Annotated[bool, typer.Option(help="sop: hire the QaEngineer too.")] = False,
    api_key: Annotated[str, typer.Option(help="API key sent to the server.")] = "sk-none",
    metagpt_src: Annotated[
        Path | None, typer.Option(help="tl: a checkout of MetaGPT's main branch.", readable=False)
    ] = None,
    metagpt_venv: Annotated[
        Path | None,
        typer.Option(
            help="MetaGPT venv (default: .venvs/metagpt; tl: .venvs/metagpt-main).", readable=False
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 3600.0,
) -> None:
    """Run MetaGPT's software company in its venv, record every LLM call, import the trace.

    Needs `make metagpt-env` once (tl: `make metagpt-main-env` and a checkout of MetaGPT's main
    branch). Prompt text is kept only with --keep-text.

    Examples:
      topas-bench trace record --idea "a 2048 game" --base-url http://127.0.0.1:30000/v1 \\
        --model qwen -o calls.jsonl
      topas-bench trace record --workflow tl --metagpt-src ../MetaGPT --idea "a 2048 game" \\
        --base-url http://127.0.0.1:30000/v1 --model qwen -o tl-calls.jsonl
    """
    from topas_bench.cli_common import check_not_input
    from topas_bench.recorder.record import record
    from topas_bench.workloads.metagpt_import import import_trace

    if workload_output is not None:  # before hours of recording, not after
        check_not_input(workload_output, {"the call trace to record": output}, "--workload-output")
    rec = record(
        workflow=workflow, idea=idea, base_url=base_url, model=model, out=output,
        api_key=api_key, keep_text=keep_text, run_tests=run_tests, metagpt_src=metagpt_src,
        venv=metagpt_venv, timeout_s=timeout,
    )  # fmt: skip
    out.print(f"recorded {rec.calls} calls into {rec.out} (MetaGPT log: {rec.log})")
    w = import_trace(rec.out)
    _write(w, workload_output or _default_out(rec.out))
    _wrote(w, workload_output or _default_out(rec.out))
