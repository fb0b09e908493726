"""Which victims to pick, and the snapshot of a resident instance that choice reads.

``Resident`` is a resident instance as admission sees it (its charge on one device,
whether it is busy, what its traffic has shown); ``outranks`` is the residency table's
first clause (``yielding`` decides the rest: when a protected holder yields).

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from service.domain import InstanceState, Residency
from service.scheduler.rules import ServiceRule

# Above this many candidates the exact search over victim sets (2^n of them) gives way
# to a greedy one. With the handful of services one device holds, the exact search is
# what actually happens.
MAX_EXACT = 12

# Two reload costs within this factor of each other compare as equal. Learned load times
# jitter by tens of percent between loads of the same model (disk cache, clocks); only a
# clearly cheaper reload should beat recency.
RELOAD_COST_TOLERANCE = 1.5

# The chance of being asked again that separates "unlikely", "maybe" and "likely" in the
# choice of victims (coarse on purpose: estimates jitter, classes do not).
LIKELY_CLASSES = (0.2, 0.5, 0.8)
# "Soon", for the choice among victims: the next few minutes.
SOON_S = 300.0


@dataclass(frozen=True, slots=True)
class Resident:
    """A resident instance as eviction sees it: a snapshot, not the live record.

    From its own traffic (``habits``): ``p_soon``, the chance it is asked again within
    the next ``SOON_S``; ``reload_cost``, its priority x the chance it is asked again
    before its protection lapses x the requests that would wait for its reload (the next
    one, and those expected to arrive during the load); ``service_s``, how long a request
    takes (a batch's drain).
    """

    name: str
    residency: Residency
    priority: int
    state: InstanceState
    charge: int
    busy: bool
    last_used: float | None = None
    load_s: float | None = None
    # No-thrash: still serving the batch of requests it was loaded for.
    batch_pending: bool = False
    claimed_by: str | None = None
    protect_s: float = 0.0
    in_flight: int = 0
    queued: int = 0
    p_soon: float = 1.0
    reload_cost: float = 0.0
    service_s: float = 0.0
    # Its ``yielding`` weight: what waits must outweigh weight x reload_cost (inf: never
    # early).
    yield_weight: float = 1.0

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


# (busy count, priorities high to low, likelihood classes high to low, reload cost class,
#  how many, recencies new to old, names)
SetKey = tuple[int, tuple[int, ...], tuple[int, ...], int, int, tuple[float, ...], tuple[str, ...]]


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


def likely_class(victim: Resident) -> int:
    """How likely it is to be asked again soon (within ``SOON_S``), in coarse classes."""
    return sum(1 for edge in LIKELY_CLASSES if victim.p_soon >= edge)


def set_key(victims: Sequence[Resident], cost_class: int = 0) -> SetKey:
    """Order of preference among victim sets (smaller is better): busy ones last, then
    by the priorities they hold (two idle 200s before one 300), the likelihood of being
    asked again, reload cost, then the fewest, then the least recently used."""
    return (
        sum(1 for v in victims if v.busy),
        tuple(sorted((v.priority for v in victims), reverse=True)),
        tuple(sorted((likely_class(v) for v in victims), reverse=True)),
        cost_class,
        len(victims),
        tuple(sorted((_recency(v) for v in victims), reverse=True)),
        tuple(sorted(v.name for v in victims)),
    )


def choose_victims(deficit: int, candidates: Sequence[Resident]) -> tuple[Resident, ...] | None:
    """The preferred set of ``candidates`` whose charges cover ``deficit``.

    Only minimal sets count (none of their members could be spared), and among them the
    least costly (``set_key``) wins. Returns ``()`` when nothing needs evicting and None
    when even all of them fall short.
    """
    if deficit <= 0:
        return ()
    pool = sorted(candidates, key=lambda v: v.name)
    if sum(v.charge for v in pool) < deficit:
        return None
    if len(pool) > MAX_EXACT:
        return _greedy(deficit, pool)
    sets = [
        combo
        for size in range(1, len(pool) + 1)
        for combo in combinations(pool, size)
        if _minimal_cover(combo, deficit)
    ]
    classes = cost_classes([reload_cost(c) for c in sets])
    keys = [set_key(c, k) for c, k in zip(sets, classes, strict=True)]
    return sets[min(range(len(sets)), key=keys.__getitem__)]


def _minimal_cover(victims: Sequence[Resident], deficit: int) -> bool:
    freed = sum(v.charge for v in victims)
    return freed >= deficit and freed - min(v.charge for v in victims) < deficit


def _greedy(deficit: int, pool: Sequence[Resident]) -> tuple[Resident, ...]:
    """Many candidates: take them cheapest first (the largest first among equals) until
    covered, then drop the spares."""

    def order(v: Resident) -> tuple[object, ...]:
        busy, priorities, likely, cost, _, recency, names = set_key((v,))
        return (busy, priorities, likely, cost, -v.charge, recency, names)

    chosen: list[Resident] = []
    for victim in sorted(pool, key=order):
        chosen.append(victim)
        if sum(v.charge for v in chosen) >= deficit:
            break
    for victim in sorted(chosen, key=lambda v: set_key((v,)), reverse=True):
        if sum(v.charge for v in chosen) - victim.charge >= deficit:
            chosen.remove(victim)
    return tuple(sorted(chosen, key=lambda v: v.name))


def _recency(victim: Resident) -> float:
    return -math.inf if victim.last_used is None else victim.last_used
