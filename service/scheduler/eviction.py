"""Who may evict whom now, and which victims to pick (DESIGN section 4, step 3).

The residency table decides *whether* an instance may be evicted for a service now:

    pinned       never
    warm         by a strictly higher priority; by an equal or lower one once it has
                 been idle for its ``protect``
    on-demand    by an equal or higher priority; by a lower one once idle for ``protect``
    window-only  by anything (it is batch work)

An evictor the table's first clause does not allow is *outranked*: for it the instance
yields only when idle, and only after ``protect`` (``never``: not at all). An instance
with requests in flight or queued is never evicted by an outranked service.

The no-thrash rule stays: an instance still serving the requests that were queued when
its load began is protected from an *equal* priority (a strictly higher one still wins),
so two equal services cannot take turns evicting each other before either serves
anything.

``eviction_block`` says why an instance cannot be evicted now (None: it can), so the
same rule decides, explains a wait and says when the holder can yield.

``choose_victims`` then picks the set: the fewest instances that cover the deficit, and
among sets of that size the one that evicts idle instances before busy ones, lower
priorities before higher, cheaper reloads (learned load seconds per byte freed) before
dearer, and least recently used before recently used; names break the last tie so the
same state always gives the same plan. Reload costs within ``RELOAD_COST_TOLERANCE`` of
each other compare as equal (``cost_classes``), so measurement noise never reorders two
alike services: recency decides between them. An unknown load time counts as 0 s: every
resident instance has been loaded, so the orchestrator normally knows it, and guessing a
default would rank services by an invented figure.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from service.domain import InstanceState, Residency
from service.scheduler.rules import ServiceRule

# Above this many same-size combinations the exact search gives way to "the k largest",
# which always covers the deficit with the fewest instances. With the handful of services
# one machine runs, the exact search is what actually happens.
MAX_COMBINATIONS = 20_000

# Two reload costs within this factor of each other compare as equal. Learned load times
# jitter by tens of percent between loads of the same model (disk cache, clocks); only a
# clearly cheaper reload should beat recency.
RELOAD_COST_TOLERANCE = 1.5


class Block(enum.StrEnum):
    """Why an instance cannot be evicted for a given service now."""

    SELF = "self"
    PINNED = "pinned"
    NEVER = "never"  # outranks the evictor and its protect is ``never``
    BUSY = "busy"  # outranks the evictor and has requests in flight or queued
    PROTECTED = "protected"  # outranks the evictor, idle, within its protect
    BATCH = "batch"  # no-thrash: serving what it was loaded for, evictor of equal priority


@dataclass(frozen=True, slots=True)
class Resident:
    """A resident instance as eviction sees it: a snapshot, not the live record."""

    name: str
    residency: Residency
    priority: int
    state: InstanceState
    charge: int
    busy: bool
    last_used: float | None = None
    load_s: float | None = None
    # No-thrash: still serving requests that were queued when its load began.
    batch_pending: bool = False
    claimed_by: str | None = None
    protect_s: float = 0.0
    in_flight: int = 0
    queued: int = 0

    @property
    def going(self) -> bool:
        """Already on its way out: its memory will come back without a new eviction."""
        return self.state in (InstanceState.DRAINING, InstanceState.STOPPING)

    @property
    def idle_since(self) -> float | None:
        """When its last request finished, if nothing is in flight or queued now."""
        return None if self.busy else self.last_used

    def protected_until(self) -> float | None:
        """When an idle instance's protection lapses (None: busy, or protect never)."""
        since = self.idle_since
        if since is None or math.isinf(self.protect_s):
            return None
        return since + self.protect_s


def outranks(victim: Resident, evictor: ServiceRule) -> bool:
    """Whether the residency table's first clause keeps ``evictor`` from ``victim``."""
    if victim.residency is Residency.WARM:
        return victim.priority >= evictor.priority
    if victim.residency is Residency.ON_DEMAND:
        return victim.priority > evictor.priority
    return victim.residency is Residency.PINNED


def eviction_block(evictor: ServiceRule, victim: Resident, now: float) -> Block | None:
    """Why ``evictor``'s load may not evict ``victim`` at ``now``; None if it may."""
    if victim.name == evictor.name:
        return Block.SELF
    if victim.residency is Residency.PINNED:
        return Block.PINNED
    if victim.residency is Residency.WINDOW_ONLY:
        return None
    if not outranks(victim, evictor):
        if victim.batch_pending and victim.priority == evictor.priority:
            return Block.BATCH
        return None
    if math.isinf(victim.protect_s):
        return Block.NEVER
    if victim.busy:
        return Block.BUSY
    until = victim.protected_until()
    if until is not None and now < until:
        return Block.PROTECTED
    return None


def may_evict(evictor: ServiceRule, victim: Resident, now: float) -> bool:
    return eviction_block(evictor, victim, now) is None


# (busy count, priorities high to low, reload cost class, recencies new to old, names)
SetKey = tuple[int, tuple[int, ...], int, tuple[float, ...], tuple[str, ...]]


def reload_cost(victims: Sequence[Resident]) -> float:
    """Reload seconds per byte freed by evicting ``victims`` (0 when unknown)."""
    freed = sum(v.charge for v in victims)
    reload_s = sum(v.load_s or 0.0 for v in victims)
    return reload_s / freed if reload_s > 0 and freed > 0 else 0.0


def cost_classes(costs: Sequence[float]) -> list[int]:
    """A class per cost such that costs within ``RELOAD_COST_TOLERANCE`` share one.

    Sorted costs are chained: each joins the class of the one below it when it is within
    the tolerance of it, so the boundaries fall in the gaps between the costs present,
    never at fixed points a noisy figure could cross. Unknown (0) costs are class 0.
    """
    ranks: dict[float, int] = {}
    current, previous = 0, 0.0
    for cost in sorted(set(costs)):
        if cost > 0 and (previous <= 0 or cost > previous * RELOAD_COST_TOLERANCE):
            current += 1
        ranks[cost] = current
        previous = cost
    return [ranks[c] for c in costs]


def set_key(victims: Sequence[Resident], cost_class: int = 0) -> SetKey:
    """Order of preference among victim sets of the same size (smaller is better)."""
    return (
        sum(1 for v in victims if v.busy),
        tuple(sorted((v.priority for v in victims), reverse=True)),
        cost_class,
        tuple(sorted((_recency(v) for v in victims), reverse=True)),
        tuple(sorted(v.name for v in victims)),
    )


def choose_victims(deficit: int, candidates: Sequence[Resident]) -> tuple[Resident, ...] | None:
    """The preferred smallest set of ``candidates`` whose charges cover ``deficit``.

    Returns ``()`` when nothing needs evicting and None when even all of them fall short.
    """
    if deficit <= 0:
        return ()
    pool = sorted(candidates, key=lambda v: v.name)
    largest = sorted((v.charge for v in pool), reverse=True)
    size, covered = 0, 0
    for charge in largest:
        size += 1
        covered += charge
        if covered >= deficit:
            break
    else:
        return None
    if math.comb(len(pool), size) > MAX_COMBINATIONS:
        chosen = sorted(pool, key=lambda v: (-v.charge, v.name))[:size]
        return tuple(sorted(chosen, key=lambda v: v.name))
    sets = [c for c in combinations(pool, size) if sum(v.charge for v in c) >= deficit]
    classes = cost_classes([reload_cost(c) for c in sets])
    keys = [set_key(c, k) for c, k in zip(sets, classes, strict=True)]
    return sets[min(range(len(sets)), key=keys.__getitem__)]


def _recency(victim: Resident) -> float:
    return -math.inf if victim.last_used is None else victim.last_used
