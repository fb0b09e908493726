"""When a holder yields its memory to a waiting load, and what traffic teaches about it
(``scheduler.yielding``, ``scheduler.habits``; docs/policy.md, "protect").

Pure values on a chosen clock: an ``Asker`` (the waiting load), a ``Resident`` (the
holder) and ``holder_yield``'s answer: why it holds and the latest moment it yields.
"""

from __future__ import annotations

import math

import pytest

from service.domain import InstanceState, Residency, Yielding
from service.scheduler import ServiceRule
from service.scheduler.eviction import Resident
from service.scheduler.habits import Habits
from service.scheduler.yielding import (
    STOP_MARGIN_S,
    YIELD_MARGIN_S,
    YIELD_MARGIN_SHARE,
    YIELD_WEIGHT,
    Asker,
    Block,
    holder_yield,
)

WARM, ON_DEMAND = Residency.WARM, Residency.ON_DEMAND


def asker(
    *arrivals: float,
    priority: int = 100,
    timeout: float = 120.0,
    load_s: float = 20.0,
    service_s: float = 4.0,
) -> Asker:
    rule = ServiceRule(
        name="lo",
        residency=ON_DEMAND,
        priority=priority,
        estimate=100,
        cap=None,
        max_concurrency=1,
        queue_max=16,
        queue_timeout_s=timeout,
        idle_ttl_s=0.0,
        stop_timeout_s=10.0,
    )
    return Asker(rule, tuple(arrivals), load_s=load_s, service_s=service_s)


def holder(
    *,
    residency: Residency = WARM,
    priority: int = 300,
    last_used: float = 0.0,
    protect_s: float = 600.0,
    busy: bool = False,
    batch: bool = False,
    reload_cost: float = 1e9,
    service_s: float = 6.0,
    yielding: Yielding = Yielding.BALANCED,
) -> Resident:
    return Resident(
        name="hi",
        residency=residency,
        priority=priority,
        state=InstanceState.READY,
        charge=100,
        busy=busy,
        last_used=last_used,
        batch_pending=batch,
        protect_s=protect_s,
        in_flight=1 if busy else 0,
        reload_cost=reload_cost,
        service_s=service_s,
        yield_weight=YIELD_WEIGHT[yielding],
    )


def deadline(arrival: float, timeout: float = 120.0, load_s: float = 20.0) -> float:
    return arrival + timeout - load_s - (YIELD_MARGIN_S + YIELD_MARGIN_SHARE * load_s)


# ------------------------------------------------------------- an idle protected holder


def test_an_idle_protected_holder_yields_by_the_waiting_requests_deadline() -> None:
    by = deadline(100.0)
    assert holder_yield(asker(100.0), holder(), 150.0) == (Block.PROTECTED, by)
    assert holder_yield(asker(100.0), holder(), by - 0.01)[0] is Block.PROTECTED
    assert holder_yield(asker(100.0), holder(), by) == (None, by)


def test_its_protection_lapsing_comes_first_when_it_is_sooner() -> None:
    assert holder_yield(asker(100.0), holder(protect_s=120.0), 110.0) == (Block.PROTECTED, 120.0)


def test_a_request_that_would_time_out_whatever_happens_is_not_waited_for() -> None:
    """The request of t=0 cannot be served before its timeout any more (its load alone
    would take it past 120 s): the holder does not yield for it, only for the next."""
    assert holder_yield(asker(0.0, 100.0), holder(), 105.0) == (Block.PROTECTED, deadline(100.0))
    assert holder_yield(asker(0.0), holder(), 105.0) == (Block.PROTECTED, 600.0)


def test_nothing_waiting_means_no_deadline_and_nothing_to_weigh() -> None:
    assert holder_yield(asker(), holder(reload_cost=0.0), 300.0) == (Block.PROTECTED, 600.0)


@pytest.mark.parametrize(
    ("fresh", "reload_cost", "yields"),
    [
        (1, 99.0, True),  # one fresh request (priority 100) outweighs a cheap reload
        (1, 100.0, False),
        (3, 299.0, True),
        (3, 1e9, False),  # a holder sure to be asked again soon holds to the deadline
    ],
)
def test_it_yields_early_when_what_waits_outweighs_its_reload(
    fresh: int, reload_cost: float, yields: bool
) -> None:
    ask = asker(*([100.0] * fresh), priority=100)
    block, latest = holder_yield(ask, holder(reload_cost=reload_cost), 101.0)
    assert (block is None) is yields
    assert latest == (101.0 if yields else deadline(100.0))


@pytest.mark.parametrize(
    ("yielding", "reload_cost", "yields"),
    [
        (Yielding.EAGER, 1e9, True),  # eager: any fresh waiting request, whatever the reload
        (Yielding.BALANCED, 99.0, True),
        (Yielding.BALANCED, 101.0, False),
        (Yielding.RELUCTANT, 24.0, True),  # reluctant: what waits must outweigh 4x the reload
        (Yielding.RELUCTANT, 26.0, False),
        (Yielding.AT_DEADLINE, 0.001, False),  # at-deadline: never early
    ],
)
def test_each_yielding_setting_moves_how_early_an_idle_holder_yields(
    yielding: Yielding, reload_cost: float, yields: bool
) -> None:
    ask = asker(100.0, priority=100)
    block, latest = holder_yield(ask, holder(reload_cost=reload_cost, yielding=yielding), 101.0)
    assert (block is None) is yields
    assert latest == (101.0 if yields else deadline(100.0))


def test_at_deadline_still_yields_at_the_waiters_deadline() -> None:
    """``at-deadline`` keeps the contract: no request times out while idle memory could
    serve it."""
    strict = holder(reload_cost=0.0, yielding=Yielding.AT_DEADLINE)
    assert holder_yield(asker(100.0), strict, deadline(100.0)) == (None, deadline(100.0))


def test_requests_that_already_missed_their_slo_do_not_count_as_fresh() -> None:
    """Four service times after arriving a request can no longer meet its SLO: it still
    has its deadline, but it no longer weighs against the holder's reload."""
    ask = asker(100.0, service_s=4.0)
    assert holder_yield(ask, holder(reload_cost=1.0), 115.0)[0] is None
    assert holder_yield(ask, holder(reload_cost=1.0), 116.5) == (Block.PROTECTED, deadline(100))


def test_busy_and_never_do_not_yield_to_a_lower_priority() -> None:
    assert holder_yield(asker(0.0), holder(busy=True), 1e6) == (Block.BUSY, None)
    assert holder_yield(asker(0.0), holder(protect_s=math.inf), 1e6) == (Block.NEVER, None)


# ----------------------------------------------------------------------------- no thrash


def test_a_batch_holds_against_an_equal_priority_until_it_is_served_even_past_a_deadline() -> None:
    batch = holder(residency=ON_DEMAND, priority=100, busy=True, batch=True)
    equal = asker(10.0, priority=100)
    assert holder_yield(equal, batch, 50.0) == (Block.BATCH, None)
    assert holder_yield(equal, batch, deadline(10.0) + 1.0) == (Block.BATCH, None)
    assert holder_yield(asker(priority=100), batch, 1e6) == (Block.BATCH, None)
    served = holder(residency=ON_DEMAND, priority=100, busy=False, batch=False)
    assert holder_yield(equal, served, 50.0) == (None, None)


def test_a_batch_holds_against_a_higher_priority_until_its_slo_would_be_missed() -> None:
    """The higher load's request of t=10 (4 s service) may wait 4 service times for its
    load to begin; the batch's drain (its 6 s service time) and stop come off that."""
    batch = holder(residency=ON_DEMAND, priority=100, busy=True, batch=True, service_s=6.0)
    higher = asker(10.0, priority=300, service_s=4.0)
    by = 10.0 + 4 * 4.0 - 6.0 - STOP_MARGIN_S
    assert holder_yield(higher, batch, 12.0) == (Block.BATCH, by)
    assert holder_yield(higher, batch, by) == (None, by)


def test_a_higher_priority_evicts_a_busy_instance_that_is_not_serving_a_batch() -> None:
    busy = holder(residency=ON_DEMAND, priority=100, busy=True, batch=False)
    assert holder_yield(asker(10.0, priority=300), busy, 10.0) == (None, None)


# -------------------------------------------------------------------------------- habits


def regular(every: float, times: int = 40) -> Habits:
    habits = Habits()
    t = 0.0
    for _ in range(times):
        habits.arrived(t, idle_since=t - every + 1.0 if t else None)
        habits.finished(1.0)
        t += every
    return habits


def test_with_too_little_evidence_the_owners_protect_is_taken_at_its_word() -> None:
    habits = Habits()
    habits.arrived(0.0, None)
    habits.arrived(30.0, idle_since=1.0)
    assert habits.p_asked_within(10.0, 60.0) == 1.0


def test_a_service_asked_every_30_s_is_likely_asked_again_until_it_has_been_quiet_long() -> None:
    habits = regular(30.0)
    assert habits.p_asked_within(10.0, 120.0) > 0.9
    assert habits.p_asked_within(600.0, 120.0) < 0.1  # idle past every gap it ever showed
    assert habits.rate == pytest.approx(1 / 30.0, rel=0.05)
    assert habits.expected_service_s == pytest.approx(1.0)


def test_a_service_asked_once_an_hour_is_unlikely_asked_within_a_minute() -> None:
    habits = regular(3600.0, times=10)
    assert habits.p_asked_within(60.0, 60.0) < 0.1
    assert habits.p_asked_within(3500.0, 200.0) > 0.5


def test_gaps_only_count_when_the_service_was_idle() -> None:
    habits = Habits()
    for t in range(10):
        habits.arrived(float(t), idle_since=None)  # always busy: no idle gap learned
    assert habits.mass == 0.0
    assert habits.p_asked_within(5.0, 5.0) == 1.0
