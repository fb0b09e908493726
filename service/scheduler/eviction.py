"""Who may evict whom, and which victims to pick (DESIGN section 4, step 3).

The residency table decides *whether* an instance may be evicted for a service:

    pinned       never
    warm         by a strictly higher priority
    on-demand    by an equal or higher priority
    window-only  by anything (it is batch work)

plus the no-thrash rule: an instance still serving the requests that were queued when its
load began is protected from an *equal* priority (a strictly higher one still wins), so
two equal services cannot take turns evicting each other before either serves anything.

``choose_victims`` then picks the set: the fewest instances that cover the deficit, and
among sets of that size the one that evicts idle instances before busy ones, lower
priorities before higher, cheaper reloads (learned load seconds per byte freed) before
dearer, and least recently used before recently used; names break the last tie so the
same state always gives the same plan. An unknown load time counts as 0 s: every
resident instance has been loaded, so the orchestrator normally knows it, and guessing a
default would rank services by an invented figure.
"""

from __future__ import annotations

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
    protected: bool = False
    claimed_by: str | None = None

    @property
    def going(self) -> bool:
        """Already on its way out: its memory will come back without a new eviction."""
        return self.state in (InstanceState.DRAINING, InstanceState.STOPPING)


def may_evict(evictor: ServiceRule, victim: Resident, *, ignore_protection: bool = False) -> bool:
    """Whether ``evictor``'s load may evict ``victim`` under the residency table.

    ``ignore_protection`` answers "could it ever", which is what the capacity check of
    step 1 needs: the no-thrash protection is temporary.
    """
    if victim.name == evictor.name:
        return False
    if victim.residency is Residency.PINNED:
        return False
    if victim.residency is Residency.WARM:
        allowed = evictor.priority > victim.priority
    elif victim.residency is Residency.ON_DEMAND:
        allowed = evictor.priority >= victim.priority
    else:  # window-only: batch work, evictable by anything
        allowed = True
    if allowed and victim.protected and not ignore_protection:
        return evictor.priority != victim.priority
    return allowed


# (busy count, priorities high to low, reload cost class, recencies new to old, names)
SetKey = tuple[int, tuple[int, ...], int, tuple[float, ...], tuple[str, ...]]


def reload_cost_class(reload_s: float, freed: int) -> int:
    """Reload seconds per byte freed, in classes a factor of two apart.

    Measured load times jitter by tens of milliseconds; comparing them raw would let
    noise, not recency, pick between two identical services. Only a reload at least
    about twice as cheap per byte wins; within a class, least-recently-used decides.
    """
    if reload_s <= 0 or freed <= 0:
        return -(2**31)
    return math.floor(math.log2(reload_s / freed))


def set_key(victims: Sequence[Resident]) -> SetKey:
    """Order of preference among victim sets of the same size (smaller is better)."""
    freed = sum(v.charge for v in victims)
    reload_s = sum(v.load_s or 0.0 for v in victims)
    return (
        sum(1 for v in victims if v.busy),
        tuple(sorted((v.priority for v in victims), reverse=True)),
        reload_cost_class(reload_s, freed),
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
    best: tuple[Resident, ...] | None = None
    best_key: SetKey | None = None
    for combo in combinations(pool, size):
        if sum(v.charge for v in combo) < deficit:
            continue
        key = set_key(combo)
        if best_key is None or key < best_key:
            best, best_key = combo, key
    return best


def _recency(victim: Resident) -> float:
    return -math.inf if victim.last_used is None else victim.last_used
