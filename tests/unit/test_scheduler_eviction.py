"""Who may evict whom, victim preferences, and admission decisions (docs/policy.md).

When a protected holder yields to what waits (deadlines, costs, batches) is in
tests/unit/test_scheduler_yielding.py; here the askers have nothing waiting unless a test
says, so the residency table and ``protect`` lapsing decide.
"""

from __future__ import annotations

import math

import pytest
from support.scheduling import rule

from service.domain import InstanceState, Residency
from service.scheduler.admission import Evict, Place, Refuse, Room, Wait, decide
from service.scheduler.eviction import (
    RELOAD_COST_TOLERANCE,
    Resident,
    choose_victims,
    cost_classes,
)
from service.scheduler.yielding import Asker, Block, eviction_block, may_evict

MiB = 1024**2
NEVER = math.inf
PINNED, WARM, ON_DEMAND, WINDOW = (
    Residency.PINNED,
    Residency.WARM,
    Residency.ON_DEMAND,
    Residency.WINDOW_ONLY,
)
READY, STARTING, STOPPING = InstanceState.READY, InstanceState.STARTING, InstanceState.STOPPING


def ask(name: str = "s", priority: int = 100) -> Asker:
    """A load with nothing waiting for it (no deadline, nothing to weigh)."""
    return Asker(rule(name, priority=priority))


def res(
    name: str,
    charge: int = 100,
    *,
    residency: Residency = ON_DEMAND,
    priority: int = 100,
    busy: bool = False,
    last_used: float | None = 0.0,
    load_s: float | None = None,
    batch: bool = False,
    state: InstanceState = READY,
    claimed_by: str | None = None,
    protect_s: float = 0.0,
) -> Resident:
    return Resident(
        name=name,
        residency=residency,
        priority=priority,
        state=state,
        charge=charge,
        busy=busy,
        last_used=last_used,
        load_s=load_s,
        batch_pending=batch,
        claimed_by=claimed_by,
        protect_s=protect_s,
        in_flight=1 if busy else 0,
    )


# Every victim below was last used at t=0 and has protect 60 s unless the row says.
@pytest.mark.parametrize(
    ("residency", "victim_p", "evictor_p", "busy", "batch", "protect", "now", "block"),
    [
        # pinned: never, whatever the priorities
        (PINNED, 0, 1000, False, False, 60, 1e9, Block.PINNED),
        # warm: a strictly higher priority at any time, busy or not
        (WARM, 100, 101, False, False, 60, 0, None),
        (WARM, 100, 101, True, False, 60, 0, None),
        # warm: an equal or lower one only once idle for protect
        (WARM, 100, 100, False, False, 60, 59, Block.PROTECTED),
        (WARM, 100, 100, False, False, 60, 60, None),
        (WARM, 100, 99, False, False, 60, 30, Block.PROTECTED),
        (WARM, 100, 1, False, False, 60, 61, None),
        (WARM, 100, 99, True, False, 60, 1e9, Block.BUSY),
        (WARM, 100, 99, False, False, NEVER, 1e9, Block.NEVER),
        # on-demand: an equal or higher priority at any time
        (ON_DEMAND, 100, 100, False, False, 60, 0, None),
        (ON_DEMAND, 100, 100, True, False, 60, 0, None),
        (ON_DEMAND, 100, 200, False, False, NEVER, 0, None),
        # on-demand: a lower one once idle for protect, never while busy
        (ON_DEMAND, 100, 99, False, False, 60, 10, Block.PROTECTED),
        (ON_DEMAND, 100, 99, False, False, 60, 60, None),
        (ON_DEMAND, 100, 99, True, False, 60, 1e9, Block.BUSY),
        (ON_DEMAND, 100, 99, False, False, NEVER, 1e9, Block.NEVER),
        (ON_DEMAND, 100, 99, False, False, 0, 0, None),
        # window-only: by anything, a lower priority included, busy or not
        (WINDOW, 100, 100, False, False, 0, 0, None),
        (WINDOW, 500, 1, True, False, 0, 0, None),
        # no-thrash: an instance still serving what it was loaded for resists an equal
        # priority and, while no request of it would miss its SLO, a higher one
        (ON_DEMAND, 100, 100, True, True, 60, 0, Block.BATCH),
        (ON_DEMAND, 100, 101, True, True, 60, 0, Block.BATCH),
        (WARM, 100, 101, True, True, 60, 0, Block.BATCH),
    ],
)
def test_eviction_block(
    residency: Residency,
    victim_p: int,
    evictor_p: int,
    busy: bool,
    batch: bool,
    protect: float,
    now: float,
    block: Block | None,
) -> None:
    victim = res(
        "v", residency=residency, priority=victim_p, busy=busy, batch=batch, protect_s=protect
    )
    assert eviction_block(ask("e", evictor_p), victim, now) is block
    assert may_evict(ask("e", evictor_p), victim, now) is (block is None)


def test_protection_counts_from_the_last_request_finished() -> None:
    victim = res("v", residency=WARM, priority=300, last_used=1000.0, protect_s=600)
    low = ask("low", 100)
    assert victim.protected_until() == 1600.0
    assert eviction_block(low, victim, 1599.9) is Block.PROTECTED
    assert eviction_block(low, victim, 1600.0) is None


def test_a_service_never_evicts_itself() -> None:
    assert eviction_block(ask("v", 1000), res("v", residency=WINDOW), 0) is Block.SELF


def names(victims: tuple[Resident, ...] | None) -> list[str] | None:
    return None if victims is None else sorted(v.name for v in victims)


@pytest.mark.parametrize(
    ("deficit", "candidates", "expected"),
    [
        # nothing to free
        (0, [res("a")], []),
        # even all of them fall short
        (500, [res("a", 200), res("b", 200)], None),
        # idle before busy: two small idle ones beat one big busy one
        (300, [res("big", 300, busy=True), res("s1", 150), res("s2", 150)], ["s1", "s2"]),
        # lower priorities before fewer victims: two idle 200s before one 300
        (
            300,
            [res("big", 300, priority=300), res("s1", 150, priority=200), res("s2", 150)],
            ["s1", "s2"],
        ),
        # the same priorities: the fewest
        (300, [res("big", 300), res("s1", 150), res("s2", 150)], ["big"]),
        # only minimal sets: no victim that could be spared
        (300, [res("big", 300), res("s1", 100, priority=10)], ["big"]),
        # among sets of one: idle over busy
        (100, [res("busy", 200, busy=True), res("idle", 100)], ["idle"]),
        # then lower priority
        (100, [res("hi", priority=200), res("lo", priority=50)], ["lo"]),
        # idle beats lower priority
        (100, [res("lo", priority=10, busy=True), res("hi", priority=90)], ["hi"]),
        # then the clearly cheaper reload per byte freed (20 s / 400 beats 10 s / 100)
        (100, [res("slow", 100, load_s=10.0), res("fast", 400, load_s=20.0)], ["fast"]),
        # unknown load time counts as 0 s
        (100, [res("known", load_s=1.0), res("unknown", load_s=None)], ["unknown"]),
        # reload costs within the tolerance are equal: least recently used decides
        (
            100,
            [res("recent", load_s=0.45, last_used=50.0), res("old", load_s=0.55, last_used=10.0)],
            ["old"],
        ),
        # then least recently used
        (100, [res("recent", last_used=50.0), res("old", last_used=10.0)], ["old"]),
        (100, [res("recent", last_used=50.0), res("never", last_used=None)], ["never"]),
        # finally the name, so the same state always gives the same plan
        (100, [res("b"), res("a")], ["a"]),
        # sets of two: the pair with fewer busy members
        (
            350,
            [res("a", 200, busy=True), res("b", 200), res("c", 200), res("d", 100)],
            ["b", "c"],
        ),
        # sets of two with the same busy count: the lower highest priority
        (
            350,
            [res("a", 200, priority=90), res("b", 200, priority=10), res("c", 200, priority=20)],
            ["b", "c"],
        ),
    ],
)
def test_choose_victims(
    deficit: int, candidates: list[Resident], expected: list[str] | None
) -> None:
    assert names(choose_victims(deficit, candidates)) == expected


@pytest.mark.parametrize("jitter", [0.40, 0.47, 0.499, 0.5, 0.501, 0.53, 0.62, 0.7])
def test_noise_in_load_times_never_reorders_alike_services(jitter: float) -> None:
    """Two identical services whose learned load times differ by noise around 0.5 s:
    whatever the noise, the least recently used one is evicted (no class boundary)."""
    pool = [
        res("used-last", 300, load_s=jitter, last_used=90.0),
        res("used-first", 300, load_s=0.5, last_used=10.0),
    ]
    assert names(choose_victims(300, pool)) == ["used-first"]


def test_cost_classes_chain_close_costs_and_split_far_ones() -> None:
    t = RELOAD_COST_TOLERANCE
    assert cost_classes([1.0, 1.0 * t, 1.0 * t * t]) == [1, 1, 1]  # a chain of close ones
    assert cost_classes([1.0, 1.0 * t * 1.01]) == [1, 2]
    assert cost_classes([0.0, 5.0]) == [0, 1]  # unknown is cheapest


def test_choose_victims_falls_back_to_the_largest_when_the_search_is_huge() -> None:
    pool = [res(f"s{i:02d}", 10 + i) for i in range(40)]
    chosen = choose_victims(sum(10 + i for i in range(20, 40)), pool)
    assert names(chosen) == [f"s{i:02d}" for i in range(20, 40)]


def room(
    device: int = 0,
    available: int = 0,
    residents: tuple[Resident, ...] = (),
    *,
    total: int = 1000,
    foreign: int = 0,
    headroom: int = 0,
    held_by_others: int = 0,
    budget_limit: int | None = None,
    budget: int | None = None,
) -> Room:
    if budget is None:
        ceiling = total if budget_limit is None else min(budget_limit, total)
        budget = min(ceiling, total - foreign) - headroom
    holds = (("other", held_by_others),) if held_by_others else ()
    return Room(
        device=device,
        available=available,
        budget=budget,
        held_by_others=held_by_others,
        total=total,
        foreign=foreign,
        headroom=headroom,
        budget_limit=budget_limit,
        residents=residents,
        holds=holds,
    )


def test_place_on_the_device_with_least_room_left_best_fit() -> None:
    """Best fit: a small load fills the tightest gap, so a large one later still finds
    the big free device whole."""
    decision = decide(Asker(rule()), 300, [room(0, 900), room(1, 400), room(2, 200)], 0)
    assert decision == Place(1, 400)
    assert decide(Asker(rule()), 300, [room(0, 400), room(1, 400)], 0) == Place(0, 400)


def test_refusal_only_when_even_every_unpinned_instance_gone_is_not_enough() -> None:
    rooms = [
        room(
            0,
            available=310 * MiB,
            residents=(
                res("chat", 450 * MiB, residency=PINNED),
                res("tts", 100 * MiB, priority=200, protect_s=60),
                res("old", 50 * MiB, priority=10),
            ),
            total=1338 * MiB,
            foreign=300 * MiB,
            headroom=128 * MiB,
        )
    ]
    decision = decide(Asker(rule("demo-image", priority=100)), 600 * MiB, rooms, 0)
    assert isinstance(decision, Refuse)
    assert decision.message == (
        "demo-image needs 600MiB but at most 460MiB can be freed on device 0: pinned chat "
        "holds 450MiB, foreign processes 300MiB, headroom 128MiB"
    )
    assert decision.data["devices"][0]["holders"] == {"chat": 450 * MiB}
    # 460 MiB could be freed: a load that needs it waits (tts outranks it), never refused
    assert isinstance(decide(Asker(rule("demo-image", priority=100)), 460 * MiB, rooms, 0), Wait)


def test_refusal_covers_every_candidate_device() -> None:
    rooms = [room(0, 100, (res("p", 500, residency=PINNED),)), room(1, 200, budget_limit=200)]
    decision = decide(Asker(rule("x")), 600, rooms, 0)
    assert isinstance(decision, Refuse)
    assert "at most 500B can be freed on device 0: pinned p holds 500B" in decision.message
    assert "; at most 200B can be freed on device 1: budget limit 200B of 1000B" in decision.message


def test_evict_on_the_device_needing_the_best_victim_set() -> None:
    rooms = [
        room(0, 100, (res("a", 300), res("b", 300))),  # needs two victims
        room(1, 100, (res("c", 600, busy=True),)),  # one busy victim
        room(2, 100, (res("d", 700),)),  # one idle victim
    ]
    decision = decide(Asker(rule()), 600, rooms, 0)
    assert isinstance(decision, Evict)
    assert (decision.device, names(decision.victims), decision.deficit) == (2, ["d"], 500)


def test_memory_already_coming_back_is_claimed_before_evicting() -> None:
    going = res("going", 300, state=STOPPING)
    decision = decide(Asker(rule()), 500, [room(0, 100, (going, res("idle", 300)))], 0)
    assert isinstance(decision, Evict)
    assert names(decision.claimed) == ["going"]
    assert names(decision.victims) == ["idle"]
    only_going = decide(Asker(rule()), 350, [room(0, 100, (going, res("idle", 300)))], 0)
    assert isinstance(only_going, Evict)
    assert (names(only_going.victims), names(only_going.claimed)) == ([], ["going"])


def test_memory_claimed_by_another_load_is_not_counted() -> None:
    claimed = res("going", 300, state=STOPPING, claimed_by="other")
    decision = decide(Asker(rule()), 300, [room(0, 100, (claimed, res("idle", 300)))], 0)
    assert isinstance(decision, Evict)
    assert (names(decision.victims), names(decision.claimed)) == (["idle"], [])


def test_wait_when_what_could_be_evicted_is_still_starting() -> None:
    decision = decide(Asker(rule()), 500, [room(0, 100, (res("loading", 600, state=STARTING),))], 0)
    assert isinstance(decision, Wait)
    assert [(h.name, h.why) for h in decision.holders] == [("loading", "starting")]


def test_holds_of_other_loads_do_not_cause_a_refusal() -> None:
    decision = decide(Asker(rule()), 500, [room(0, -100, held_by_others=600)], 0)
    assert isinstance(decision, Wait)
    assert [(h.why, h.by, h.charge) for h in decision.holders] == [("held", "other", 600)]


def test_a_lower_priority_waits_for_a_higher_ones_protection_then_evicts() -> None:
    hi = res("hi", 1000, residency=WARM, priority=500, last_used=100.0, protect_s=600)
    rooms = [room(0, 0, (hi,))]
    waiting = decide(Asker(rule("lo", priority=100)), 500, rooms, 400.0)
    assert isinstance(waiting, Wait)
    (holder,) = waiting.holders
    assert (holder.name, holder.why, holder.yields_at) == ("hi", "protected", 700.0)
    assert waiting.message("lo", 400.0) == (
        "lo waits for 500B (0B on device 0 available): hi (warm, priority 500) idle 5m, "
        "yields within 5m at the latest"
    )
    assert waiting.yields_at() == 700.0
    later = decide(Asker(rule("lo", priority=100)), 500, rooms, 700.0)
    assert isinstance(later, Evict) and names(later.victims) == ["hi"]
    assert isinstance(decide(Asker(rule("hier", priority=600)), 500, rooms, 400.0), Evict)


def test_a_busy_higher_priority_is_waited_for_and_named_busy() -> None:
    hi = res("hi", 1000, residency=ON_DEMAND, priority=500, busy=True, protect_s=0)
    decision = decide(Asker(rule("lo", priority=100)), 500, [room(0, 0, (hi,))], 1e6)
    assert isinstance(decision, Wait)
    assert decision.message("lo", 1e6).endswith(
        "hi (on-demand, priority 500) busy (1 in flight, 0 queued), yields when idle"
    )
    assert decision.yields_at() is None


def test_the_wait_key_ignores_the_passing_time() -> None:
    hi = res("hi", 1000, residency=WARM, priority=500, last_used=0.0, protect_s=600)
    first = decide(Asker(rule("lo", priority=100)), 500, [room(0, 0, (hi,))], 10.0)
    second = decide(Asker(rule("lo", priority=100)), 500, [room(0, 0, (hi,))], 20.0)
    assert isinstance(first, Wait) and isinstance(second, Wait)
    assert first.key == second.key
    assert first.message("lo", 10.0) != second.message("lo", 20.0)
