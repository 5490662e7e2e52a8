"""`PrefillAdder` on hand-built states: SGLang 0.5.23's admission rule, reservations, chunking."""

from __future__ import annotations

import pytest

from topas_bench.runners.sim.admission import AddResult, PrefillAdder, running_offset
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.radix import RadixCache
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.workflow import TaskRun
from topas_bench.workloads.model import Segment, Stage, Task


def req(
    rid: int,
    prompt: tuple[tuple[str, int], ...],
    output: int,
    max_new: int | None = None,
    generated: int = 0,
) -> SimRequest:
    """A request whose stage sends `max_new` (default: `output`, i.e. ignore_eos)."""
    stage = Stage(
        "s", "a", tuple(Segment(k, n) for k, n in prompt), output,
        max_new_tokens=output if max_new is None else max_new,
    )  # fmt: skip
    r = SimRequest(rid, TaskRun(Task(f"t{rid}", "wf", 0.0, (stage,))), stage, 0.0,
                   stage.max_new_tokens)  # fmt: skip
    r.generated = generated
    return r


def adder(
    free: int,
    cache: RadixCache | None = None,
    running: tuple[SimRequest, ...] = (),
    ratio: float = 0.5,
    **kw: int,
) -> PrefillAdder:
    cfg = SimConfig(kv_budget_tokens=100_000, **kw)
    return PrefillAdder(cache or RadixCache(), lambda: free, running, ratio, cfg)


def add(a: PrefillAdder, r: SimRequest) -> AddResult:
    return a.add_one(r, a.cache.match(r.fill(), r.fill_tokens - 1))


# -- the admission rule ------------------------------------------------------------------------
@pytest.mark.parametrize(("free", "admitted"), [(150, False), (151, False), (152, True)])
def test_need_must_be_strictly_below_remaining_total(free: int, admitted: bool) -> None:
    """`PrefillBudget.check_prefill`: extend + clipped max_new + one page < remaining_total."""
    r = req(0, (("u", 100),), 50)
    a = adder(free)
    res = add(a, r)
    assert [x.req for x in a.batch] == ([r] if admitted else [])
    assert res is (AddResult.NO_TOKEN if not admitted else a.budget_state())


def test_reservations_follow_prefill_budget_reserve() -> None:
    """`PrefillBudget.reserve`: total += extend + 1 + min(max_new, CLIP); current += extend + 1;
    the compute budgets lose the extend."""
    r = req(0, (("u", 100),), 50, max_new=300)
    a = adder(10_000)
    assert add(a, r) is AddResult.CONTINUE
    assert (a.total_offset, a.current_offset) == (100 + 1 + 300, 100 + 1)
    assert (a.rem_input, a.rem_chunk) == (16384 - 100, 8192 - 100)


def test_a_retracted_request_is_checked_on_what_is_left_but_reserves_its_whole_cap() -> None:
    """`add_one_req` checks `max_new - generated`; `_select_prefill_admission` reserves the
    sampling `max_new_tokens` (not reduced by tokens already generated)."""
    r = req(0, (("u", 100),), 500, max_new=500, generated=400)
    a = adder(10_000)
    assert a.need(r, a.cache.match(r.fill(), r.fill_tokens - 1)) == 500 + 100 + 1
    add(a, r)
    assert a.total_offset == 500 + 1 + 500


def test_running_requests_hold_decode_headroom_at_the_ratio() -> None:
    sampled = req(1, (("x", 10),), 40, max_new=400, generated=100)
    exact = req(2, (("y", 10),), 400, generated=100)
    assert running_offset(sampled, 0.5, 4096) == 150.0
    assert running_offset(exact, 0.5, 4096) == 300.0  # ignore_eos: ratio 1
    assert running_offset(sampled, 0.5, 100) == 50.0  # CLIP_MAX_NEW_TOKENS
    a = adder(1000, running=(sampled, exact))
    assert a.remaining_total == 1000 - 450


def test_matched_prefix_is_locked_during_the_check() -> None:
    """`_lock_node`: the candidate's own cached prefix does not count as evictable room."""
    cache = RadixCache()
    cache.insert([("u", 0, 100)])
    r = req(0, (("u", 100), ("v", 20)), 10)
    # free 30 + evictable 100: unlocked it would fit (20 + 10 + 1 < 130), locked it does not
    assert add(adder(30, cache), r) is AddResult.NO_TOKEN
    assert cache.evictable_tokens == 100  # the temporary lock is released
    a = adder(40, cache)
    add(a, r)
    assert [x.req for x in a.batch] == [r] and cache.evictable_tokens == 0  # now its own lock


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    cache = RadixCache()
    cache.insert([("u", 0, 100)])
    r = req(0, (("u", 100),), 10)
    a = adder(1000, cache)
    add(a, r)
    assert (a.batch[0].cached_before, a.batch[0].new_tokens) == (99, 1)


# -- chunking ------------------------------------------------------------------------------------
def test_a_long_prompt_is_cut_to_the_chunk_budget_without_decode_headroom() -> None:
    r = req(0, (("u", 1000),), 10)
    a = adder(100_000, chunked_prefill_size=256)
    assert add(a, r) is AddResult.OTHER  # the chunk budget is spent
    assert (a.batch[0].new_tokens, a.new_chunked) == (256, r)
    assert a.total_offset == 256 + 1  # no decode headroom until its last chunk


def test_a_chunk_continuation_takes_the_chunk_budget_or_what_memory_allows() -> None:
    """`add_chunked_req`: min(chunk budget, remaining_total), the whole chunk budget when
    that is not positive; decode headroom reserved only with the last chunk."""
    r = req(0, (("u", 1000),), 10)
    r.prefix_len = 256
    a = adder(100_000, chunked_prefill_size=256)
    assert a.add_chunked(r) is True
    assert a.batch[0].new_tokens == 256 and a.total_offset == 257
    b = adder(100, chunked_prefill_size=256)
    assert b.add_chunked(r) is True and b.batch[0].new_tokens == 100
    c = adder(0, chunked_prefill_size=256)
    assert c.add_chunked(r) is True and c.batch[0].new_tokens == 256
    r.prefix_len = 900
    d = adder(100_000, chunked_prefill_size=256)
    assert d.add_chunked(r) is False
    assert d.batch[0].new_tokens == 100 and d.total_offset == 100 + 1 + 10


def test_budget_state_after_each_admission() -> None:
    """`budget_state`: NO_TOKEN when memory is spent, else OTHER when a compute budget is."""
    a = adder(400)
    assert add(a, req(0, (("u", 100),), 50)) is AddResult.CONTINUE  # remaining 249
    # a retracted request passes the check (160 + 50 + 1 < 249) but reserves its whole cap
    retracted = req(1, (("v", 10),), 200, max_new=200, generated=150)
    assert add(a, retracted) is AddResult.NO_TOKEN
    assert a.batch[-1].req is retracted and a.remaining_total == 249 - (160 + 1 + 200)
    b = adder(100_000, max_prefill_tokens=150)
    assert add(b, req(2, (("w", 150),), 5)) is AddResult.OTHER
