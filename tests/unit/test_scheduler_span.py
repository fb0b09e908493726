"""``span: N`` in the scheduler core: one instance on several devices (docs/policy.md).

A spanning load is placed on a set of devices, charged its share on each (even, or the
policy's ``memory.split`` in device order), measured per device, evicts per device, and
is evicted per device: a single-device load may take a spanning instance's share back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from support.scheduling import World, rule

from service.domain import Residency
from service.scheduler import (
    Action,
    InstanceReady,
    InstanceStopped,
    Note,
    Reject,
    RestartRequested,
    ServiceRule,
    Start,
    Stop,
)

MiB = 1024**2


def span2(name: str = "big", mib: int = 1600, **kwargs: object) -> ServiceRule:
    return rule(name, mib=mib, shares=(0.5, 0.5), **kwargs)  # type: ignore[arg-type]


def started(actions: Iterable[Action]) -> dict[str, tuple[int, ...]]:
    return {a.service: a.devices for a in actions if isinstance(a, Start)}


def stopped(actions: Iterable[Action]) -> list[str]:
    return [a.service for a in actions if isinstance(a, Stop) and a.drain]


def test_a_span_2_load_starts_on_two_devices_charged_half_on_each() -> None:
    world = World(span2(), devices={0: 1000 * MiB, 1: 1000 * MiB}, step=1.0)
    actions = world.request("r1", "big")
    assert started(actions) == {"big": (0, 1)}
    view = world.sched.service_view("big")
    assert view.devices == (0, 1)
    assert view.charges == {0: 800 * MiB, 1: 800 * MiB}
    for device in (0, 1):
        ledger = world.sched.ledger_view(device)
        assert ledger is not None and ledger.charges == {"big": 800 * MiB}
    [admit] = [a for a in actions if isinstance(a, Note) and a.kind == "admit"]
    assert admit.data["devices"] == [0, 1]
    assert "800MiB of 1000MiB available on device 1" in admit.message


def test_memory_split_charges_each_device_its_share_in_device_order() -> None:
    world = World(
        rule("big", mib=1000, shares=(0.7, 0.3)), devices={0: 800 * MiB, 1: 800 * MiB}, step=1.0
    )
    assert started(world.request("r1", "big")) == {"big": (0, 1)}
    assert world.sched.service_view("big").charges == {0: 700 * MiB, 1: 300 * MiB}


def test_a_span_is_placed_on_the_set_of_devices_it_fits_best() -> None:
    """Three GPUs, one of them big: the pair with the least room left is chosen, so
    the big GPU stays whole for a load that needs it."""
    world = World(span2(mib=1000), devices={0: 600 * MiB, 1: 4000 * MiB, 2: 600 * MiB}, step=1.0)
    assert started(world.request("r1", "big")) == {"big": (0, 2)}


def test_measured_bytes_above_the_share_are_charged_on_that_device() -> None:
    world = World(span2(), devices={0: 1000 * MiB, 1: 1000 * MiB}, step=1.0)
    world.request("r1", "big")
    world.send(InstanceReady("big"))
    world.measured["big"] = {0: 900 * MiB, 1: 500 * MiB}  # layers split unevenly
    world.sample()
    view = world.sched.service_view("big")
    assert view.measured_on == {0: 900 * MiB, 1: 500 * MiB}
    assert view.charges == {0: 900 * MiB, 1: 800 * MiB}


def test_a_span_larger_than_the_devices_allowed_is_refused_at_once() -> None:
    world = World(span2(gpus=(1,)), devices={0: 1000 * MiB, 1: 1000 * MiB}, step=1.0)
    [reject] = [a for a in world.request("r1", "big") if isinstance(a, Reject)]
    assert reject.code == "insufficient_capacity"
    assert "spans 2 devices but may use 1: [1]" in reject.message


def test_a_share_that_can_never_fit_on_a_device_is_refused_naming_it() -> None:
    pinned = rule("base", mib=700, residency=Residency.PINNED, gpus=(1,))
    world = World(pinned, span2(), devices={0: 1000 * MiB, 1: 1000 * MiB}, step=1.0)
    world.send(InstanceReady("base"))  # pinned: loaded at the first sample
    world.sample()
    [reject] = [a for a in world.request("r1", "big") if isinstance(a, Reject)]
    assert "800MiB, 800MiB on 2 devices" in reject.message
    assert "pinned base holds 700MiB" in reject.message


def test_a_span_load_evicts_only_what_blocks_its_share_on_each_device() -> None:
    world = World(
        rule("a", mib=600, gpus=(0,)),
        rule("b", mib=100, gpus=(1,)),
        span2(),
        devices={0: 1000 * MiB, 1: 1000 * MiB},
        step=1.0,
    )
    world.serve("a")
    world.serve("b")
    # device 0: 400 free, 800 needed -> a must go; device 1: 900 free -> b stays
    actions = world.request("r1", "big")
    assert stopped(actions) == ["a"]
    assert started(actions) == {}
    assert started(world.send(InstanceStopped("a"))) == {"big": (0, 1)}
    assert world.sched.service_view("b").state == "ready"


def test_a_waiting_span_load_holds_its_share_on_every_device() -> None:
    """While big waits for a on device 0, its share on device 1 is held: a lower load
    that would fit there now must not take it."""
    world = World(
        rule("a", mib=600, gpus=(0,)),
        span2(priority=200),
        rule("small", mib=300, priority=50, gpus=(1,)),
        devices={0: 1000 * MiB, 1: 1000 * MiB},
        step=1.0,
    )
    world.serve("a")
    assert stopped(world.request("r1", "big")) == ["a"]
    assert world.sched.ledger_view(1) is not None
    assert world.sched.ledger_view(1).held == 800 * MiB  # type: ignore[union-attr]
    actions = world.request("r2", "small")
    assert started(actions) == {}
    assert started(world.send(InstanceStopped("a"))) == {"big": (0, 1)}


def test_a_single_device_load_may_evict_a_spanning_instance_for_its_share() -> None:
    world = World(
        span2(priority=50),
        rule("x", mib=500, gpus=(1,)),
        devices={0: 1000 * MiB, 1: 1000 * MiB},
        step=1.0,
    )
    world.serve("big")
    actions = world.request("r1", "x")
    assert stopped(actions) == ["big"]
    [evict] = [a for a in actions if isinstance(a, Note) and a.kind == "evict"]
    assert "big (on-demand, priority 50, idle) frees 800MiB" in evict.message
    actions = world.send(InstanceStopped("big"))
    assert started(actions) == {"x": (1,)}
    for device in (0, 1):  # the spanning instance's charge left both devices
        ledger = world.sched.ledger_view(device)
        assert ledger is not None and "big" not in ledger.charges


def test_a_restarted_span_keeps_both_devices_claimed_and_comes_back_on_them() -> None:
    world = World(
        span2(),
        rule("other", mib=300, priority=500),
        devices={0: 1000 * MiB, 1: 1000 * MiB},
        step=1.0,
    )
    world.serve("big")
    world.send(RestartRequested("big", "operator"))
    assert world.sched.service_view("big").state == "stopping"
    # A higher priority that would fit only in big's memory waits for the restart.
    assert started(world.request("r1", "other")) == {}
    assert started(world.send(InstanceStopped("big"))) == {"big": (0, 1)}


def test_an_uneven_split_fits_devices_of_different_sizes() -> None:
    uneven = replace(span2(), shares=(0.25, 0.75))
    world = World(uneven, devices={0: 1000 * MiB, 1: 1300 * MiB}, step=1.0)
    assert started(world.request("r1", "big")) == {"big": (0, 1)}
    assert world.sched.service_view("big").charges == {0: 400 * MiB, 1: 1200 * MiB}


def test_span_decisions_keep_every_device_within_its_figures_on_random_boxes() -> None:
    """Random boxes (devices, residents, priorities, splits): a placement fits on each of
    its devices, an eviction covers each device's deficit with what it stops there, and
    a refusal happens only when no set of devices could ever offer every share."""
    from itertools import combinations

    from service.domain import InstanceState
    from service.scheduler.admission import Evict, Place, Refuse, Room, decide, max_offer
    from service.scheduler.eviction import Resident
    from service.scheduler.rules import share_of
    from service.scheduler.yielding import Asker

    rng = __import__("random").Random(20261201)
    for _ in range(400):
        ndev = rng.randint(1, 5)
        span = rng.randint(2, 4)
        cut = rng.uniform(0.2, 0.8)
        shares = (0.5, 0.5) if span == 2 and rng.random() < 0.5 else (1.0 / span,) * span
        if span == 2 and rng.random() < 0.3:
            shares = (cut, 1.0 - cut)
        r = rule("big", mib=rng.randint(200, 4000), shares=shares)
        rooms = []
        for d in range(ndev):
            residents = tuple(
                Resident(
                    name=f"s{d}{i}",
                    residency=rng.choice(list(Residency)),
                    priority=rng.choice([50, 100, 200]),
                    state=InstanceState.READY,
                    charge=rng.randint(1, 8) * 128 * MiB,
                    busy=rng.random() < 0.3,
                    last_used=0.0,
                )
                for i in range(rng.randint(0, 3))
            )
            budget = rng.randint(1, 12) * 256 * MiB
            available = budget - sum(x.charge for x in residents)
            rooms.append(Room(d, available, budget, 0, budget, 0, 0, None, residents=residents))
        need = r.estimate
        decision = decide(Asker(r), need, rooms, 1000.0)
        sizes = [share_of(need, shares, i) for i in range(span)]
        by_device = {room.device: room for room in rooms}
        if isinstance(decision, Place):
            assert len(decision.devices) == span
            for (device, size, _), want in zip(decision.spans, sizes, strict=True):
                assert size == want <= by_device[device].available
        elif isinstance(decision, Evict):
            stopped = {v.name for v in (*decision.victims, *decision.claimed)}
            for device, size, _ in decision.spans:
                room = by_device[device]
                freed = sum(x.charge for x in room.residents if x.name in stopped)
                assert room.available + freed >= size
                assert not any(
                    x.residency is Residency.PINNED for x in room.residents if x.name in stopped
                )
        elif isinstance(decision, Refuse):
            for rs in combinations(rooms, span):
                assert any(n > max_offer(x) for x, n in zip(rs, sizes, strict=True))


def test_explain_says_which_devices_a_span_would_take_and_what_it_would_evict() -> None:
    world = World(
        rule("a", mib=600, gpus=(0,)), span2(), devices={0: 1000 * MiB, 1: 1000 * MiB}, step=1.0
    )
    fits = world.sched.explain("big")
    assert (fits.verdict, fits.devices) == ("fits", (0, 1))
    assert fits.message.startswith("big fits on devices 0, 1: needs 1.6GiB: 800MiB of")
    world.serve("a")
    evicts = world.sched.explain("big")
    assert (evicts.verdict, evicts.devices) == ("evict", (0, 1))
    assert "big would evict a on devices 0, 1" in evicts.message
    assert evicts.as_dict()["devices"] == [0, 1]
