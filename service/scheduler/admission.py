"""Admission of one load: place it, plan evictions for it, make it wait, or refuse it.

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

from service.domain import InstanceState, Residency
from service.scheduler.eviction import Resident, SetKey, choose_victims, set_key
from service.scheduler.rules import ServiceRule, share_of
from service.scheduler.yielding import Asker, Block, eviction_block, holder_yield
from service.units import format_duration, format_size


@dataclass(frozen=True, slots=True)
class Room:
    """One candidate device as the loading service sees it."""

    device: int
    # Already less what other waiting loads hold on this device (their reservations).
    available: int
    budget: int
    held_by_others: int
    total: int
    foreign: int
    headroom: int
    budget_limit: int | None
    residents: tuple[Resident, ...] = ()
    # Other loads' reservations on this device: (service, bytes).
    holds: tuple[tuple[str, int], ...] = ()
    # What our instances held here when they stopped a moment ago (``Ledger``): it may
    # still read as foreign, so it does not count against what the device could offer.
    recently_stopped: int = 0


# A spanning load's part on one device: (device, need there, available there).
Span = tuple[int, int, int]


class _OnDevices:
    """Where a decision puts the load: one device, or every device of a span."""

    device: int
    available: int
    spans: tuple[Span, ...]

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(device for device, _, _ in self.spans) or (self.device,)

    def needs(self, need: int) -> tuple[tuple[int, int], ...]:
        """(device, bytes) per device: the whole ``need`` on a single device."""
        return tuple((device, size) for device, size, _ in self.spans) or ((self.device, need),)

    def where(self) -> str:
        if not self.spans:
            return f"device {self.device}"
        return "devices " + ", ".join(str(device) for device in self.devices)

    def figures(self, need: int) -> str:
        """``needs X, Y available`` in words, per device for a span."""
        if not self.spans:
            return f"needs {format_size(need)}, {format_size(self.available)} available"
        parts = ", ".join(
            f"{format_size(size)} of {format_size(room)} available on device {device}"
            for device, size, room in self.spans
        )
        return f"needs {format_size(need)}: {parts}"


@dataclass(frozen=True, slots=True)
class Place(_OnDevices):
    device: int
    available: int
    spans: tuple[Span, ...] = ()


@dataclass(frozen=True, slots=True)
class Evict(_OnDevices):
    """Stop ``victims`` and claim ``claimed`` (already stopping); start when all are gone."""

    device: int
    available: int
    deficit: int
    victims: tuple[Resident, ...]
    claimed: tuple[Resident, ...]
    spans: tuple[Span, ...] = ()


# Turns a time on the scheduler's clock into words ("12:03:10"); the daemon passes one
# that knows the wall clock, the bench none (then "in 1m10s").
ClockText = Callable[[float], str]


def when_text(at: float, now: float, clock: ClockText | None) -> str:
    """``by 12:03:10`` if ``clock`` knows the wall clock, else ``within 1m10s``."""
    if clock is not None:
        return f"by {clock(at)}"
    return f"within {format_duration(max(0.0, at - now))}"


@dataclass(frozen=True, slots=True)
class Holder:
    """Something a waiting load waits for: an instance, or another load's reservation.

    ``why`` is a ``Block`` value, or ``starting`` / ``stopping`` / ``claimed`` (by
    another waiting load, ``by``) / ``held`` (memory reserved for ``by``'s load).
    ``yields_at`` is the latest moment it yields if nothing else changes (its
    protection lapsing, the waiting load's deadline or SLO), when known.
    """

    name: str
    device: int
    why: str
    charge: int
    residency: str | None = None
    priority: int | None = None
    in_flight: int = 0
    queued: int = 0
    last_used: float | None = None
    yields_at: float | None = None
    by: str | None = None

    def idle_for(self, now: float) -> float | None:
        """How long the holder has been idle (None: busy, or a reservation)."""
        if self.why == "held" or self.in_flight or self.queued or self.last_used is None:
            return None
        return max(0.0, now - self.last_used)

    def describe(self, now: float, clock: ClockText | None = None) -> str:
        if self.why == "held":
            return f"{format_size(self.charge)} held for {self.by}'s load"
        who = f"{self.name} ({self.residency}, priority {self.priority})"
        latest = None if self.yields_at is None else when_text(self.yields_at, now, clock)
        match self.why:
            case Block.PROTECTED:
                idle = format_duration(self.idle_for(now) or 0.0)
                if latest is None:
                    return f"{who} idle {idle}, protected"
                return f"{who} idle {idle}, yields {latest} at the latest"
            case Block.BUSY:
                return (
                    f"{who} busy ({self.in_flight} in flight, {self.queued} queued), "
                    "yields when idle"
                )
            case Block.NEVER:
                return f"{who} protect: never: does not yield to a lower priority"
            case Block.BATCH:
                text = f"{who} serving the requests it was loaded for"
                if latest is None:
                    return f"{text}, yields when they are served"
                return f"{text}, yields {latest} at the latest"
            case "starting":
                return f"{who} still starting"
            case "stopping":
                return f"{who} stopping for {self.by}'s load"
            case "claimed":
                return f"{who} claimed by {self.by}'s load"
        return f"{who} holds {format_size(self.charge)}"

    def as_dict(self, now: float, clock: ClockText | None = None) -> dict[str, object]:
        return {
            "service": self.name,
            "device": self.device,
            "why": str(self.why),
            "bytes": self.charge,
            "residency": self.residency,
            "priority": self.priority,
            "in_flight": self.in_flight,
            "queued": self.queued,
            "idle_for_s": self.idle_for(now),
            "yields_in_s": None if self.yields_at is None else max(0.0, self.yields_at - now),
            "by": self.by,
            "text": self.describe(now, clock),
        }


@dataclass(frozen=True, slots=True)
class Wait:
    need: int
    available: dict[int, int]
    holders: tuple[Holder, ...]

    def message(self, name: str, now: float, clock: ClockText | None = None) -> str:
        rooms = ", ".join(f"{format_size(a)} on device {d}" for d, a in self.available.items())
        text = f"{name} waits for {format_size(self.need)} ({rooms} available)"
        if self.holders:
            text += ": " + "; ".join(h.describe(now, clock) for h in self.holders)
        return text

    @property
    def key(self) -> str:
        """Stays the same while the same holders keep the memory: the times in the
        message move on, and a holder flips between busy and protected with every
        request it serves, which would say the same wait again and again."""
        return ",".join(sorted(f"{h.name}:{h.by}" for h in self.holders))

    def yields_at(self) -> float | None:
        """The latest moment the first holder yields (what a client is told)."""
        times = [h.yields_at for h in self.holders if h.yields_at is not None]
        return min(times) if times else None


@dataclass(frozen=True, slots=True)
class Refuse:
    message: str
    data: dict[str, object] = field(default_factory=dict)


Decision = Place | Evict | Wait | Refuse


def decide(asker: Asker, need: int, rooms: Sequence[Room], now: float) -> Decision:
    """Admission of ``asker``'s load needing ``need`` bytes (steps 1-4 above)."""
    rule = asker.rule
    if rule.span > 1:
        return _decide_span(asker, need, rooms, now)
    fitting = [room for room in rooms if need <= room.available]
    if fitting:
        best = min(fitting, key=lambda room: (room.available - need, room.device))
        return Place(best.device, best.available)
    offers = {room.device: max_offer(room) for room in rooms}
    if all(need > offers[room.device] for room in rooms):
        return _refusal(rule, need, rooms, offers)
    options: list[tuple[tuple[SetKey, int, int], Evict]] = []
    for room in rooms:
        if need > offers[room.device]:
            continue
        plan = _plan_on(asker, need, room, now)
        if plan is None:
            continue
        freed = sum(v.charge for v in (*plan.victims, *plan.claimed))
        rank = (
            set_key(plan.victims),
            need - room.available - freed,
            room.device,
        )
        options.append((rank, plan))
    if not options:
        return _wait(asker, need, [r for r in rooms if need <= offers[r.device]], now)
    return min(options, key=lambda option: option[0])[1]


def max_offer(room: Room) -> int:
    """What ``room`` could offer with every instance that is not pinned gone.

    Holds of other waiting loads do not count: they are transient, and a load must not
    be refused for good because another one is momentarily in line before it. Nor does
    memory our instances held until a moment ago (``Room.recently_stopped``), which a
    driver may still report as a foreign process's.
    """
    pinned = sum(r.charge for r in room.residents if r.residency is Residency.PINNED)
    limit = room.total if room.budget_limit is None else min(room.budget_limit, room.total)
    return min(room.budget + room.recently_stopped, limit - room.headroom) - pinned


def _plan_on(asker: Asker, need: int, room: Room, now: float) -> Evict | None:
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
        and eviction_block(asker, r, now) is None
    ]
    victims = choose_victims(rest, candidates)
    if victims is None:
        return None
    return Evict(room.device, room.available, deficit, victims, tuple(claimed))


def _decide_span(asker: Asker, need: int, rooms: Sequence[Room], now: float) -> Decision:
    """``decide`` for a load that spans ``rule.span`` devices at once (``span: N``).

    Every set of ``span`` candidate devices is a candidate placement; device i of a set
    (lowest index first, the order ``CUDA_VISIBLE_DEVICES`` lists them in) takes share i
    of the need. The same steps as one device, per set: it can never fit when no set
    could offer every device its share; it fits when every device has room (best fit:
    the set with the least room left over); else the set whose victims are fewest and
    best, each device's deficit covered by victims on that device; else it waits.
    """
    rule = asker.rule
    span = rule.span
    ordered = sorted(rooms, key=lambda room: room.device)
    if len(ordered) < span:
        devices = [room.device for room in ordered]
        message = (
            f"{rule.name} spans {span} devices but may use {len(ordered)}: {devices or 'none'}"
        )
        return Refuse(message, {"need": need, "span": span, "devices": devices})
    shares = [share_of(need, rule.shares, i) for i in range(span)]
    sets = list(combinations(ordered, span))
    fitting = [rs for rs in sets if all(n <= r.available for r, n in zip(rs, shares, strict=True))]
    if fitting:
        best = min(
            fitting,
            key=lambda rs: (
                sum(r.available - n for r, n in zip(rs, shares, strict=True)),
                tuple(r.device for r in rs),
            ),
        )
        spans = tuple((r.device, n, r.available) for r, n in zip(best, shares, strict=True))
        return Place(best[0].device, best[0].available, spans)
    offers = {room.device: max_offer(room) for room in ordered}
    possible = [
        rs for rs in sets if all(n <= offers[r.device] for r, n in zip(rs, shares, strict=True))
    ]
    if not possible:
        per_device = ", ".join(format_size(n) for n in shares)
        return _refusal(rule, need, ordered, offers, f" ({per_device} on {span} devices)")
    options: list[tuple[tuple[SetKey, int, tuple[int, ...]], Evict]] = []
    plans: dict[tuple[int, int], Evict | None] = {}  # one device's plan, shared by sets
    for rs in possible:
        plan = _plan_span(asker, rs, shares, now, plans)
        if plan is not None:
            freed = sum(v.charge for v in (*plan.victims, *plan.claimed))
            rank = (set_key(plan.victims), plan.deficit - freed, plan.devices)
            options.append((rank, plan))
    if not options:
        useful = {r.device: r for rs in possible for r in rs}
        return _wait(asker, need, [useful[d] for d in sorted(useful)], now)
    return min(options, key=lambda option: option[0])[1]


def _plan_span(
    asker: Asker,
    rooms: Sequence[Room],
    shares: Sequence[int],
    now: float,
    plans: dict[tuple[int, int], Evict | None],
) -> Evict | None:
    """Victims on each device of one set, or None if some device cannot be covered now.

    Devices are planned in order, and a victim chosen on one device frees its share on
    the later ones too, so an instance spanning both is not counted twice. A device's
    plan for a share, with nothing freed there by the set's earlier devices, is the same
    in every set: ``plans`` keeps it (eight GPUs have 70 sets of four).
    """
    victims: dict[str, Resident] = {}
    claimed: dict[str, Resident] = {}
    spans: list[Span] = []
    deficit = 0
    for room, size in zip(rooms, shares, strict=True):
        chosen = set(victims) | set(claimed)
        freed = sum(r.charge for r in room.residents if r.name in chosen)
        spans.append((room.device, size, room.available))
        if size <= room.available + freed:
            continue
        if freed == 0 and not any(r.name in chosen for r in room.residents):
            key = (room.device, size)
            if key not in plans:
                plans[key] = _plan_on(asker, size, room, now)
            plan = plans[key]
        else:
            rest = replace(
                room,
                available=room.available + freed,
                residents=tuple(r for r in room.residents if r.name not in chosen),
            )
            plan = _plan_on(asker, size, rest, now)
        if plan is None:
            return None
        deficit += plan.deficit
        for r in room.residents:  # this device's charges are what it frees here
            if r.name in {v.name for v in plan.victims}:
                victims.setdefault(r.name, r)
            elif r.name in {c.name for c in plan.claimed}:
                claimed.setdefault(r.name, r)
    first = rooms[0]
    return Evict(
        first.device,
        first.available,
        deficit,
        tuple(sorted(victims.values(), key=lambda r: r.name)),
        tuple(sorted(claimed.values(), key=lambda r: r.name)),
        tuple(spans),
    )


def holders(asker: Asker, rooms: Sequence[Room], now: float) -> tuple[Holder, ...]:
    """What keeps memory from ``asker``'s load on ``rooms`` now, largest first."""
    rule = asker.rule
    out: list[Holder] = []
    for room in rooms:
        for r in sorted(room.residents, key=lambda r: (-r.charge, r.name)):
            why: str | None
            latest = None
            by = r.claimed_by
            if r.residency is Residency.PINNED:
                continue  # never yields: counted in max_offer, not waited for
            if r.going:
                why = "stopping" if by not in (None, rule.name) else None
            elif by not in (None, rule.name):
                why = "claimed"
            elif r.state is InstanceState.STARTING:
                why = "starting"
            else:
                why, latest = holder_yield(asker, r, now)
            if why is None:
                continue
            out.append(
                Holder(
                    name=r.name,
                    device=room.device,
                    why=str(why),
                    charge=r.charge,
                    residency=str(r.residency),
                    priority=r.priority,
                    in_flight=r.in_flight,
                    queued=r.queued,
                    last_used=r.last_used,
                    yields_at=latest,
                    by=by if why in ("stopping", "claimed") else None,
                )
            )
        out += [
            Holder(name=name, device=room.device, why="held", charge=size, by=name)
            for name, size in room.holds
            if size > 0
        ]
    return tuple(out)


def _wait(asker: Asker, need: int, rooms: Sequence[Room], now: float) -> Wait:
    return Wait(need, {room.device: room.available for room in rooms}, holders(asker, rooms, now))


def _refusal(
    rule: ServiceRule,
    need: int,
    rooms: Sequence[Room],
    offers: dict[int, int],
    needs: str = "",
) -> Refuse:
    parts: list[str] = []
    devices: list[dict[str, object]] = []
    for room in rooms:
        pinned = [
            r
            for r in sorted(room.residents, key=lambda r: (-r.charge, r.name))
            if r.residency is Residency.PINNED
        ]
        named = [f"pinned {r.name} holds {format_size(r.charge)}" for r in pinned]
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
                "holders": {r.name: r.charge for r in pinned},
                "foreign": room.foreign,
                "headroom": room.headroom,
                "budget_limit": limit,
            }
        )
    message = f"{rule.name} needs {format_size(need)}{needs} but " + "; ".join(parts)
    return Refuse(message, {"need": need, "devices": devices})
