"""`topas-bench calibrate` on a log fixture in SGLang 0.5.23's format.

The fixture is what a server of known efficiencies would log: prefill and decode batch lines
formatted exactly as `managers/scheduler_components/metrics_reporter.py` formats them (the
`[time TP0]` prefix of `configure_logger`, `cuda graph`, throughputs with two decimals, decode
lines every 40 steps), interleaved with the other lines a server prints. The fit must recover
the efficiencies it was generated with.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

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


def sglang_log(seed: int = 0, noise: float = 0.03) -> str:
    """A log of a100-qwen32b with efficiencies TRUE, in SGLang 0.5.23's line format."""
    preset = replace(load_preset("a100-qwen32b"), efficiency=TRUE)
    cost = CostModel(preset)
    rng = np.random.default_rng(seed)
    t = datetime(2026, 11, 29, 10, 1, 0)
    lines = list(NOISE)
    budget = preset.derived_kv_budget_tokens
    for i in range(60):
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
            ctx = int(rng.integers(b * 300, min(b * 3000, budget)))
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


def test_fit_recovers_the_efficiencies() -> None:
    start = load_preset("a100-qwen32b")  # eta_c 0.60, eta_w 0.72, eta_kv 0.55, c_req 4.4
    f = fit(parse_log(sglang_log(noise=0.01)), start)
    e = f.efficiency
    assert e.eta_w == pytest.approx(TRUE.eta_w, rel=0.05)
    assert e.eta_kv == pytest.approx(TRUE.eta_kv, rel=0.12)  # the weakest term
    assert e.eta_c == pytest.approx(TRUE.eta_c, rel=0.05)
    assert e.c_req_us == start.efficiency.c_req_us  # overheads are kept
    assert f.decode_rel_err < 0.03 and f.prefill_rel_err < 0.03
    assert (f.decode_lines, f.prefill_lines) == (40, 20)


def test_calibrate_cli_writes_a_loadable_preset(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(sglang_log())
    out = tmp_path / "a100-qwen32b-cal.toml"
    res = CliRunner().invoke(app, ["calibrate", str(log), "--preset", "a100-qwen32b", "-o",
                                   str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "fitted from 40 decode and 20 prefill lines" in res.output
    p = load_preset_file(out)
    assert p.name == "a100-qwen32b-cal" and p.model == load_preset("a100-qwen32b").model
    assert p.efficiency.eta_w == pytest.approx(TRUE.eta_w, rel=0.05)


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
