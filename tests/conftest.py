"""Test-wide settings.

Hypothesis explores new random examples on every local run (and keeps failures in its local
database). Under CI (`CI=true`, a fresh clone with no database) it runs derandomized, so a
landing is judged on the same examples every time; property failures are found locally.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
