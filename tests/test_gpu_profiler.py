"""`topas-bench profile`: the shapes it builds from presets, and its CPU path on a tiny shape,
end to end through `calibrate --profile`.

torch is not a dependency of the project; the CPU run uses the SGLang CPU venv's torch
(`make sglang-env`, built on first use as tests/test_sglang_adapter.py does). On a GPU the same
command times CUDA graphs and the peak checks too: that is not run here (no GPU in CI).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.runners.sim.cost import load_preset, load_preset_file
from topas_bench.runners.sim.gpu_profiler import TINY, Shape
from topas_bench.runners.sim.iteration_profile import read_profile

REPO = Path(__file__).resolve().parents[1]
VENV_PYTHON = REPO / ".venvs" / "sglang" / "bin" / "python"

TINY_PRESET = """
name = "tiny-cpu"
description = "the profiler's tiny shape on a CPU"
[gpu]
name = "cpu"
peak_tflops = 1.0
hbm_tbps = 0.05
memory_gb = 8.0
host_link_gbps = 10.0
[model]
name = "tiny"
params_b = 0.0003
n_layers = 2
n_q_heads = 4
n_kv_heads = 2
head_dim = 16
weight_gb = 0.0006
"""


@pytest.mark.parametrize(
    ("preset", "shape"),
    [
        ("h200-llama8b", Shape("h200-llama8b", 32, 4096, 32, 8, 128, 14336, 128256)),
        ("h200-qwen32b", Shape("h200-qwen32b", 64, 5120, 40, 8, 128, 27648, 152064)),
    ],
)
def test_shape_from_preset_is_the_real_model(preset: str, shape: Shape) -> None:
    assert Shape.from_preset(load_preset(preset)) == shape


def test_shape_of_a_preset_without_its_vocabulary_needs_one() -> None:
    with pytest.raises(TopasError, match="give --vocab"):
        Shape.from_preset(load_preset("a100-qwen32b"))
    shape = Shape.from_preset(load_preset("a100-qwen32b"), vocab=152064)
    assert (shape.intermediate, shape.layers, shape.tied) == (27648, 64, False)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_profile_without_torch_says_what_it_needs(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["profile", "--tiny", "-o", str(tmp_path / "p.jsonl")])
    assert res.exit_code != 0 and "needs torch" in res.output


@pytest.mark.slow
def test_tiny_cpu_profile_reads_and_fits(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.fail("`make` is needed to build the SGLang CPU venv (make sglang-env)")
    subprocess.run(["make", "-s", "sglang-env"], cwd=REPO, check=True, timeout=2400)
    out = tmp_path / "tiny.jsonl"
    cmd = [str(VENV_PYTHON), "-c", "from topas_bench.cli import main; main()", "profile",
           "--tiny", "--reps", "3", "-o", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "tiny: 14 points timed" in proc.stdout

    prof = read_profile([out], "tiny")
    assert len(prof.points) == 14 and {p.timing for p in prof.points} == {"eager"}
    assert prof.shape_info is not None and prof.shape_info["vocab"] == TINY.vocab
    assert {p.kind for p in prof.points} == {"prefill", "decode"}

    preset = tmp_path / "tiny-cpu.toml"
    preset.write_text(TINY_PRESET)
    fitted = tmp_path / "fitted.toml"
    res = CliRunner().invoke(app, ["calibrate", "--profile", str(out), "--shape", "tiny",
                                   "--preset", str(preset), "-o", str(fitted)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "14 eager-timed points" in res.output
    model = load_preset_file(fitted).model
    assert model.lm_head_params_b == pytest.approx(TINY.vocab * TINY.hidden / 1e9, abs=1e-4)
