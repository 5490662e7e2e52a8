"""Hostile stored results and hostile file encodings (issue 30), shared by the fuzz suite
(`tests/test_fuzz.py`) and its census (`benchmarks/fuzz_census.py`).

Stored results: a real results tree (dag4, fcfs and topas, two seeds) damaged the ways disks and
people damage files: bytes flipped anywhere in a table or run.json, a span zeroed, a file cut
short or grown, one cell's table (or run.json) copied over another's. The promise: never a
silent change. A cell whose files changed in any byte is refused by `check_cell` (one line),
and every cell `collect` still takes reports exactly the numbers it did before.

Encodings: the sweep file and the preset file as UTF-16, UTF-32, Latin-1, with a BOM, with
lone surrogate escapes, NULs, cut multi-byte sequences, or binary: `sweep --config` and `run
--preset` exit 0 or 2, a refusal one `error:` line, never a traceback. (The trace files'
encodings are in `trace_mutations.traces`, through `validate` and `run`.)
"""

from __future__ import annotations

import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
from hypothesis import strategies as st

from fuzz_targets import classify, invoke
from topas_bench.analysis.collect import collect
from topas_bench.cell.stored import check_cell
from topas_bench.results import TABLES
from topas_bench.runners.sim.preset import _PRESETS

FILES = (*(f"{t}.parquet" for t in TABLES), "run.json")
CELLS = ("fcfs-s0", "fcfs-s1", "topas-s0", "topas-s1")


@cache
def stored_tree() -> Path:
    """The pristine tree, written once per process (4 cells, a second or two)."""
    out = Path(tempfile.mkdtemp(prefix="fuzz-stored-")) / "t"
    args = ["-w", "dag4", "-s", "fcfs,topas", "-n", "4", "--rate", "0.1", "--seeds", "0,1"]
    result = invoke("sweep", *args, "-j", "1", "--out", out)
    assert result.exit_code == 0, result.output
    return out


def _cell(root: Path, name: str) -> Path:
    scheduler, seed = name.split("-")
    (d,) = (root / "dag4" / scheduler).glob(f"*-{seed}-*")
    return d


@st.composite
def damages(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """One to three damages, each (what, cell, file, ...)."""
    out: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 3))):
        cell, file = draw(st.sampled_from(CELLS)), draw(st.sampled_from(FILES))
        how = draw(st.sampled_from(["flip", "flip", "flip", "zero", "cut", "grow", "swap"]))
        at = draw(st.floats(0, 1))
        if how == "flip":
            out.append((how, cell, file, at, draw(st.integers(0, 7))))
        elif how == "zero":
            out.append((how, cell, file, at, draw(st.integers(1, 64))))
        elif how in ("cut", "grow"):
            out.append((how, cell, file, at, draw(st.binary(min_size=1, max_size=16))))
        else:  # another cell's file over this one's
            out.append((how, cell, file, draw(st.sampled_from(CELLS))))
    return out


def _apply(root: Path, damage: tuple[Any, ...]) -> None:
    how, cell, file, *rest = damage
    path = _cell(root, cell) / file
    data = bytearray(path.read_bytes())
    at = max(min(int(rest[0] * len(data)), len(data) - 1), 0) if how != "swap" else 0
    if how in ("flip", "zero") and not data:  # a file an earlier damage cut to nothing
        return
    if how == "flip":
        data[at] ^= 1 << rest[1]
    elif how == "zero":
        data[at : at + rest[1]] = bytes(len(data[at : at + rest[1]]))
    elif how == "cut":
        del data[at:]
    elif how == "grow":
        data[at:at] = rest[1]
    else:
        data = bytearray((_cell(root, rest[0]) / file).read_bytes())
    path.write_bytes(bytes(data))


def _rows(root: Path) -> dict[str, dict[str, Any]]:
    """Each cell's report row (metrics), by cell name; the cells `collect` takes."""
    runs = collect(root).runs if any(check_cell(_cell(root, c)) is None for c in CELLS) else None
    if runs is None:
        return {}
    names = {str(_cell(root, c)): c for c in CELLS}
    metrics = [c for c in runs.columns if runs[c].dtype.kind == "f"]
    return {names[r["path"]]: {m: r[m] for m in metrics} for _, r in runs.iterrows()}


@cache
def _pristine() -> tuple[dict[str, dict[str, bytes]], dict[str, dict[str, Any]]]:
    root = stored_tree()
    files = {c: {f: (_cell(root, c) / f).read_bytes() for f in FILES} for c in CELLS}
    return files, _rows(root)


def check_stored_damage(damage: list[tuple[Any, ...]]) -> str:
    """``rejected`` (some cell refused, the others report as before), ``ok`` (nothing
    changed), or ``crash`` (a changed cell taken, a number moved, a message not one line)."""
    files, rows = _pristine()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        shutil.copytree(stored_tree(), root)
        for d in damage:
            _apply(root, d)
        changed = set()
        for c in CELLS:
            problem = check_cell(_cell(root, c))
            now = {f: (_cell(root, c) / f).read_bytes() for f in FILES}
            if problem is None and now != files[c]:
                return "crash"  # changed, yet verified
            if problem is not None:
                if "\n" in problem or len(problem) > 500:
                    return "crash"
                changed.add(c)
        try:
            kept = _rows(root)
        except Exception:
            return "crash"
        if set(kept) != set(CELLS) - changed:
            return "crash"
        for c, metrics in kept.items():
            if not all((pd.isna(v) and pd.isna(rows[c][m])) or v == rows[c][m]
                       for m, v in metrics.items()):  # fmt: skip
                return "crash"
        if not changed:
            return "ok"
        result = invoke("report", root, "--quiet", "--out", Path(tmp) / "rep")
        lines = result.stderr.strip().splitlines()
        refused = (
            result.exit_code == 2 and "Traceback" not in result.output and lines
            and lines[-1].startswith("error: ")
            and all(x.startswith(("bad run: ", "note: ")) for x in lines[:-1])
            and len(lines) - 1 == len(changed) and not (Path(tmp) / "rep").exists()
        )  # fmt: skip
        return "rejected" if refused else "crash"


# -- encodings of the sweep file and the preset ----------------------------------------------------
SWEEP_TOML = 'workloads = ["chain3"]\nschedulers = ["fcfs"]\ntasks = 2\nrates = [0.1]\n'
PRESET_TOML = (_PRESETS / "a100-qwen32b.toml").read_text(encoding="utf-8")


@st.composite
def encoded(draw: st.DrawFn, text: str) -> bytes:
    """`text` with a hostile string inserted and/or in a hostile encoding."""
    insert = draw(st.sampled_from(["", "", "\\ud800", "\\udfff", "\\ud83d\\ude00", "é中😀", "\x00",
                                   "\u202e", '"', "\\", "\n[x]\n"]))  # fmt: skip
    at = draw(st.integers(0, len(text)))
    text = text[:at] + insert + text[at:]
    how = draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32",
                                "latin-1", "cesu", "cut", "binary"]))  # fmt: skip
    if how == "binary":
        return draw(st.binary(max_size=256))
    if how == "cesu":  # a surrogate as raw UTF-8 bytes: not UTF-8
        return text.encode("utf-8", "surrogatepass") + "\ud800".encode("utf-8", "surrogatepass")
    if how == "cut":  # a multi-byte sequence cut short
        return text.encode("utf-8", "surrogatepass") + "中".encode()[:2]
    return text.encode(how, "replace" if how == "latin-1" else "surrogatepass")


encoded_sweeps = encoded(SWEEP_TOML)
encoded_presets = encoded(PRESET_TOML)


def check_encoded_sweep(data: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.toml"
        path.write_bytes(data)
        return _one_line(invoke("sweep", "-c", path, "-j", "1", "--out", Path(tmp) / "runs"))


def check_encoded_preset(data: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "preset.toml"
        path.write_bytes(data)
        args = ["-w", "chain3", "-s", "fcfs", "-n", "2", "--rate", "0.1", "--preset", path]
        return _one_line(invoke("run", *args, "--out", Path(tmp) / "runs"))


def _one_line(result: Any) -> str:
    outcome = classify(result)
    if outcome == "rejected" and "Usage:" not in result.stderr:
        errors = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
        if len(errors) != 1 or len(errors[0]) > 2000:
            return "crash"
    return outcome
