"""Who may evict whom now, and when a holder yields (docs/policy.md, "Priority,
residency and protect"; docs/architecture.md, "How the scheduler decides").
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from service.domain import Residency, Yielding
from service.scheduler.eviction import Resident, outranks
from service.scheduler.habits import DEFAULT_SERVICE_S
from service.scheduler.rules import ServiceRule

# A holder yields this long, plus this share of the waiting load's load time, before
# the load's first savable request would time out: the holder's stop, the settle
# barrier and a load slower than the last one all fit in it.
YIELD_MARGIN_S = 5.0
YIELD_MARGIN_SHARE = 0.25
# The waiting requests' worth must exceed this many times the holder's expected reload
# cost before it yields early, by ``yielding`` (docs/policy.md, "Yielding").
YIELD_WEIGHT: dict[Yielding, float] = {
    Yielding.EAGER: 0.0,
    Yielding.BALANCED: 1.0,
    Yielding.RELUCTANT: 4.0,
    Yielding.AT_DEADLINE: math.inf,
}
FIXED = tuple(YIELD_WEIGHT)  # the settings ``auto`` chooses among
# A request still counts as able to meet its SLO this long past the moment its holder
# should have started to yield (decisions run on events and ticks, not at exact times).
SAVABLE_GRACE_S = 2.0
# A draining instance's stop and the settle barrier after it, roughly.
STOP_MARGIN_S = 2.0
# Until a service has loaded once, its load is assumed to take this long.
DEFAULT_LOAD_S = 10.0
# An SLO is this many service times, plus the load time once (docs/benchmarks.md).
SLO_FACTOR = 5.0


@dataclass(frozen=True, slots=True)
class Tuning:
    """What ``yielding: auto`` stands for now: one fixed setting, and whether the
    services of the highest unpinned priority behave as ``protect: never``."""

    yielding: Yielding = Yielding.BALANCED  # until the first round: today's behaviour
    top_never: bool = False

    def __post_init__(self) -> None:
        if self.yielding not in YIELD_WEIGHT:
            raise ValueError(f"auto stands for a fixed setting, not {self.yielding.value!r}")

    @property
    def label(self) -> str:
        """``balanced``, or ``balanced+top-never``."""
        return self.yielding.value + ("+top-never" if self.top_never else "")


@dataclass(frozen=True, slots=True)
class Conduct:
    """How one service's idle instance yields: its early-yield weight, and whether it
    never yields to a lower priority (``protect: never``, or chosen by ``auto``)."""

    weight: float = YIELD_WEIGHT[Yielding.BALANCED]
    never: bool = False


def conduct(rule: ServiceRule, tuning: Tuning, top_priority: int | None) -> Conduct:
    """``rule``'s own setting, or the tuning's where it is ``auto``; ``top_priority`` is
    the highest priority among the services that are neither pinned nor window-only."""
    if rule.yielding is not Yielding.AUTO:
        return Conduct(YIELD_WEIGHT[rule.yielding], math.isinf(rule.protection_s))
    never = math.isinf(rule.protection_s) or (
        tuning.top_never
        and rule.priority == top_priority
        and rule.residency in (Residency.WARM, Residency.ON_DEMAND)
    )
    return Conduct(YIELD_WEIGHT[tuning.yielding], never)


def top_priority(rules: Iterable[ServiceRule]) -> int | None:
    """The highest priority among services an ``auto`` tuning may make ``never``."""
    movable = [r.priority for r in rules if r.residency in (Residency.WARM, Residency.ON_DEMAND)]
    return max(movable, default=None)


class Block(enum.StrEnum):
    """Why an instance cannot be evicted for a given load now."""

    SELF = "self"
    PINNED = "pinned"
    NEVER = "never"  # outranks the load and its protect is ``never``
    BUSY = "busy"  # outranks the load and has requests in flight or queued
    PROTECTED = "protected"  # outranks the load, idle, its protection not yielded yet
    BATCH = "batch"  # no-thrash: serving the requests it was loaded for


@dataclass(frozen=True, slots=True)
class Asker:
    """A load that asks for memory, and what waits for it.

    ``arrivals``: when its queued requests arrived, oldest first (empty: nothing waits,
    e.g. a preload or an operator's load: no deadline and nothing to weigh).
    """

    rule: ServiceRule
    arrivals: tuple[float, ...] = ()
    load_s: float = DEFAULT_LOAD_S
    service_s: float = DEFAULT_SERVICE_S

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def priority(self) -> int:
        return self.rule.priority

    def deadline(self, now: float) -> float | None:
        """The latest moment memory must be freed for its first request that can still
        be served before its ``queue.timeout`` (None: none can, or nothing waits).

        A request that would time out during the load whatever happens is not waited
        for: evicting for it would cost a reload and save nothing.
        """
        timeout, load = self.rule.queue_timeout_s, self.load_s
        margin = YIELD_MARGIN_S + YIELD_MARGIN_SHARE * load
        for at in self.arrivals:
            if at + timeout - load >= now:
                return at + timeout - load - margin
        return None

    def slo_by(self, now: float, drain_s: float) -> float | None:
        """The latest moment a holder that drains for ``drain_s`` may begin to, for the
        load's first request that can still meet its SLO (None: none can)."""
        allowance = (SLO_FACTOR - 1) * self.service_s - drain_s - STOP_MARGIN_S
        for at in self.arrivals:
            if at + allowance + SAVABLE_GRACE_S >= now:
                return at + allowance
        return None

    def fresh(self, now: float) -> int:
        """How many of its requests could still meet their SLO if its load began now."""
        since = now - (SLO_FACTOR - 1) * self.service_s
        return sum(1 for at in self.arrivals if at > since)


def holder_yield(asker: Asker, victim: Resident, now: float) -> tuple[Block | None, float | None]:
    """Why ``victim`` holds its memory against ``asker``'s load at ``now`` (None: it
    does not), and the latest moment it yields if nothing changes (None: not known,
    e.g. busy, ``protect: never``, a batch served to an equal with nothing waiting)."""
    if victim.name == asker.name:
        return Block.SELF, None
    if victim.residency is Residency.PINNED:
        return Block.PINNED, None
    if victim.residency is Residency.WINDOW_ONLY:
        return None, None
    if not outranks(victim, asker.rule):
        if not victim.batch_pending:
            return None, None
        if asker.priority <= victim.priority:
            return Block.BATCH, None  # an equal priority's turn comes when it is served
        # A strictly higher priority: the batch's requests in flight finish first (a
        # drain), then it stops, in time for the higher load's first savable request.
        ends = [asker.deadline(now), asker.slo_by(now, victim.service_s)]
        known = [t for t in ends if t is not None]
        return _until(min(known) if known else None, Block.BATCH, now)
    if math.isinf(victim.protect_s):
        return Block.NEVER, None
    if victim.busy:
        return Block.BUSY, None
    times = [t for t in (victim.protected_until(), asker.deadline(now)) if t is not None]
    if asker.priority * asker.fresh(now) > victim.yield_weight * victim.reload_cost:
        times.append(now)  # what waits outweighs the holder's reload
    return _until(min(times) if times else None, Block.PROTECTED, now)


def _until(latest: float | None, block: Block, now: float) -> tuple[Block | None, float | None]:
    return (None if latest is not None and now >= latest else block), latest


def eviction_block(asker: Asker, victim: Resident, now: float) -> Block | None:
    """Why ``asker``'s load may not evict ``victim`` at ``now``; None if it may."""
    return holder_yield(asker, victim, now)[0]


def may_evict(asker: Asker, victim: Resident, now: float) -> bool:
    return eviction_block(asker, victim, now) is None
