"""`topas-bench calibrate` on a log fixture in SGLang 0.5.23's format.

The fixture is what a server of known efficiencies would log: prefill and decode batch lines
formatted exactly as `managers/scheduler_components/metrics_reporter.py` formats them (the
`[time TP0]` prefix of `configure_logger`, `cuda graph`, throughputs with two decimals, decode
lines every 40 steps), interleaved with the other lines a server prints. The fit must recover
the efficiencies it was generated with.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from topas_bench.cli import app
from topas_bench.runners.sglang.calibrate import fit, parse_log, timeline_from_log
from topas_bench.runners.sim.cost import CostModel, Efficiency, load_preset, load_preset_file

TRUE = Efficiency(eta_c=0.48, eta_w=0.81, eta_kv=0.62, c_step_us=130.0, c_layer_us=32.0,
                  c_req_us=6.5)  # fmt: skip
NOISE = [
    "[2026-11-29 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-32B-Instruct', ...)",
    "[2026-11-29 10:00:31 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=13.05 GB, mem usage=65.62 GB.",
    "[2026-11-29 10:00:33 TP0] KV Cache is allocated. #tokens: 18692, K size: 2.28 GB, "
    "V size: 2.28 GB",
    '[2026-11-29 10:00:40] INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 OK',
    "[2026-11-29 10:00:41 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
    "#new_tokens_gained: 512, #new_token_ratio: 0.3000 -> 0.4500",
]


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def ok(*args: str | Path) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def sglang_log(
    seed: int = 0, noise: float = 0.03, batches: int = 60, context: tuple[int, int] | None = None
) -> str:
    """A log of a100-qwen32b with efficiencies TRUE, in SGLang 0.5.23's line format: `batches`
    batch lines, a third prefill; a decode batch of B requests holds 300-3000 tokens of context
    per request (up to the KV budget), or a total drawn from `context` if given."""
    preset = replace(load_preset("a100-qwen32b"), efficiency=TRUE)
    cost = CostModel(preset)
    rng = np.random.default_rng(seed)
    t = datetime(2026, 11, 29, 10, 1, 0)
    lines = list(NOISE)
    budget = preset.derived_kv_budget_tokens
    for i in range(batches):
        t += timedelta(seconds=int(rng.integers(0, 3)))
        stamp = t.strftime("%Y-%m-%d %H:%M:%S")
        if i % 3 == 0:
            seqs = int(rng.integers(1, 3))
            per = int(rng.integers(1100, 4000))
            cached = int(rng.integers(0, 3000))
            dur = cost.prefill_s([(cached, per)] * seqs) * (1 + noise * rng.standard_normal())
            new = per * seqs
            lines.append(
                f"[{stamp} TP0] Prefill batch, #new-seq: {seqs}, #new-token: {new}, "
                f"#cached-token: {cached * seqs}, token usage: {rng.uniform(0.1, 0.9):.2f}, "
                f"#running-req: {int(rng.integers(0, 30))}, #queue-req: {int(rng.integers(0, 9))}, "
                f"#pending-token: 0, cuda graph: False, input throughput (token/s): {new / dur:.2f}"
            )
        else:
            b = int(rng.integers(1, 48))
            lo, hi = context or (b * 300, min(b * 3000, budget))
            ctx = int(rng.integers(lo, hi))
            step = cost.decode_step_s(b, ctx) * (1 + noise * rng.standard_normal())
            lines.append(
                f"[{stamp} TP0] Decode batch, #running-req: {b}, #token: {ctx}, "
                f"token usage: {ctx / budget:.2f}, cuda graph: True, "
                f"gen throughput (token/s): {b / step:.2f}, #queue-req: {int(rng.integers(0, 9))}"
            )
    return "\n".join(lines) + "\n"


def test_parse_reads_both_line_kinds_and_skips_the_rest() -> None:
    b = parse_log(sglang_log())
    assert len(b.prefill) == 20 and len(b.decode) == 40
    first = b.prefill.iloc[0]
    assert first["new"] >= 1100 and first["duration_s"] > 0
    assert (b.decode["step_s"] > 0).all() and (b.decode["running"] >= 1).all()
    tl = timeline_from_log(sglang_log())
    assert len(tl) == 60 and set(tl["kind"]) == {"prefill", "decode"}
    assert tl["t_s"].is_monotonic_increasing


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_the_efficiencies_from_a_long_log(seed: int) -> None:
    """1000 decode lines (about half an hour of serving) over the whole KV budget, 3% noise."""
    start = load_preset("a100-qwen32b")  # eta_c 0.60, eta_w 0.72, eta_kv 0.55, c_req 4.4
    f = fit(parse_log(sglang_log(seed, batches=1500)), start)
    e = f.efficiency
    assert e.eta_w == pytest.approx(TRUE.eta_w, rel=0.02)
    assert e.eta_kv == pytest.approx(TRUE.eta_kv, rel=0.10)  # the weakest term
    assert e.eta_c == pytest.approx(TRUE.eta_c, rel=0.03)
    assert e.c_req_us == pytest.approx(TRUE.c_req_us, abs=3.0) and f.c_req_se_us < 4.0
    assert f.eta_kv is not None and f.eta_kv.low < TRUE.eta_kv < f.eta_kv.high
    assert f.eta_kv.determined and f.warnings == ()
    assert f.decode_rel_err < 0.025 and f.prefill_rel_err < 0.04  # 3% noise: median 2%
    assert (f.decode_lines, f.prefill_lines) == (1000, 500)


@pytest.mark.parametrize("seed", range(5))
def test_a_short_log_warns_that_eta_kv_is_poorly_determined(seed: int) -> None:
    """40 decode lines at 3% noise cannot pin eta_kv down: an interval and a warning, and a
    value the noise does not throw far off (before the priors, seeds 0-1 gave 0.85 and 0.82)."""
    f = fit(parse_log(sglang_log(seed)), load_preset("a100-qwen32b"))
    assert f.eta_kv is not None and not f.eta_kv.determined
    assert f.eta_kv.low < TRUE.eta_kv < f.eta_kv.high
    assert f.efficiency.eta_kv == pytest.approx(TRUE.eta_kv, rel=0.20)
    assert f.efficiency.eta_w == pytest.approx(TRUE.eta_w, rel=0.03)
    (warning,) = f.warnings
    assert (
        warning.startswith("eta_kv is poorly determined by this log") and "95% interval" in warning
    )


def test_little_spread_in_context_warns_even_over_a_long_log() -> None:
    start = load_preset("a100-qwen32b")
    f = fit(parse_log(sglang_log(batches=1500, context=(9000, 9500))), start)
    assert f.eta_kv is not None and not f.eta_kv.determined
    (warning,) = f.warnings
    assert re.search(r"spans 9,0\d\d-9,4\d\d tokens over (1000|99\d) lines", warning), warning
    # the log says little, so the value stays between the preset's and the truth
    assert start.efficiency.eta_kv * 0.9 < f.efficiency.eta_kv < TRUE.eta_kv * 1.1


def test_outlying_decode_lines_are_dropped() -> None:
    """Lines whose interval included a prefill look several times slower: dropped, not fitted."""
    log = sglang_log(batches=600)
    text, n = [], 0
    for line in log.splitlines():
        if "Decode batch" in line and n < 20:
            n += 1
            head, tput = line.rsplit("gen throughput (token/s): ", 1)
            value, rest = tput.split(",", 1)
            line = f"{head}gen throughput (token/s): {float(value) / 3:.2f},{rest}"
        text.append(line)
    f = fit(parse_log("\n".join(text)), load_preset("a100-qwen32b"))
    assert f.decode_outliers >= 20
    assert f.efficiency.eta_w == pytest.approx(TRUE.eta_w, rel=0.03)
    assert f.efficiency.eta_kv == pytest.approx(TRUE.eta_kv, rel=0.15)


def test_calibrate_cli_writes_a_loadable_preset(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(sglang_log())
    out = tmp_path / "a100-qwen32b-cal.toml"
    res = CliRunner().invoke(app, ["calibrate", str(log), "--preset", "a100-qwen32b", "-o",
                                   str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "fitted from 40 decode and 20 prefill lines" in res.output
    assert "warning: eta_kv is poorly determined by this log" in res.stderr
    p = load_preset_file(out)
    assert p.name == "a100-qwen32b-cal" and p.model == load_preset("a100-qwen32b").model
    assert p.efficiency.eta_w == pytest.approx(TRUE.eta_w, rel=0.05)
    assert "# warning: eta_kv is poorly determined" in out.read_text()


def test_calibrate_errors_are_clear(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("\n".join(NOISE))
    out = tmp_path / "x.toml"
    r = CliRunner().invoke(app, ["calibrate", str(empty), "--preset", "a100-qwen32b", "-o",
                                 str(out)])  # fmt: skip
    assert r.exit_code == 2 and "0 usable decode batch lines" in r.output
    r = CliRunner().invoke(app, ["calibrate", str(tmp_path / "nope.log"), "--preset",
                                 "a100-qwen32b", "-o", str(out)])  # fmt: skip
    assert r.exit_code == 2 and "cannot read log" in r.output


def test_run_and_sweep_use_a_calibrated_preset_file(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(sglang_log())
    cal = tmp_path / "cal.toml"
    ok("calibrate", log, "--preset", "a100-qwen32b", "-o", cal)
    out = tmp_path / "runs"
    run = ("run", "-w", "chain3", "-s", "fcfs", "-n", "2", "--out", out, "--preset")
    res = ok(*run, cal)
    name = load_preset(str(cal)).name
    assert name.startswith("cal@") and f"preset {name} (A100" in res.output
    (cell,) = (out / "chain3" / "fcfs").iterdir()
    stored = json.loads((cell / "run.json").read_text())["identity"]
    assert stored["preset"] == name and cell.name.startswith(f"sim-{name}-")
    # another file of the same name with other values is another run, not a reuse
    other = tmp_path / "other" / "cal.toml"
    other.parent.mkdir()
    other.write_text(cal.read_text().replace("eta_c = ", "eta_c = 0.9 #"))
    assert "(cached)" not in ok(*run, other).output
    assert len(list((out / "chain3" / "fcfs").iterdir())) == 2
    assert "(cached)" in ok(*run, cal).output
    sweep = ok("sweep", "-w", "chain3", "-s", "fcfs", "--rate", "0.1", "-n", "2", "--preset",
               cal, "--out", tmp_path / "sweep")  # fmt: skip
    assert "1 cells: 1 ran" in sweep.output


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_bad_preset_file_is_a_one_line_error(tmp_path: Path, command: str) -> None:
    absent = tmp_path / "absent.toml"
    r = invoke(command, "-w", "chain3", "-s", "fcfs", "-n", "2", "--preset", absent)
    assert r.exit_code == 2 and f"cannot read preset file '{absent}'" in r.output, r.output
    bad = tmp_path / "bad.toml"
    bad.write_text("name = ")
    r = invoke(command, "-w", "chain3", "-s", "fcfs", "-n", "2", "--preset", bad)
    assert r.exit_code == 2 and f"{bad}: invalid TOML" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
