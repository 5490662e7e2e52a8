"""The line a server logs when a tagged request arrives, and its parser.

With several replicas behind sglang-router, the client does not learn which replica served a
call (SGLang leaves `system_fingerprint` empty). The topas plugin logs one line per request
with task metadata, in the server's own log; each replica's log then names the calls it served
(`replicas.replica_tables`). Ids are JSON strings, so any id survives the round trip.
"""

from __future__ import annotations

import json
import re

PREFIX = "topas: request "
_LINE = re.compile(r"topas: request task=(\"(?:[^\"\\]|\\.)*\") stage=(\"(?:[^\"\\]|\\.)*\")")


def line(task: str, stage: str) -> str:
    """What the plugin logs for a request of stage `stage` of task `task`."""
    return f"{PREFIX}task={json.dumps(task)} stage={json.dumps(stage)}"


def served(log_text: str) -> set[tuple[str, str]]:
    """The (task, stage) pairs a server's log says it received."""
    out = set()
    for m in _LINE.finditer(log_text):
        try:
            task, stage = json.loads(m.group(1)), json.loads(m.group(2))
        except ValueError:
            continue
        if isinstance(task, str) and isinstance(stage, str):
            out.add((task, stage))
    return out
