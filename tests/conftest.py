"""Test-wide settings.

Hypothesis explores new random examples on every local run (and keeps failures in its local
database). Under CI (`CI=true`, a fresh clone with no database) it runs derandomized, so a
landing is judged on the same examples every time; property failures are found locally.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with slow tests first, in their own order; the rest after. `make test` spreads
    whole files over the cores (pytest-xdist, `--dist loadfile`) in collection order, so the
    long files start at once and the short ones fill in around them, instead of one long file
    starting last and running alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept otherwise
