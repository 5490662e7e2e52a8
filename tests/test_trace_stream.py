"""Reading traces as streams (issue 24): the fast path agrees with the detailed checker, the
bounded check with the one that keeps a dict of keys; gzip, a BOM, CRLF, duplicate JSON keys,
long lines, no tasks, paths that are not files; `run -n` reading only its first tasks."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz_targets import VALID_TRACE, mutated_lines
from topas_bench.errors import TopasError
from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import (
    TraceError,
    dumps_workload,
    load_workload,
    loads_workload,
    stream,
    validate_file,
    workload,
)
from topas_bench.workloads.trace.read import MAX_LINE_BYTES, text_lines
from topas_bench.workloads.trace.stream import check_lines

EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "writer-reviewer.jsonl"


def _outcome(text: str, **kw: Any) -> tuple[list[tuple[int | None, str, str]], Any]:
    """(sorted problems, the workload or None) of checking `text`."""
    lines = list(text_lines(text))
    fetch = None
    if kw.get("bounded"):
        rows = {n: raw for n, _, raw in lines if isinstance(raw, bytes)}

        def fetch(wanted: set[int]) -> Any:
            return iter([(n, json.loads(rows[n])) for n in sorted(wanted)])

    try:
        w, _ = check_lines(lines, "t", fetch=fetch, **kw)
    except TraceError as e:
        return sorted((p.line, p.field, p.message) for p in e.problems), None
    return [], w


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(mutated_lines(VALID_TRACE.splitlines()))
def test_fast_path_and_bounded_check_agree_with_the_detailed_checker(text: str) -> None:
    reference = _outcome(text, fast=False)
    assert _outcome(text) == reference
    problems, _ = _outcome(text, keep=False, bounded=True)
    assert problems == reference[0]


def _two_tasks_sharing(key_tokens: tuple[int, int]) -> str:
    lines = EXAMPLE.read_text().splitlines()[:3]
    rows = [json.loads(line) for line in lines]
    for row, tokens in zip(rows[1:], key_tokens, strict=True):
        row["stages"][0]["prompt"].append(["shared/doc", tokens])
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_key_with_two_lengths_in_two_tasks_is_named_in_every_mode(tmp_path: Path) -> None:
    text = _two_tasks_sharing((50, 51))
    expected = [
        (3, "stages[0].prompt[2].tokens",
         "'shared/doc' is 51 tokens here but 50 at line 2, stages[0].prompt[2].tokens (equal keys"
         " must mean equal tokens)"),
    ]  # fmt: skip
    assert _outcome(text)[0] == expected
    assert _outcome(text, keep=False, bounded=True)[0] == expected
    path = tmp_path / "w.jsonl"
    path.write_text(text)
    with pytest.raises(TraceError) as e:
        validate_file(path)
    assert [(p.line, p.field, p.message) for p in e.value.problems] == expected
    validate_file(_write(tmp_path / "ok.jsonl", _two_tasks_sharing((50, 50))))


def test_hash_collisions_are_told_apart_by_a_second_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream, "hash", lambda _: 7, raising=False)  # every key collides
    path = _write(tmp_path / "w.jsonl", dumps_workload(generate("dag4", num_tasks=20, seed=1)))
    assert validate_file(path).tasks == 20
    bad = _write(tmp_path / "bad.jsonl", _two_tasks_sharing((50, 51)))
    with pytest.raises(TraceError, match="'shared/doc' is 51 tokens here but 50 at line 2"):
        validate_file(bad)


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_gzip_bom_and_crlf_read_transparently(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    expected = load_workload(EXAMPLE)
    files = {
        "gz.jsonl.gz": gzip.compress(text.encode()),
        "gz-named-plainly.jsonl": gzip.compress(text.encode()),
        "bom.jsonl": b"\xef\xbb\xbf" + text.encode(),
        "crlf.jsonl": text.replace("\n", "\r\n").encode(),
        "bom-crlf.gz": gzip.compress(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode()),
    }
    for name, data in files.items():
        path = _write(tmp_path / name, data)
        assert load_workload(path) == expected, name
        assert validate_file(path).calls == 9, name
    assert loads_workload("\ufeff" + text) == expected
    broken = _write(tmp_path / "cut.jsonl.gz", gzip.compress(text.encode())[:-20])
    with pytest.raises(TopasError, match="cannot read trace past line"):
        validate_file(broken)


def test_duplicate_json_keys_are_refused_with_their_line() -> None:
    header, task, *_ = EXAMPLE.read_text().splitlines()
    twice = task.replace('"id":"job1"', '"id":"job1","id":"job9"', 1)
    assert twice != task
    with pytest.raises(TraceError) as e:
        loads_workload(f"{header}\n{twice}\n", source="d.jsonl")
    assert e.value.report() == "d.jsonl:2: task: invalid JSON: key 'id' appears twice in one object"
    nested = task.replace('"kind":"draft"', '"kind":"draft","kind":"x"', 1)
    with pytest.raises(TraceError, match="key 'kind' appears twice"):
        loads_workload(f"{header}\n{nested}\n")


def test_a_header_without_tasks_is_refused_everywhere(tmp_path: Path) -> None:
    header = EXAMPLE.read_text().splitlines()[0]
    path = _write(tmp_path / "empty.jsonl", header + "\n\n")
    for check in (validate_file, load_workload):
        with pytest.raises(TraceError, match="the trace has no tasks"):
            check(path)
    with pytest.raises(TraceError, match="the trace has no tasks"):
        workload.defaults({"file": str(path)})


def test_a_line_past_the_limit_is_a_problem_not_a_memory_spike(tmp_path: Path) -> None:
    header, *tasks = EXAMPLE.read_text().splitlines()
    path = tmp_path / "long.jsonl"
    with path.open("w") as f:
        f.write(header + "\n" + tasks[0] + "\n")
        f.write('{"id": "' + "x" * (MAX_LINE_BYTES + 10) + '"}\n')
        f.write(tasks[1] + "\n")
    with pytest.raises(TraceError) as e:
        validate_file(path)
    assert [(p.line, p.message) for p in e.value.problems] == [
        (3, "line longer than 64 MiB; not read")
    ]


@pytest.mark.parametrize("path", ["/", "/dev/null"])
def test_a_path_that_is_not_a_file_says_what_it_is(path: str) -> None:
    what = "is a directory" if path == "/" else "is a character device"
    with pytest.raises(TopasError, match=f"{path}: cannot read trace: {what}, not a regular file"):
        validate_file(path)
    with pytest.raises(TopasError, match=f"workload file {path}: {what}"):
        generate(path, num_tasks=1)


def test_validation_keeps_no_task(tmp_path: Path) -> None:
    """Bounded memory: `validate_file` holds a task id and a few integers per key, not tasks;
    `load_workload` (what a full run needs) holds the tasks."""
    path = _write(tmp_path / "w.jsonl", dumps_workload(generate("metagpt-tl", num_tasks=3000)))

    def peak(fn: Any) -> int:
        tracemalloc.start()
        try:
            fn(path)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    assert peak(validate_file) * 5 < peak(load_workload)


def test_run_reads_only_the_first_tasks_of_a_big_file(tmp_path: Path) -> None:
    full = generate("dag4", num_tasks=40, seed=2)
    path = _write(tmp_path / "w.jsonl", dumps_workload(full))
    first = generate(str(path), num_tasks=10)
    assert [t.id for t in first.tasks] == [t.id for t in full.tasks[:10]]
    assert first.tasks == full.tasks[:10]  # at the file's own rate: as recorded
    # a broken stage on a line the run does not use is not read; a broken arrival is
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    last["stages"][0]["agent"] = "nobody"
    _write(path, "\n".join([*lines[:-1], json.dumps(last, separators=(",", ":"))]) + "\n")
    workload._scan.cache_clear()
    assert generate(str(path), num_tasks=10).tasks == full.tasks[:10]
    with pytest.raises(TraceError, match="unknown agent 'nobody'"):
        generate(str(path), num_tasks=40)
    last["arrival_s"] = -1
    _write(path, "\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    with pytest.raises(TraceError, match="line 41, arrival_s: expected a finite number"):
        generate(str(path), num_tasks=10)
