"""The interpreters the SGLang engine and the router are started with are probed first: one that
cannot be started is one line naming the option, one that lacks a package says which."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from topas_bench.errors import TopasError
from topas_bench.runners.sglang.launcher import check_server_python, run_probe
from topas_bench.runners.sglang.router import router_python


def test_an_interpreter_that_cannot_start_names_the_option(tmp_path: Path) -> None:
    not_a_program = tmp_path / "python"
    not_a_program.write_text("not executable")
    with pytest.raises(TopasError, match=r"^--server-python .*/python: cannot run it \("):
        check_server_python(str(not_a_program), "--server-python")
    with pytest.raises(TopasError, match=r"^--router-python .*/python: cannot run it \("):
        router_python(str(not_a_program))


def test_a_probe_runs_the_code_and_an_interpreter_without_sglang_is_named() -> None:
    assert run_probe(sys.executable, "print(6 * 7)", "--x").stdout.strip() == "42"
    with pytest.raises(TopasError, match="lacks sglang"):
        check_server_python(sys.executable, "--server-python")  # this venv has no SGLang
