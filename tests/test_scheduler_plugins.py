"""Schedulers from other packages (`schedulers.plugins`): entry points in group
`topas_bench.schedulers`, found through importlib.metadata as pip installs them.

The unit tests lay out a distribution by hand (a `NAME-VERSION.dist-info` directory with
`METADATA` and `entry_points.txt`, and its module) on a temporary `sys.path` entry: what an
installed package is to importlib.metadata. The slow test installs the tutorial's example
package (examples/scheduler-plugin) into a temporary directory with pip, and runs the CLI on it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topas_bench.cell.identity import RunIdentity
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.runners.sglang.plugin import policy_factory
from topas_bench.schedulers import plugins
from topas_bench.schedulers.registry import (
    SCHEDULERS,
    capabilities,
    make_policy,
    refuse_sim_only,
    role,
    source,
    summary,
)
from topas_bench.spec import parse_schedulers

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "scheduler-plugin"
TUTORIAL = ROOT / "docs" / "tutorial-scheduler.md"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

POLICY = '''
from topas_bench.schedulers.base import Capabilities, OrderingPolicy


class Newest(OrderingPolicy):
    """Newest call first (a test plugin)."""

    name = "something-else"
    capabilities = Capabilities(preempts=True)

    def __init__(self, depth: int = 1) -> None:
        self.depth = depth

    @property
    def params(self):
        return {"depth": self.depth}

    def sort_key(self, req, view):
        return (-req.queued_s, req.rid)


class Oracle(Newest):
    """Newest call first, with the true output lengths (a test plugin)."""

    oracle_lengths = True


def make(**params):
    """Newest, built by a factory (a test plugin)."""
    return Newest(**params)


class NotAPolicy:
    pass
'''

Install = Callable[..., Path]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """`install(dist, version, {name: value}, module=text)`: a distribution on `sys.path`, its
    module named after it; the discovery and import caches cleared before and after."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    names: list[str] = []

    def add(dist: str, version: str, entries: dict[str, str], module: str | None = None) -> Path:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = [f"{k} = {v}" for k, v in entries.items()]
        (info / "entry_points.txt").write_text("[topas_bench.schedulers]\n" + "\n".join(lines))
        if module is not None:
            mod = dist.replace("-", "_")
            (site / f"{mod}.py").write_text(module)
            names.append(mod)
        plugins.discovered.cache_clear()
        return info

    plugins.discovered.cache_clear()
    plugins.load.cache_clear()
    yield add
    plugins.discovered.cache_clear()
    plugins.load.cache_clear()
    for mod in names:
        sys.modules.pop(mod, None)


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, " ".join(ANSI.sub("", result.output).split())


def test_a_plugin_class_is_a_scheduler(install: Install) -> None:
    install("tp-newest", "1.2.0", {"newest": "tp_newest:Newest"}, POLICY)
    assert "newest" in SCHEDULERS and SCHEDULERS.names()[-1] == "newest"
    assert "newest" not in SCHEDULERS.builtin_names()
    policy = make_policy("newest", depth=3)
    assert policy.name == "newest"  # the entry point's name, whatever the class says
    assert policy.params == {"depth": 3}
    assert capabilities("newest").preempts and role("newest") == "plugin"
    assert summary("newest") == "Newest call first (a test plugin)."
    assert source("newest") == {"distribution": "tp-newest", "version": "1.2.0"}
    assert source("fcfs") == {}
    with pytest.raises(TopasError, match="scheduler 'newest': unknown parameter 'width'"):
        make_policy("newest", width=1)


def test_a_plugin_factory_is_a_scheduler(install: Install) -> None:
    install("tp-factory", "0.1", {"newest-made": "tp_factory:make"}, POLICY)
    policy = make_policy("newest-made", depth=2)
    assert type(policy).__name__ == "Newest" and policy.name == "newest-made"
    assert capabilities("newest-made").preempts  # read from the class the factory builds
    assert summary("newest-made") == "Newest, built by a factory (a test plugin)."


def test_groups_take_plugins_only_by_name_or_as_plugins(install: Install) -> None:
    install("tp-groups", "0.1", {"newest": "tp_groups:Newest"}, POLICY)
    assert "newest" not in parse_schedulers("all") + parse_schedulers("everything")
    assert parse_schedulers("plugins") == ("newest",)
    assert parse_schedulers("fcfs,newest") == ("fcfs", "newest")


def test_plugins_group_without_plugins_is_one_line(install: Install) -> None:
    install("tp-none", "0.1", {})
    with pytest.raises(TopasError, match="no installed package declares a scheduler"):
        parse_schedulers("plugins")


def test_a_clash_with_a_builtin_is_refused_naming_both(install: Install) -> None:
    install("tp-clash", "2.0", {"fcfs": "tp_clash:Newest"}, POLICY)
    expected = (
        "scheduler plugin 'fcfs' (tp_clash:Newest from tp-clash 2.0) has the name of the "
        "built-in scheduler 'fcfs'; refused: rename its entry point in group "
        "topas_bench.schedulers"
    )
    with pytest.raises(plugins.PluginError) as e:
        make_policy("fcfs")
    assert str(e.value) == expected
    code, output = run_cli("schedulers", "list")
    assert code == 2 and f"error: {expected}" in output and "Traceback" not in output


def test_two_distributions_declaring_one_name_are_refused(install: Install) -> None:
    install("tp-one", "1.0", {"newest": "tp_one:Newest"}, POLICY)
    install("tp-two", "1.0", {"newest": "tp_two:Newest"}, POLICY)
    with pytest.raises(plugins.PluginError, match="declared twice: tp_one:Newest from tp-one"):
        SCHEDULERS.names()


def test_an_import_failure_is_one_line_when_used_and_a_note_in_the_list(
    install: Install,
) -> None:
    broken = "raise RuntimeError('no GPU\\nhere')\n"
    install("tp-broken", "0.3", {"broken": "tp_broken:Newest"}, broken)
    expected = (
        "scheduler plugin 'broken' (tp_broken:Newest from tp-broken 0.3) failed to import: "
        "RuntimeError: no GPU here"
    )
    with pytest.raises(plugins.PluginError) as e:
        make_policy("broken")
    assert str(e.value) == expected
    make_policy("fcfs")  # the built-ins still run
    code, output = run_cli("schedulers", "list")
    assert code == 0, output
    assert "│ broken │ plugin │ ? │ ? │ (fails to load: see the note below) │" in output
    assert f"note: {expected}" in output
    assert "│ fcfs │ paper │ no │ no │" in output
    code, output = run_cli("run", "-w", "chain3", "-s", "broken", "-n", "2")
    assert code == 2 and f"error: {expected}" in output and "Traceback" not in output


def test_objects_that_are_not_policies_are_refused(install: Install) -> None:
    install(
        "tp-bad", "0.1", {"cls": "tp_bad:NotAPolicy", "num": "tp_bad:POLICY", "fn": "tp_bad:f"},
        POLICY + "POLICY = 3\n\ndef f():\n    return 3\n",
    )  # fmt: skip
    with pytest.raises(plugins.PluginError, match="is a class that is not a topas_bench Policy"):
        make_policy("cls")
    with pytest.raises(plugins.PluginError, match="neither a Policy subclass nor a factory"):
        make_policy("num")
    with pytest.raises(plugins.PluginError, match="returned int, not a topas_bench Policy"):
        make_policy("fn")


def test_a_simulator_only_plugin_is_refused_on_other_engines(install: Install) -> None:
    install("tp-oracle", "0.1", {"newest-oracle": "tp_oracle:Oracle"}, POLICY)
    with pytest.raises(TopasError, match="newest-oracle is an oracle variant"):
        refuse_sim_only(("fcfs", "newest-oracle"), "sglang")


def test_the_sglang_plugin_resolves_an_entry_point_scheduler(install: Install) -> None:
    """The server's lookup (`TOPAS_SCHEDULER`) is the registry's: a plugin scheduler installed
    in the server's environment runs there by its name, as built-ins do."""
    install("tp-server", "0.1", {"newest": "tp_server:Newest"}, POLICY)
    factory = policy_factory("newest", {"depth": 4})
    first, second = factory(), factory()
    assert first is not second  # one fresh policy per scheduler process
    assert first.name == "newest" and first.params == {"depth": 4}
    with pytest.raises(TopasError, match=r"unknown scheduler 'newst'; known: fcfs,.* newest"):
        policy_factory("newst", {})


def test_identity_records_a_plugin_source_and_only_a_plugins() -> None:
    fields = dict(
        workload="chain3", num_tasks=8, rate_per_s=0.2, seed=0, scheduler="x",
        preset="a100-qwen32b", kv_budget_tokens=1000,
    )  # fmt: skip
    builtin = RunIdentity(**fields)  # type: ignore[arg-type]
    assert "scheduler_source" not in builtin.to_json()  # built-in digests stay as they were
    v1 = RunIdentity(**fields, scheduler_source={"distribution": "d", "version": "1"})  # type: ignore[arg-type]
    v2 = RunIdentity(**fields, scheduler_source={"distribution": "d", "version": "2"})  # type: ignore[arg-type]
    assert len({builtin.digest, v1.digest, v2.digest}) == 3
    assert RunIdentity(**v1.to_json()) == v1  # as run.json stores and reads it


def code_block(text: str, after: str, lang: str) -> str:
    """The first ```lang block after the line `after` in the tutorial."""
    start = text.index(after)
    match = re.search(rf"```{lang}\n(.*?)```", text[start:], re.S)
    assert match, f"no {lang} block after {after!r}"
    return match.group(1)


def test_the_tutorial_shows_the_example_package_as_it_is() -> None:
    text = TUTORIAL.read_text()
    policy = code_block(text, "examples/scheduler-plugin/busiest_agent.py", "python")
    assert policy == (EXAMPLE / "busiest_agent.py").read_text()
    project = code_block(text, "examples/scheduler-plugin/pyproject.toml", "toml")
    assert project == (EXAMPLE / "pyproject.toml").read_text()
    sweep = code_block(text, "examples/scheduler-plugin/sweep.toml", "toml")
    assert sweep == (EXAMPLE / "sweep.toml").read_text()


@pytest.mark.slow
def test_the_example_package_installs_lists_runs_and_sweeps(tmp_path: Path) -> None:
    """pip installs examples/scheduler-plugin into a directory (the project's environment is
    left as it is); `topas-bench` with that directory on PYTHONPATH lists it, runs it beside
    TOPAS, sweeps it (its cells recording the distribution's version) and shows it on the
    site."""
    target, work = tmp_path / "site", tmp_path / "src"
    # a copy: the build writes build/ and *.egg-info beside the sources
    subprocess.run(["cp", "-r", str(EXAMPLE), str(work)], check=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
    done = subprocess.run([*pip, str(target), str(work)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    env = {**os.environ, "PYTHONPATH": str(target), "COLUMNS": "200", "NO_COLOR": "1"}
    cli = [str(Path(sys.executable).parent / "topas-bench")]

    def topas(*args: str | Path) -> str:
        done = subprocess.run([*cli, *map(str, args)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return " ".join(done.stdout.split())

    listed = topas("schedulers", "list")
    assert "│ busiest-agent │ plugin │ no │ no │ The agent with the most waiting calls" in listed
    assert "note: busiest-agent is a plugin: busiest_agent:BusiestAgent from " in listed
    assert "topas-busiest-agent 0.1.0" in listed
    out = tmp_path / "runs"
    ran = topas("run", "-w", "chain3", "-s", "busiest-agent,topas", "-n", "8", "--out", out)
    assert re.search(r"│ busiest-agent │ 8 │ [0-9.]+ │", ran), ran
    assert re.search(r"│ topas │ 8 │ [0-9.]+ │", ran), ran
    (cell,) = (out / "chain3" / "busiest-agent").iterdir()
    identity = json.loads((cell / "run.json").read_text())["identity"]
    assert identity["scheduler_source"] == {
        "distribution": "topas-busiest-agent",
        "version": "0.1.0",
    }
    sweep = tmp_path / "sweep.toml"
    small = {"tasks = 40": "tasks = 8", '"chain3", "metagpt-tl"': '"chain3"'}
    small['out = "runs/tutorial"'] = f'out = "{tmp_path / "swept"}"'
    text = (EXAMPLE / "sweep.toml").read_text()
    for was, now in small.items():
        assert was in text
        text = text.replace(was, now)
    sweep.write_text(text)
    swept = topas("sweep", "-c", sweep)
    for name in ("busiest-agent", "topas"):
        assert list((tmp_path / "swept" / "chain3" / name).iterdir()), swept
    # the site of the sweep ranks it beside TOPAS on the leaderboard
    topas("site", tmp_path / "swept", "--out", tmp_path / "swept-site")
    index = (tmp_path / "swept-site" / "index.html").read_text()
    assert '<tr data-s="busiest-agent"' in index and '<tr data-s="topas"' in index


def test_a_report_needs_no_plugin_to_load(install: Install) -> None:
    """Analysis reads files: a plugin that cannot be loaded, or clashes, shows as unknown
    powers in a report instead of stopping it."""
    from topas_bench.analysis.render import powers

    install("tp-report", "0.1", {"broken": "tp_report:Missing"}, POLICY)
    assert powers("broken") == "?" and powers("fcfs") == "no / no"
    install("tp-report-clash", "0.1", {"lpm": "tp_report_clash:Newest"}, POLICY)
    assert powers("fcfs") == "?"
