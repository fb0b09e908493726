"""Admission of one load: place it, plan evictions for it, make it wait, or refuse it.

``decide`` is a pure function of one service's need and a snapshot of its candidate
devices (``Room``); the scheduler core applies the answer. It follows DESIGN section 4:

1. If, on every candidate device, the need exceeds what the device could offer with every
   instance the service may evict gone (and every instance already stopping gone), the
   load can never fit: ``Refuse``, naming what holds the memory.
2. If it fits somewhere as things stand: ``Place`` it on the device with the most room
   left after placing it (lowest index on a tie), so later loads find the most room.
3. Else, per device: first count memory already on its way back (instances draining or
   stopping that no other load has claimed), then pick victims (``eviction``) for the
   rest. The device whose victim set is best (fewest, then the eviction preferences, then
   most room left) wins: ``Evict``. If no device can cover the deficit now (the
   instances that would have to go are still starting), ``Wait``: the core re-runs
   admission after the next event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.domain import InstanceState, Residency
from service.scheduler.eviction import Resident, SetKey, choose_victims, may_evict, set_key
from service.scheduler.rules import ServiceRule
from service.units import format_size


@dataclass(frozen=True, slots=True)
class Room:
    """One candidate device as the loading service sees it."""

    device: int
    # Already less what other waiting loads hold on this device (their reservations).
    available: int
    held_by_others: int
    total: int
    foreign: int
    headroom: int
    budget_limit: int | None
    residents: tuple[Resident, ...] = ()


@dataclass(frozen=True, slots=True)
class Place:
    device: int
    available: int


@dataclass(frozen=True, slots=True)
class Evict:
    """Stop ``victims`` and claim ``claimed`` (already stopping); start when all are gone."""

    device: int
    available: int
    deficit: int
    victims: tuple[Resident, ...]
    claimed: tuple[Resident, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Refuse:
    message: str
    data: dict[str, Any] = field(default_factory=dict)


Decision = Place | Evict | Wait | Refuse


def decide(rule: ServiceRule, need: int, rooms: Sequence[Room]) -> Decision:
    """Admission of a load of ``rule.name`` needing ``need`` bytes (steps 1-3 above)."""
    fitting = [room for room in rooms if need <= room.available]
    if fitting:
        best = max(fitting, key=lambda room: (room.available - need, -room.device))
        return Place(best.device, best.available)
    offers = {room.device: max_offer(rule, room) for room in rooms}
    if all(need > offers[room.device] for room in rooms):
        return _refusal(rule, need, rooms, offers)
    options: list[tuple[tuple[int, SetKey, int, int], Evict]] = []
    for room in rooms:
        if need > offers[room.device]:
            continue
        plan = _plan_on(rule, need, room)
        if plan is None:
            continue
        freed = sum(v.charge for v in (*plan.victims, *plan.claimed))
        rank = (
            len(plan.victims),
            set_key(plan.victims),
            need - room.available - freed,
            room.device,
        )
        options.append((rank, plan))
    if not options:
        return _wait(rule, need, rooms)
    return min(options, key=lambda option: option[0])[1]


def max_offer(rule: ServiceRule, room: Room) -> int:
    """What ``room`` could offer ``rule``'s service with everything it may evict gone.

    Holds of other waiting loads are added back: they are transient, and a load must not
    be refused for good because another one is momentarily in line before it.
    """
    gone = sum(
        r.charge for r in room.residents if r.going or may_evict(rule, r, ignore_protection=True)
    )
    return room.available + room.held_by_others + gone


def _plan_on(rule: ServiceRule, need: int, room: Room) -> Evict | None:
    deficit = need - room.available
    claimed: list[Resident] = []
    coming = [r for r in room.residents if r.going and r.claimed_by is None]
    for resident in sorted(coming, key=lambda r: (-r.charge, r.name)):
        if deficit - sum(c.charge for c in claimed) <= 0:
            break
        claimed.append(resident)
    rest = deficit - sum(c.charge for c in claimed)
    candidates = [
        r
        for r in room.residents
        if not r.going
        and r.claimed_by is None
        and r.state is InstanceState.READY
        and may_evict(rule, r)
    ]
    victims = choose_victims(rest, candidates)
    if victims is None:
        return None
    return Evict(room.device, room.available, deficit, victims, tuple(claimed))


def _wait(rule: ServiceRule, need: int, rooms: Sequence[Room]) -> Wait:
    """Why a load that could fit cannot be planned yet, in words that stay the same
    while the reason does (the core says each distinct wait once)."""
    residents = [r for room in rooms for r in room.residents]
    evictable = [r for r in residents if may_evict(rule, r, ignore_protection=True)]
    starting = sorted(r.name for r in evictable if r.state is InstanceState.STARTING)
    protected = sorted(
        r.name for r in evictable if r.state is InstanceState.READY and not may_evict(rule, r)
    )
    going = sorted(r.name for r in residents if r.going)
    reasons = []
    if starting:
        reasons.append(f"still starting: {', '.join(starting)}")
    if protected:
        reasons.append(f"serving the requests they were loaded for: {', '.join(protected)}")
    if going:
        reasons.append(f"stopping for other loads: {', '.join(going)}")
    if any(room.held_by_others > 0 for room in rooms):
        reasons.append("memory held for other loads waiting on evictions")
    message = f"{rule.name} waits for {format_size(need)}: " + ("; ".join(reasons) or "no room")
    figures = {room.device: room.available for room in rooms}
    return Wait(message, {"need": need, "available": figures, "reasons": reasons})


def _refusal(rule: ServiceRule, need: int, rooms: Sequence[Room], offers: dict[int, int]) -> Refuse:
    parts: list[str] = []
    devices: list[dict[str, Any]] = []
    for room in rooms:
        holders = [
            r
            for r in sorted(room.residents, key=lambda r: (-r.charge, r.name))
            if not r.going and not may_evict(rule, r, ignore_protection=True)
        ]
        named = [f"{r.name} ({_describe(r)}) holds {format_size(r.charge)}" for r in holders]
        if room.foreign > 0:
            named.append(f"foreign processes {format_size(room.foreign)}")
        if room.headroom > 0:
            named.append(f"headroom {format_size(room.headroom)}")
        limit = room.budget_limit
        if limit is not None and limit < room.total - room.foreign:
            named.append(f"budget limit {format_size(limit)} of {format_size(room.total)}")
        offer = format_size(max(0, offers[room.device]))
        if not named:
            named.append(f"the device has {format_size(room.total)} in all")
        parts.append(f"at most {offer} can be freed on device {room.device}: {', '.join(named)}")
        devices.append(
            {
                "device": room.device,
                "max_offer": offers[room.device],
                "holders": {r.name: r.charge for r in holders},
                "foreign": room.foreign,
                "headroom": room.headroom,
                "budget_limit": limit,
            }
        )
    message = f"{rule.name} needs {format_size(need)} but " + "; ".join(parts)
    return Refuse(message, {"need": need, "devices": devices})


def _describe(resident: Resident) -> str:
    if resident.residency is Residency.PINNED:
        return "pinned"
    return f"{resident.residency}, priority {resident.priority}"
