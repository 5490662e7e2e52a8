"""The scripted OpenAI-compatible responder as a child process on 127.0.0.1 (stopped by pid),
shared by the recorder tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def running_responder(*args: str) -> Iterator[str]:
    """Start `python -m topas_bench.recorder.responder --port 0 ARGS`; yield its base URL."""
    child = subprocess.Popen(
        [sys.executable, "-m", "topas_bench.recorder.responder", "--port", "0", *args],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("listening on "), line
        yield line.split()[-1]
    finally:
        child.terminate()
        child.wait(timeout=10)
