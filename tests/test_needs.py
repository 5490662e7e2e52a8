"""A policy's server needs (`ServerNeeds`): one frozen value per policy, complete and valid for
every registered scheduler; SGLang's stock policies as rows of one table that covers every
`--schedule-policy` SGLang 0.5.23 accepts; the simulator's queue pass covering them all."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import topas_bench.schedulers.sglang_stock as stock_module
from topas_bench.runners.sim.calc_priority import CACHE_AWARE, PASSES
from topas_bench.runners.sim.evict import POLICIES
from topas_bench.schedulers.base import SCHEDULE_POLICIES, Policy, ServerNeeds
from topas_bench.schedulers.registry import SCHEDULERS, SGLANG_STOCK, make_policy
from topas_bench.schedulers.sglang_stock import REFUSED, STOCK, Stock, StockRow
from topas_bench.schedulers.validate import InvalidParameter

#: The six class variables `ServerNeeds` replaced: no policy may carry them again.
OLD = (
    "sglang_policy", "acts_while_full", "radix_eviction_policy", "radix_eviction_config",
    "sglang_seed", "sets_prefix_priority",
)  # fmt: skip
FIELDS: dict[str, type | tuple[type, ...]] = {
    "schedule_policy": str, "native": bool, "eviction": str, "eviction_config": tuple,
    "seed": int, "acts_while_full": bool, "tree_core": (str, type(None)),
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]


def check_needs(needs: ServerNeeds) -> None:
    assert type(needs) is ServerNeeds
    assert {f.name for f in dataclasses.fields(needs)} == set(FIELDS)
    for name, kind in FIELDS.items():
        assert isinstance(getattr(needs, name), kind), name
    assert needs.schedule_policy in SCHEDULE_POLICIES
    assert needs.eviction in POLICIES
    assert needs.tree_core in (None, "rust", "python")
    assert needs.seed >= 0
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in needs.eviction_config)
    assert not needs.eviction_config or needs.eviction == "slru"
    hash(needs)  # frozen all the way down: hashable
    for f in dataclasses.fields(needs):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(needs, f.name, getattr(needs, f.name))


@pytest.mark.parametrize("name", SCHEDULERS.names())
def test_every_scheduler_declares_one_frozen_complete_needs_value(name: str) -> None:
    policy = make_policy(name)
    check_needs(policy.needs)
    assert policy.needs == make_policy(name).needs  # a value of its parameters, nothing else
    for old in OLD:
        assert not hasattr(policy, old), f"{name} still carries {old}"
    assert policy.name == name


def test_needs_follow_the_parameters() -> None:
    assert make_policy("lpm").needs == ServerNeeds(schedule_policy="lpm", native=True)
    # thresholds SGLang's constants cannot express: served through the plugin, after `fcfs`
    assert make_policy("lpm", fallback_above=64).needs == ServerNeeds()
    assert make_policy("fcfs").needs == ServerNeeds(native=True)
    assert make_policy("topas").needs.acts_while_full
    assert make_policy("topas-base").needs.acts_while_full
    assert make_policy("kvflow").needs == ServerNeeds(eviction="priority", tree_core="python")
    assert make_policy("lpm-aging").needs == ServerNeeds(schedule_policy="lpm")
    hrrn = make_policy("hrrn", eviction="slru", slru_protected_threshold=5).needs
    assert (hrrn.schedule_policy, hrrn.eviction, hrrn.eviction_config_dict) == (
        "hrrn", "slru", {"protected_threshold": 5},
    )  # fmt: skip
    assert hrrn.protected_threshold == 5 and ServerNeeds().protected_threshold == 2
    assert (
        make_policy("hrrn", eviction="lfu", slru_protected_threshold=5).needs.eviction_config == ()
    )
    assert make_policy("random", seed=7).needs.seed == 7
    assert make_policy("lof", eviction="priority").needs.seed == 0
    assert make_policy("lpm-slru", slru_protected_threshold=3).needs == ServerNeeds.slru(
        3, schedule_policy="lpm", native=True
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"schedule_policy": "priority"},
        {"eviction": "tlru"},
        {"eviction": "lru", "eviction_config": (("protected_threshold", 2),)},
        {"eviction": "slru", "eviction_config": (("threshold", 2),)},
        {"tree_core": "go"},
        {"seed": -1},
        {"seed": True},
    ],
)
def test_needs_refuse_what_sglang_has_not(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ServerNeeds(**fields)  # type: ignore[arg-type]


def test_stock_rows_are_registered_and_build_their_needs() -> None:
    assert [r.name for r in STOCK] == [
        n for n in SCHEDULERS.names() if isinstance(SCHEDULERS.get(n), StockRow)
    ]
    assert set(SGLANG_STOCK) <= {r.name for r in STOCK}
    for row in STOCK:
        for eviction in POLICIES if row.eviction is None else (row.eviction,):
            params = {"eviction": eviction} if row.eviction is None else {}
            policy = make_policy(row.name, **params)
            assert isinstance(policy, Stock)
            check_needs(policy.needs)
            assert policy.needs.schedule_policy == row.schedule_policy
            assert policy.needs.eviction == eviction
            assert policy.needs.native  # the reference engine runs SGLang's own pass
            assert list(policy.params) == list(row.param_names)


def test_stock_parameters_are_the_rows_and_fail_named() -> None:
    assert make_policy("random").params == {
        "eviction": "lru", "slru_protected_threshold": 2, "seed": 0,
    }  # fmt: skip
    assert make_policy("dfs-weight").params == {"eviction": "lru", "slru_protected_threshold": 2}
    assert make_policy("lpm-slru").params == {"slru_protected_threshold": 2}
    assert make_policy("lpm-lfu").params == {} == make_policy("lpm-priority").params
    with pytest.raises(InvalidParameter, match="'lpm-lfu' takes no parameters"):
        make_policy("lpm-lfu", eviction="lru")
    with pytest.raises(InvalidParameter, match="unknown parameter 'seed'; valid: eviction, slru"):
        make_policy("hrrn", seed=1)
    with pytest.raises(InvalidParameter, match="random: seed must be an integer >= 0"):
        make_policy("random", seed=-1)
    with pytest.raises(InvalidParameter, match="lof: eviction must be one of lru, lfu"):
        make_policy("lof", eviction="tlru")
    with pytest.raises(InvalidParameter, match="lpm-slru: slru_protected_threshold must be"):
        make_policy("lpm-slru", slru_protected_threshold=0)


def accepted_in_docstring() -> set[str]:
    """The `--schedule-policy` values `sglang_stock`'s docstring lists, one bullet each."""
    doc = stock_module.__doc__ or ""
    names: set[str] = set()
    for line in doc.splitlines():
        head = re.match(r"- ((?:`[a-z-]+`(?:, )?)+)", line)
        if head:
            names |= set(re.findall(r"`([a-z-]+)`", head.group(1)))
    return names


def test_the_stock_table_covers_every_schedule_policy_sglang_accepts() -> None:
    accepted = accepted_in_docstring()
    assert accepted == {*SCHEDULE_POLICIES, *REFUSED}
    served = {make_policy(n).needs.schedule_policy for n in SCHEDULERS.names()}
    table = {row.schedule_policy for row in STOCK}
    # fcfs and lpm are schedulers of their own (`schedulers.fcfs`, `schedulers.lpm`)
    assert table | {"fcfs", "lpm"} | set(REFUSED) == accepted
    assert served == set(SCHEDULE_POLICIES)
    assert not set(REFUSED) & set(SCHEDULE_POLICIES)


def test_the_simulators_queue_pass_mirrors_every_schedule_policy() -> None:
    assert set(PASSES) == set(SCHEDULE_POLICIES)
    assert {"lpm", "dfs-weight", "hrrn", "shortest-prefill-first"} == CACHE_AWARE


def sglang_choices() -> list[str] | None:
    """`--schedule-policy`'s choices in the installed SGLang's argument fields, or None."""
    found = sorted(
        ROOT.glob(
            ".venvs/sglang/lib/python*/site-packages/sglang/srt/arg_groups/fields/schedule.py"
        )
    )
    if not found:
        return None
    for node in ast.walk(ast.parse(found[0].read_text())):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "schedule_policy":
            for kw in ast.walk(node.annotation):
                if isinstance(kw, ast.keyword) and kw.arg == "choices":
                    return list(ast.literal_eval(kw.value))
    raise AssertionError(f"no schedule_policy choices in {found[0]}")


def test_the_docstring_lists_what_the_installed_sglang_accepts() -> None:
    choices = sglang_choices()
    if choices is None:
        pytest.skip(".venvs/sglang is not built")
    assert set(choices) == accepted_in_docstring()


def test_a_policy_without_needs_gets_stock_fcfs() -> None:
    class Plain(Policy):
        def decide(self, view: object) -> object:  # type: ignore[override]
            raise AssertionError

    assert Plain().needs == ServerNeeds()
