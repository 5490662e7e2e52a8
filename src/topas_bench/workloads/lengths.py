"""What a workload's client sends as `max_tokens`: the workload parameter ``max_tokens``.

A stage has two lengths (`model.Stage`): ``output_tokens``, the true output, which only the
engine knows (it ends the call there), and ``max_new_tokens``, the cap the client sends, which
is all a server, and so a policy, sees of the output (unless the run gives every policy the
true lengths with ``--length-hint oracle``). The parameter chooses the cap:

- ``exact``: ``max_new_tokens`` = the true output length, sent with ``ignore_eos`` (a benchmark
  client replaying fixed trajectories, as SGLang's ``bench_serving`` does). The server then
  knows every call's length exactly, and so does any policy that reads ``max_new_tokens``
  (TOPAS's admission need, SGLang's ``lof``, the KV reservation), while the others estimate.
- ``cap``: ``max_new_tokens`` = ``max_tokens_cap`` (default 4,096) on every call, and the call
  ends at EOS after its true output, as a real MetaGPT client sends it: MetaGPT's
  ``LLMConfig.max_token`` defaults to 4096 and every call sends it (docs/metagpt-facts.md).
  The server sees the same cap on every call, so no policy learns a length it did not estimate.
- ``file`` (trace files only, their default): each stage's own ``max_new_tokens``.

``max_tokens_cap`` is used only in ``cap`` mode; it must be at least every call's output (a
real client with a smaller cap would cut the output short, which a workload of fixed lengths
cannot express). Defaults per family (README, "Length information"): ``cap`` for the MetaGPT
workloads, ``metagpt-replay`` and ``trace import``; ``exact`` for the synthetic DAGs; ``file``
for trace files.

A cell's identity names the setting only when it differs from what cells made before the
setting existed used (`legacy`: ``exact``, or ``file`` for a trace file), so those cells keep
their identities and read as what they are (`describe`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.workloads.model import DEFAULT_MAX_NEW_TOKENS, Stage, Task

#: The parameter names.
MODE, CAP = "max_tokens", "max_tokens_cap"
#: Modes of a generator (and `trace import`); a trace file also takes ``file``.
MODES = ("exact", "cap")
FILE_MODES = ("file", *MODES)
#: MetaGPT's `LLMConfig.max_token` (its default; every call sends it).
METAGPT_CAP = DEFAULT_MAX_NEW_TOKENS
#: The workload a trace file runs as (`registry.resolve`); its legacy mode is ``file``.
TRACE = "trace"


def check_mode(value: object, modes: Sequence[str] = MODES) -> str:
    if value not in modes:
        raise TopasError(f"{MODE} must be one of {', '.join(modes)}, got {value!r}")
    return str(value)


def check_cap(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopasError(f"{CAP} must be a positive integer, got {value!r}")
    return value


def max_new_tokens(mode: str, cap: int, stage: Stage) -> int:
    """The `max_new_tokens` a client in `mode` sends for `stage` (``file``: its own)."""
    if mode == "exact":
        return stage.output_tokens
    if mode == "cap":
        if stage.output_tokens > cap:
            raise TopasError(
                f"{CAP} {cap:,} is below a call's output of {stage.output_tokens:,} tokens "
                f"(stage {stage.id}); raise it, or use {MODE}=exact"
            )
        return cap
    return stage.max_new_tokens


def apply(stages: Sequence[Stage], mode: str, cap: int) -> tuple[Stage, ...]:
    """`stages` with the `max_new_tokens` a client in `mode` sends; true outputs unchanged."""
    out = []
    for s in stages:
        n = max_new_tokens(mode, cap, s)
        out.append(s if n == s.max_new_tokens else replace(s, max_new_tokens=n))
    return tuple(out)


def apply_tasks(tasks: Sequence[Task], mode: str, cap: int) -> tuple[Task, ...]:
    if mode == "file":
        return tuple(tasks)
    return tuple(replace(t, stages=apply(t.stages, mode, cap)) for t in tasks)


def legacy(workload: str) -> str:
    """The mode of a cell whose identity does not name one: what `workload` sent before the
    setting existed (generators: exact lengths; a trace file: its own caps)."""
    return "file" if workload == TRACE else "exact"


def setting(workload: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The length setting of a workload's recorded (or an identity's) parameters, legacy when
    they do not name one: ``{"max_tokens": mode}``, plus ``max_tokens_cap`` in ``cap`` mode."""
    mode = str(params.get(MODE, legacy(workload)))
    out: dict[str, Any] = {MODE: mode}
    if mode == "cap":
        out[CAP] = int(params.get(CAP, METAGPT_CAP))
    return out


def identity_params(
    workload: str, given: Mapping[str, Any], resolved: Mapping[str, Any]
) -> dict[str, Any]:
    """The workload parameters a cell's identity records: those `given`, with the length
    setting as `resolved` (the generated workload's parameters) says, named only when it is
    not the legacy one, so cells of different settings never share an identity, and cells made
    before the setting existed keep theirs."""
    out = {k: v for k, v in given.items() if k not in (MODE, CAP)}
    s = setting(workload, resolved)
    if s[MODE] != legacy(workload):
        out |= s
    return out


def generation_params(workload: str, identity_params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters that generate the workload of a cell with `identity_params`: the legacy mode
    named when they name none (a family's default may not be the legacy one)."""
    return {MODE: legacy(workload), **identity_params}


def describe(workload: str, identity_params: Mapping[str, Any]) -> str:
    """``max_tokens=exact``, ``max_tokens=cap 4096`` or ``max_tokens=file``: the setting of a
    cell from its identity's workload parameters (none named: the legacy one)."""
    s = setting(workload, identity_params)
    return f"{MODE}={s[MODE]}" + (f" {s[CAP]}" if CAP in s else "")


def lengths_line(workload: str, params: Mapping[str, Any], oracle: bool = False) -> str:
    """The line `run` prints: what the client sends as max_tokens (from the generated
    workload's `params`), and so what the policies know of output lengths."""
    s = setting(workload, params)
    if s[MODE] == "cap":
        how = (
            f"every call sends max_tokens {s[CAP]:,} and ends at EOS: policies see the cap, "
            "not the lengths"
        )
    elif s[MODE] == "exact":
        how = "each call sends its output length with ignore_eos: the server sees every length"
    else:
        how = "each stage's own max_new_tokens, as in the file"
    line = f"lengths: {MODE}={s[MODE]} ({how})"
    if oracle:
        line += "; length hint oracle: policies see true output lengths"
    return line


def check_given(where: str, given: Mapping[str, Any], mode: str) -> None:
    """A cap given with another mode would be ignored: an error, not a silent no-op. `where`
    starts the message (``workload 'dag4'``)."""
    if CAP in given and mode != "cap":
        raise TopasError(f"{where}: {CAP} applies only to {MODE}=cap (this run: {MODE}={mode})")
