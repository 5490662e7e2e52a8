"""`PrefillAdder` on hand-built states: SGLang's admission rule, reservations, chunking."""

from __future__ import annotations

import pytest

from topas_bench.runners.sim.admission import AddResult, PrefillAdder, running_offset
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.radix import RadixCache
from topas_bench.runners.sim.state import SimRequest, TaskRun
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
        "s",
        "a",
        tuple(Segment(k, n) for k, n in prompt),
        output,
        max_new_tokens=output if max_new is None else max_new,
    )
    r = SimRequest(rid, TaskRun(Task(f"t{rid}", "wf", 0.0, (stage,))), stage, 0.0)
    r.generated = generated
    return r


def cfg(**kw: int) -> SimConfig:
    return SimConfig(kv_budget_tokens=100_000, **kw)


def adder(
    free: int,
    cache: RadixCache | None = None,
    running: tuple[SimRequest, ...] = (),
    ratio: float = 0.5,
    **kw: int,
) -> PrefillAdder:
    return PrefillAdder(cache or RadixCache(), lambda: free, running, ratio, cfg(**kw))


# -- the admission rule ------------------------------------------------------------------------
def test_ignore_eos_request_is_exact_and_flagged() -> None:
    r = req(0, (("u", 100),), 50)
    assert r.ignore_eos
    assert not req(1, (("u", 100),), 50, max_new=60).ignore_eos


@pytest.mark.parametrize(("free", "admitted"), [(150, False), (151, False), (152, True)])
def test_need_must_be_strictly_below_remaining_total(free: int, admitted: bool) -> None:
    r = req(0, (("u", 100),), 50)
    a = adder(free)
    assert a.need(r, a.cache.match(r.prompt)) == 100 + 50 + 1
    res = a.add_one(r)
    assert (res is not AddResult.NO_TOKEN) == admitted
    assert [x.req for x in a.batch] == ([r] if admitted else [])


def test_admission_reserves_extend_one_and_max_new() -> None:
    r = req(0, (("u", 100),), 50)
    a = adder(1000)
    assert a.add_one(r) is AddResult.CONTINUE
    adm = a.batch[0]
    assert adm.match is not None
    assert (adm.new_tokens, adm.cached_before, adm.match.gpu_tokens) == (100, 0, 0)
    assert a.total_offset == 151
    assert a.current_offset == 101
    assert (a.remaining_total, a.remaining_current) == (849, 899)
    assert (a.rem_input, a.rem_chunk) == (16384 - 100, 8192 - 100)
    assert a.new_chunked is None


def test_need_of_a_preempted_request_counts_its_output_and_remaining_max_new() -> None:
    r = req(0, (("u", 100),), 50, max_new=80, generated=20)
    a = adder(1000)
    # extend = prompt + generated (recomputed), max_new left = 80 - 20
    assert a.need(r, a.cache.match(r.prompt)) == 120 + 60 + 1
    assert PrefillAdder.extend_tokens(r, a.cache.match(r.prompt)) == 120


def test_need_clips_max_new_tokens() -> None:
    big = req(0, (("u", 100),), 50, max_new=10_000)
    a = adder(100_000)
    assert a.need(big, a.cache.match(big.prompt)) == 100 + 4096 + 1
    small_clip = adder(100_000, clip_max_new_tokens=64)
    assert small_clip.need(big, small_clip.cache.match(big.prompt)) == 100 + 64 + 1


def test_fully_cached_prompt_still_extends_one_token() -> None:
    cache = RadixCache()
    cache.insert(cache.root, (Segment("p", 40),), now_s=0.0)
    r = req(0, (("p", 40),), 10)
    a = adder(1000, cache)
    assert a.need(r, cache.match(r.prompt)) == 1 + 10 + 1
    a.add_one(r)
    assert (a.batch[0].new_tokens, a.batch[0].cached_before) == (1, 39)


# -- reservations of running requests --------------------------------------------------------
def test_running_offset_uses_the_ratio_except_for_ignore_eos() -> None:
    exact = req(0, (("u", 10),), 40, generated=10)
    sampled = req(1, (("v", 10),), 40, max_new=200, generated=0)
    long = req(2, (("w", 10),), 40, max_new=10_000, generated=5)
    assert running_offset(exact, 0.5, 4096) == 30.0
    assert running_offset(sampled, 0.5, 4096) == 100.0
    assert running_offset(long, 0.25, 4096) == 1024.0
    assert running_offset(long, 0.25, 100) == 25.0


@pytest.mark.parametrize(("free", "admitted"), [(281, False), (282, True)])
def test_running_requests_reserve_decode_headroom(free: int, admitted: bool) -> None:
    running = (
        req(10, (("x", 10),), 40, generated=10),  # ignore_eos: 30 * 1.0
        req(11, (("y", 10),), 40, max_new=200),  # 200 * 0.5
    )
    a = adder(free, running=running, ratio=0.5)
    assert a.total_offset == 130
    assert a.remaining_total == free - 130
    r = req(0, (("u", 100),), 50)  # need 151
    res = a.add_one(r)
    assert (res is not AddResult.NO_TOKEN) == admitted
    if not admitted:
        assert a.deficit == 151 - (free - 130) + 1


# -- the temporary lock -------------------------------------------------------------------------
def shared_prefix_cache() -> RadixCache:
    cache = RadixCache()
    cache.insert(cache.root, (Segment("agent:a", 50),), now_s=0.0)
    return cache


def test_own_matched_prefix_is_not_counted_as_evictable() -> None:
    cache = shared_prefix_cache()
    r = req(0, (("agent:a", 50), ("u", 100)), 50)  # extend 100, need 151
    a = adder(120, cache)
    assert a.remaining_total == 170  # 151 < 170, but 50 of those are its own prefix
    assert a.add_one(r) is AddResult.NO_TOKEN
    assert a.deficit == 151 - 120 + 1
    # the temporary pin is released on refusal
    node = cache.child("agent:a")
    assert node is not None
    assert (node.lock, cache.evictable_tokens) == (0, 50)


def test_other_requests_may_count_the_prefix_as_evictable() -> None:
    cache = shared_prefix_cache()
    r = req(0, (("agent:b", 50), ("u", 50)), 50)  # no match: extend 100, need 151
    a = adder(120, cache)
    assert a.add_one(r) is AddResult.CONTINUE
    node = cache.child("agent:a")
    assert node is not None and node.lock == 0


def test_admission_keeps_the_lock_on_the_matched_prefix() -> None:
    cache = shared_prefix_cache()
    r = req(0, (("agent:a", 50), ("u", 100)), 50)
    a = adder(152, cache)
    assert a.add_one(r) is not AddResult.NO_TOKEN
    node = cache.child("agent:a")
    assert node is not None and node.lock == 1
    assert cache.evictable_tokens == 0
    adm = a.batch[0]
    assert adm.match is not None and adm.match.node is node
    assert (adm.new_tokens, adm.cached_before) == (100, 50)
    # a second request sharing the prefix no longer sees it as evictable either
    assert a.remaining_total == 152 - 151


# -- chunking -----------------------------------------------------------------------------------
def test_long_extend_is_chunked_and_stops_the_batch() -> None:
    a = adder(10_000, chunked_prefill_size=64, max_prefill_tokens=1000)
    r = req(0, (("u", 100),), 30)
    assert a.add_one(r) is AddResult.OTHER
    assert a.new_chunked is r
    assert a.batch[0].new_tokens == 64
    assert a.total_offset == 64 + 1  # no decode headroom while mid-chunk
    assert a.rem_chunk == 0
    # nothing else joins, so there is at most one chunked request
    other = req(1, (("v", 100),), 30)
    assert a.add_one(other) is AddResult.OTHER
    assert len(a.batch) == 1
    assert a.new_chunked is r


def chunked_req(extend: int, done: int, output: int = 30) -> SimRequest:
    r = req(0, (("u", extend),), output)
    r.extend_tokens, r.done_prefill = extend, done
    return r


def test_in_flight_chunk_reserves_its_rest_and_decode_headroom() -> None:
    r = chunked_req(300, 128)
    a = PrefillAdder(RadixCache(), lambda: 10_000, (), 0.5, cfg(), chunked=r)
    assert a.total_offset == (300 - 128) + 30


def test_chunk_continuation_goes_first_and_finishes() -> None:
    r = chunked_req(100, 64)
    a = PrefillAdder(RadixCache(), lambda: 10_000, (), 0.5, cfg(chunked_prefill_size=64), chunked=r)
    a.add_chunked(r)
    adm = a.batch[0]
    assert (adm.req, adm.new_tokens, adm.cached_before, adm.match) == (r, 36, 64, None)
    assert a.new_chunked is None
    assert a.total_offset == 36 + 30  # reserved up front, not again
    assert a.current_offset == 37
    assert a.rem_chunk == 28
    small = req(1, (("v", 20),), 5)
    assert a.add_one(small) is AddResult.CONTINUE
    assert a.rem_chunk == 8
    # A third request with extend > 8 becomes the next chunked one.
    big = req(2, (("w", 30),), 5)
    assert a.add_one(big) is AddResult.OTHER
    assert (a.new_chunked, a.batch[-1].new_tokens) == (big, 8)


def test_chunk_continuation_that_does_not_finish_stays_chunked() -> None:
    r = chunked_req(300, 128)
    a = PrefillAdder(RadixCache(), lambda: 10_000, (), 0.5, cfg(chunked_prefill_size=64), chunked=r)
    a.add_chunked(r)
    assert (a.batch[0].new_tokens, a.batch[0].cached_before) == (64, 128)
    assert a.new_chunked is r
    assert a.rem_chunk == 0
    assert a.add_one(req(1, (("v", 1),), 1)) is AddResult.OTHER
    assert len(a.batch) == 1


def test_chunk_continuation_is_limited_by_physical_memory() -> None:
    r = chunked_req(300, 0)
    a = PrefillAdder(RadixCache(), lambda: 30, (), 0.5, cfg(chunked_prefill_size=64), chunked=r)
    a.add_chunked(r)
    assert a.batch[0].new_tokens == 30
    assert a.new_chunked is r


@pytest.mark.parametrize(("free", "admitted"), [(481, False), (482, True)])
def test_the_chunk_reservation_holds_back_later_admissions(free: int, admitted: bool) -> None:
    r = chunked_req(300, 0)  # reserves 300 + 30
    a = PrefillAdder(RadixCache(), lambda: free, (), 0.5, cfg(chunked_prefill_size=1000), chunked=r)
    a.add_chunked(r)
    assert a.batch[0].new_tokens == 300
    res = a.add_one(req(1, (("v", 100),), 50))  # need 151 < free - 330
    assert (res is not AddResult.NO_TOKEN) == admitted


# -- stopping ------------------------------------------------------------------------------------
def test_refusal_after_an_admission_is_no_token_without_a_deficit() -> None:
    a = adder(300)
    first = req(0, (("u", 100),), 50)  # need 151
    second = req(1, (("v", 100),), 50)  # need 151 >= 300 - 151
    assert a.add_one(first) is AddResult.CONTINUE
    assert a.add_one(second) is AddResult.NO_TOKEN
    assert [x.req for x in a.batch] == [first]
    assert a.deficit is None  # only the first refused candidate of an empty batch has one


def test_prefill_token_budget_stops_with_other() -> None:
    a = adder(10_000, max_prefill_tokens=100, chunked_prefill_size=1000)
    assert a.add_one(req(0, (("u", 60),), 5)) is AddResult.CONTINUE
    assert a.add_one(req(1, (("v", 40),), 5)) is AddResult.OTHER
    assert a.rem_input == 0
    assert a.add_one(req(2, (("w", 1),), 1)) is AddResult.OTHER
    assert len(a.batch) == 2


def test_fractional_reservations_compare_strictly() -> None:
    # Ratio-scaled reservations make remaining_total fractional; the comparison stays strict.
    running = (req(10, (("x", 10),), 40, max_new=300),)  # reserves 300 * ratio
    a = adder(200, running=running, ratio=0.001)  # offset 0.3
    r = req(0, (("u", 100),), 98)  # need 199 < 199.7
    assert a.add_one(r) is AddResult.CONTINUE
    assert a.remaining_total == pytest.approx(0.7)
    last = req(1, (("v", 1),), 1)  # need 3 >= 0.7
    assert a.add_one(last) is AddResult.NO_TOKEN


@pytest.mark.parametrize("extra", [0, 1, 7])
def test_deficit_is_the_growth_that_admits_the_first_refused_candidate(extra: int) -> None:
    cache = shared_prefix_cache()
    running = (req(10, (("x", 10),), 40, generated=10),)  # reserves 30
    r = req(0, (("agent:a", 50), ("u", 100)), 60, max_new=90)  # need 100 + 90 + 1 = 191
    a = PrefillAdder(cache, lambda: 100 + extra, running, 0.5, cfg())
    assert a.add_one(r) is AddResult.NO_TOKEN
    assert a.deficit == 191 - (100 + extra - 30) + 1
    d = int(a.deficit)
    just_short = PrefillAdder(cache, lambda: 100 + extra + d - 1, running, 0.5, cfg())
    assert just_short.add_one(r) is AddResult.NO_TOKEN
    enough = PrefillAdder(cache, lambda: 100 + extra + d, running, 0.5, cfg())
    assert enough.add_one(r) is not AddResult.NO_TOKEN


# -- host tier ---------------------------------------------------------------------------------
def test_host_hit_is_charged_in_the_need_but_not_extended() -> None:
    cache = RadixCache(host_capacity_tokens=1000)
    cache.insert(cache.root, (Segment("agent:a", 50), Segment("h", 30)), now_s=0.0)
    prefix = cache.child("agent:a")
    assert prefix is not None
    cache.lock(prefix)
    cache.evict(30)  # h goes to the host tier
    r = req(0, (("agent:a", 50), ("h", 30), ("u", 20)), 10)
    m = cache.match(r.prompt)
    assert (m.gpu_tokens, m.host_tokens) == (50, 30)
    a = adder(1000, cache)
    assert PrefillAdder.extend_tokens(r, m) == 20
    assert a.need(r, m) == 20 + 30 + 10 + 1
    a.add_one(r)
    assert (a.batch[0].new_tokens, a.batch[0].cached_before) == (20, 80)
    assert a.total_offset == 20 + 1 + 10  # the engine allocates the load-back itself
