"""Who may evict whom, victim preferences, and admission decisions (DESIGN section 4)."""

from __future__ import annotations

import pytest

from service.domain import InstanceState, Residency
from service.scheduler import ServiceRule
from service.scheduler.admission import Evict, Place, Refuse, Room, Wait, decide
from service.scheduler.eviction import Resident, choose_victims, may_evict

MiB = 1024**2
PINNED, WARM, ON_DEMAND, WINDOW = (
    Residency.PINNED,
    Residency.WARM,
    Residency.ON_DEMAND,
    Residency.WINDOW_ONLY,
)
READY, STARTING, STOPPING = InstanceState.READY, InstanceState.STARTING, InstanceState.STOPPING


def rule(name: str = "s", priority: int = 100, residency: Residency = ON_DEMAND) -> ServiceRule:
    return ServiceRule(
        name=name,
        residency=residency,
        priority=priority,
        estimate=100,
        cap=None,
        max_concurrency=1,
        queue_max=1,
        queue_timeout_s=1.0,
        idle_ttl_s=0.0,
        stop_timeout_s=1.0,
    )


def res(
    name: str,
    charge: int = 100,
    *,
    residency: Residency = ON_DEMAND,
    priority: int = 100,
    busy: bool = False,
    last_used: float | None = 0.0,
    load_s: float | None = None,
    protected: bool = False,
    state: InstanceState = READY,
    claimed_by: str | None = None,
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
        protected=protected,
        claimed_by=claimed_by,
    )


@pytest.mark.parametrize(
    ("victim_residency", "victim_priority", "evictor_priority", "protected", "allowed"),
    [
        # pinned: never, whatever the priorities
        (PINNED, 0, 1000, False, False),
        (PINNED, 100, 100, False, False),
        # warm: only by a strictly higher priority
        (WARM, 100, 101, False, True),
        (WARM, 100, 100, False, False),
        (WARM, 100, 99, False, False),
        # on-demand: by equal or higher
        (ON_DEMAND, 100, 100, False, True),
        (ON_DEMAND, 100, 200, False, True),
        (ON_DEMAND, 100, 99, False, False),
        # window-only: by anything, a lower priority included
        (WINDOW, 100, 100, False, True),
        (WINDOW, 500, 1, False, True),
        # no-thrash: an instance still serving what it was loaded for resists an equal
        # priority, but not a strictly higher one
        (ON_DEMAND, 100, 100, True, False),
        (ON_DEMAND, 100, 101, True, True),
        (WINDOW, 100, 100, True, False),
        (WARM, 100, 101, True, True),
    ],
)
def test_may_evict(
    victim_residency: Residency,
    victim_priority: int,
    evictor_priority: int,
    protected: bool,
    allowed: bool,
) -> None:
    victim = res("v", residency=victim_residency, priority=victim_priority, protected=protected)
    assert may_evict(rule("e", evictor_priority), victim) is allowed


def test_protection_is_ignored_for_the_capacity_question() -> None:
    victim = res("v", protected=True)
    assert not may_evict(rule("e"), victim)
    assert may_evict(rule("e"), victim, ignore_protection=True)


def test_a_service_never_evicts_itself() -> None:
    assert not may_evict(rule("v", 1000), res("v", residency=WINDOW))


def names(victims: tuple[Resident, ...] | None) -> list[str] | None:
    return None if victims is None else sorted(v.name for v in victims)


@pytest.mark.parametrize(
    ("deficit", "candidates", "expected"),
    [
        # nothing to free
        (0, [res("a")], []),
        # even all of them fall short
        (500, [res("a", 200), res("b", 200)], None),
        # fewest instances first: one big busy one beats two small idle ones
        (300, [res("big", 300, busy=True), res("s1", 150), res("s2", 150)], ["big"]),
        # among sets of one: idle over busy
        (100, [res("busy", 200, busy=True), res("idle", 100)], ["idle"]),
        # then lower priority
        (100, [res("hi", priority=200), res("lo", priority=50)], ["lo"]),
        # idle beats lower priority
        (100, [res("lo", priority=10, busy=True), res("hi", priority=90)], ["hi"]),
        # then the cheaper reload per byte freed (20 s / 400 beats 10 s / 100)
        (100, [res("slow", 100, load_s=10.0), res("fast", 400, load_s=20.0)], ["fast"]),
        # unknown load time counts as 0 s
        (100, [res("known", load_s=1.0), res("unknown", load_s=None)], ["unknown"]),
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
) -> Room:
    return Room(
        device, available, held_by_others, total, foreign, headroom, budget_limit, residents
    )


def test_place_on_the_device_with_most_room_left() -> None:
    decision = decide(rule(), 300, [room(0, 400), room(1, 900), room(2, 200)])
    assert decision == Place(1, 900)
    assert decide(rule(), 300, [room(0, 400), room(1, 400)]) == Place(0, 400)


def test_refusal_names_the_holders() -> None:
    rooms = [
        room(
            0,
            available=310 * MiB,
            residents=(
                res("chat", 450 * MiB, residency=PINNED),
                res("tts", 100 * MiB, priority=200),
                res("old", 50 * MiB, priority=10),
            ),
            total=1338 * MiB,
            foreign=300 * MiB,
            headroom=128 * MiB,
        )
    ]
    decision = decide(rule("demo-image", 100), 600 * MiB, rooms)
    assert isinstance(decision, Refuse)
    assert decision.message == (
        "demo-image needs 600MiB but at most 360MiB can be freed on device 0: chat (pinned) "
        "holds 450MiB, tts (on-demand, priority 200) holds 100MiB, foreign processes 300MiB, "
        "headroom 128MiB"
    )
    assert decision.data["devices"][0]["holders"] == {"chat": 450 * MiB, "tts": 100 * MiB}


def test_refusal_covers_every_candidate_device() -> None:
    rooms = [room(0, 100, (res("p", 500, residency=PINNED),)), room(1, 200, budget_limit=200)]
    decision = decide(rule("x"), 600, rooms)
    assert isinstance(decision, Refuse)
    assert "at most 100B can be freed on device 0: p (pinned) holds 500B" in decision.message
    assert "; at most 200B can be freed on device 1: budget limit 200B of 1000B" in decision.message


def test_evict_on_the_device_needing_the_best_victim_set() -> None:
    rooms = [
        room(0, 100, (res("a", 300), res("b", 300))),  # needs two victims
        room(1, 100, (res("c", 600, busy=True),)),  # one busy victim
        room(2, 100, (res("d", 700),)),  # one idle victim
    ]
    decision = decide(rule(), 600, rooms)
    assert isinstance(decision, Evict)
    assert (decision.device, names(decision.victims), decision.deficit) == (2, ["d"], 500)


def test_memory_already_coming_back_is_claimed_before_evicting() -> None:
    going = res("going", 300, state=STOPPING)
    decision = decide(rule(), 500, [room(0, 100, (going, res("idle", 300)))])
    assert isinstance(decision, Evict)
    assert names(decision.claimed) == ["going"]
    assert names(decision.victims) == ["idle"]
    only_going = decide(rule(), 350, [room(0, 100, (going, res("idle", 300)))])
    assert isinstance(only_going, Evict)
    assert (names(only_going.victims), names(only_going.claimed)) == ([], ["going"])


def test_memory_claimed_by_another_load_is_not_counted() -> None:
    claimed = res("going", 300, state=STOPPING, claimed_by="other")
    decision = decide(rule(), 300, [room(0, 100, (claimed, res("idle", 300)))])
    assert isinstance(decision, Evict)
    assert (names(decision.victims), names(decision.claimed)) == (["idle"], [])


def test_wait_when_what_could_be_evicted_is_still_starting() -> None:
    decision = decide(rule(), 500, [room(0, 100, (res("loading", 600, state=STARTING),))])
    assert isinstance(decision, Wait)


def test_holds_of_other_loads_do_not_cause_a_refusal() -> None:
    decision = decide(rule(), 500, [room(0, -100, held_by_others=600)])
    assert isinstance(decision, Wait)


def test_a_lower_priority_never_evicts_a_higher_one() -> None:
    rooms = [room(0, 0, (res("hi", 1000, priority=500),))]
    assert isinstance(decide(rule("lo", 100), 500, rooms), Refuse)
    assert isinstance(decide(rule("hier", 600), 500, rooms), Evict)
