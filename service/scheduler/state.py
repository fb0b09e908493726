"""The scheduler's record of one service: its logical instance, queue and waiting load.

This is *decision* state, not process state: the orchestrator owns the real instance (pid,
port, backoff timer) and tells the scheduler what happened through events. The record's
``state`` uses ``InstanceState`` values, with one simplification: a crashed instance the
supervisor will retry stays ``starting`` here (``error`` says why), because for admission
it is exactly that: a load in progress holding its reservation.

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from service.domain import RESIDENT_STATES, InstanceState, Residency
from service.scheduler.admission import ClockText, Wait
from service.scheduler.eviction import SOON_S, Resident
from service.scheduler.fairness import FairQueue
from service.scheduler.habits import Habits
from service.scheduler.rules import Learned, ServiceRule, expected_peak, share_of
from service.scheduler.yielding import DEFAULT_LOAD_S, Asker, Conduct


@dataclass(frozen=True, slots=True)
class Plan:
    """A load waiting for its victims to stop: ``victims`` are claimed for it.

    ``needs``: (device, bytes) for each device the load is planned on, lowest first (one
    pair unless the service spans several devices); ``need`` is their sum.
    """

    needs: tuple[tuple[int, int], ...]
    victims: frozenset[str]
    since: float

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(device for device, _ in self.needs)

    @property
    def device(self) -> int:
        return self.needs[0][0]

    @property
    def need(self) -> int:
        return sum(size for _, size in self.needs)

    def need_on(self, device: int) -> int:
        return next((size for d, size in self.needs if d == device), 0)

    def where(self) -> str:
        devices = self.devices
        if len(devices) == 1:
            return f"device {devices[0]}"
        return "devices " + ", ".join(map(str, devices))


@dataclass(frozen=True, slots=True)
class ServiceView:
    """A service as the scheduler sees it, for ``vramd ps`` and the API."""

    name: str
    state: str
    device: int | None
    in_flight: int
    queued: int
    charge: int
    expected_peak: int
    measured: int
    last_used: float | None
    idle_for: float | None
    waiting_for_memory: bool
    restart_pending: bool
    error: str | None
    # What a waiting load waits for, in words and per holder (docs/operations.md, "How
    # vramd decides", step 4).
    waiting_for: str | None = None
    wait_holders: tuple[dict[str, object], ...] = ()
    # The victims a planned load waits for (already told to stop).
    evicting: tuple[str, ...] = ()
    # How much longer a ready, idle instance keeps its memory against lower priorities.
    protected_for: float | None = None
    # Every device the instance is on (``device`` is the first) and, per device, what it
    # is charged and what was measured there.
    devices: tuple[int, ...] = ()
    charges: dict[int, int] = field(default_factory=dict)
    measured_on: dict[int, int] = field(default_factory=dict)
    # Who waits in its queue, by client (fair queues).
    queued_by_client: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Sleeper:
    """A service's instance asleep on ``on`` since ``since``; ``stopping`` once told to
    stop for good (its process not yet gone)."""

    on: tuple[int, ...]
    since: float
    stopping: bool = False


@dataclass(slots=True)
class ServiceState:
    rule: ServiceRule
    learned: Learned = field(default_factory=Learned)
    state: InstanceState = InstanceState.STOPPED
    # The devices the instance is on (lowest first; one unless it spans several).
    devices: tuple[int, ...] = ()
    queue: FairQueue = field(default_factory=FairQueue)
    in_flight: set[str] = field(default_factory=set)
    measured: int = 0
    # A span instance's measured bytes per device (``measured`` is their sum).
    measured_by_device: dict[int, int] = field(default_factory=dict)
    last_used: float | None = None
    started_at: float | None = None
    # No-thrash: the requests the current instance was loaded for, and those that joined
    # while it worked through them (at most ``batch_room`` more); see ``batch_pending``.
    batch: set[str] = field(default_factory=set)
    batch_room: int = 0
    # What its traffic has shown: idle gaps, request rate, service time.
    habits: Habits = field(default_factory=Habits)
    # How its idle instance yields: its ``yielding`` resolved (``Book.retune``).
    conduct: Conduct = field(default_factory=Conduct)
    # Why the last admission made this load wait (None: it did not), and the load it
    # waits behind when that one is first in line for the same memory.
    wait: Wait | None = None
    behind: str | None = None
    drain_deadline: float | None = None
    stop_reason: str = ""
    stop_sleepable: bool = False
    claimed_by: str | None = None
    plan: Plan | None = None
    # A one-shot reason to load without a request: "preload", "load requested".
    load_intent: str | None = None
    operator_unloaded: bool = False
    # A drained restart is pending, for this reason (None: none is).
    restart: str | None = None
    removed: bool = False
    error: str | None = None
    # The last wait/refuse note, so a decision that does not change is said once.
    last_note: str | None = None
    # A crashed or failed start the supervisor backs off: the retry is due at
    # ``retry_at``; after an out-of-memory load (``MakeRoom``) it also waits for the
    # instances evicted for it to be gone, or it would fail again for the wrong reason.
    retry_at: float | None = None
    retry_after_room: bool = False
    # The backoff follows a crash of a ready instance (not a failed start).
    crashed: bool = False
    # A sleeper (``InstanceAsleep``): stopped to admission, its process alive.
    sleeper: Sleeper | None = None
    # Operators waiting for an answer: ticket -> "load" | "restart" | "unload".
    tickets: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def resident(self) -> bool:
        return self.state in RESIDENT_STATES

    @property
    def device(self) -> int | None:
        """The instance's (first) device; None when it holds none."""
        return self.devices[0] if self.devices else None

    def on(self, device: int) -> bool:
        """Whether the resident instance holds memory on ``device``."""
        return self.resident and device in self.devices

    def measured_at(self, device: int) -> int:
        if len(self.devices) <= 1:
            return self.measured if device in self.devices else 0
        return self.measured_by_device.get(device, 0)

    def charge_on(self, device: int) -> int:
        """What the instance is charged on ``device``: its share of the charge there."""
        if not self.on(device):
            return 0
        if len(self.devices) == 1:
            return self.charge
        index = self.devices.index(device)
        return max(self.measured_at(device), share_of(self.expected_peak, self.rule.shares, index))

    def take_sample(self, total: int, by_device: Mapping[int, int]) -> None:
        self.measured = total
        self.measured_by_device = dict(by_device) if len(self.devices) > 1 else {}

    @property
    def asleep(self) -> bool:
        return self.sleeper is not None

    @property
    def sleeper_stopping(self) -> bool:
        """Its sleeper was told to stop for good and is not gone yet."""
        return self.sleeper is not None and self.sleeper.stopping

    @property
    def going(self) -> bool:
        return self.state in (InstanceState.DRAINING, InstanceState.STOPPING)

    @property
    def expected_peak(self) -> int:
        return expected_peak(self.rule, self.learned)

    @property
    def charge(self) -> int:
        if not self.resident:
            return 0
        if len(self.devices) > 1:
            return sum(self.charge_on(device) for device in self.devices)
        return max(self.measured, self.expected_peak)

    @property
    def idle(self) -> bool:
        return not self.in_flight and not self.queue

    @property
    def batch_pending(self) -> bool:
        """No-thrash: a request of the batch the instance was loaded for is still queued
        or in flight."""
        if not self.batch:
            return False
        return any(r in self.batch for r in self.in_flight) or any(
            w.request_id in self.batch for w in self.queue
        )

    def begin_batch(self) -> None:
        """A load starts for what waits now; up to a queue bound more may join."""
        self.batch = {w.request_id for w in self.queue}
        self.batch_room = self.rule.max_concurrency + self.rule.queue_max

    def join_batch(self, request_id: str) -> None:
        """A request arrived: it joins the batch while the batch is being served."""
        if not self.batch_pending:
            self.batch.clear()
        elif self.batch_room > 0:
            self.batch.add(request_id)
            self.batch_room -= 1

    @property
    def load_s(self) -> float:
        """Expected load time: learned, or a guess until it has loaded once."""
        learned = self.learned.load_s
        return DEFAULT_LOAD_S if learned is None else learned

    def asker(self) -> Asker:
        """This service's load as admission weighs it: what waits and for how long."""
        return Asker(
            rule=self.rule,
            arrivals=tuple(w.arrived_at for w in self.queue),
            load_s=self.load_s,
            service_s=self.habits.expected_service_s,
        )

    def wait_cost(self, now: float) -> float:
        """What keeping this load waiting costs: priority x (requests waiting, each
        counted 1 when it arrives and 2 at its ``queue.timeout``). A load nothing waits
        for (pinned, a preload, an operator's) counts as one fresh request."""
        timeout = max(self.rule.queue_timeout_s, 1e-9)
        weight = sum(1.0 + (now - w.arrived_at) / timeout for w in self.queue) or 1.0
        return self.rule.priority * weight

    @property
    def wants_load(self) -> bool:
        """Whether something asks for an instance: requests, pinning, or a one-shot intent."""
        if self.removed or self.state is InstanceState.FAILED:
            return False
        pinned = self.rule.residency is Residency.PINNED and not self.operator_unloaded
        return bool(self.queue) or pinned or self.load_intent is not None

    def first_seq(self) -> int:
        """Arrival order of the load: intents (startup, operator) come before requests."""
        return self.queue.oldest.seq if self.queue else -1

    @property
    def protection_s(self) -> float:
        """Its ``protect`` in seconds, ``math.inf`` where it never yields to lower
        priorities (its own ``never``, or an ``auto`` tuning's)."""
        return math.inf if self.conduct.never else self.rule.protection_s

    def snapshot(self, now: float, device: int | None = None) -> Resident:
        """The instance as eviction sees it at ``now``; on ``device``: its charge there."""
        protect = self.protection_s
        p_again = p_soon = 1.0
        if self.idle and self.last_used is not None:
            idle_for = max(0.0, now - self.last_used)
            p_again = self.habits.p_asked_within(idle_for, protect - idle_for)
            p_soon = self.habits.p_asked_within(idle_for, SOON_S)
        load_s = self.load_s
        during = 1.0 + self.habits.rate * load_s  # requests that arrive while it reloads
        return Resident(
            name=self.name,
            residency=self.rule.residency,
            priority=self.rule.priority,
            state=self.state,
            charge=self.charge if device is None else self.charge_on(device),
            busy=not self.idle,
            last_used=self.last_used,
            load_s=self.learned.load_s,
            batch_pending=self.batch_pending,
            claimed_by=self.claimed_by,
            protect_s=protect,
            in_flight=len(self.in_flight),
            queued=len(self.queue),
            p_soon=p_soon,
            reload_cost=self.rule.priority * p_again * during,
            service_s=self.habits.expected_service_s,
            yield_weight=self.conduct.weight,
        )

    def waiting_text(self, now: float, clock: ClockText | None = None) -> str | None:
        if self.plan is not None:
            victims = ", ".join(sorted(self.plan.victims))
            return f"{self.name} waits for {victims} to stop on {self.plan.where()}"
        if self.behind is not None:
            return f"{self.name} waits behind {self.behind}, first in line for the same memory"
        return None if self.wait is None else self.wait.message(self.name, now, clock)

    def view(
        self, now: float, *, waiting_for_memory: bool, clock: ClockText | None = None
    ) -> ServiceView:
        idle_for = None
        if self.state is InstanceState.READY and self.idle and self.last_used is not None:
            idle_for = max(0.0, now - self.last_used)
        return ServiceView(
            name=self.name,
            state=self.state.value,
            device=self.device,
            in_flight=len(self.in_flight),
            queued=len(self.queue),
            charge=self.charge,
            expected_peak=self.expected_peak,
            measured=self.measured,
            last_used=self.last_used,
            idle_for=idle_for,
            waiting_for_memory=waiting_for_memory,
            restart_pending=self.restart is not None,
            error=self.error,
            waiting_for=self.waiting_text(now, clock) if waiting_for_memory else None,
            wait_holders=tuple(h.as_dict(now, clock) for h in self.wait.holders)
            if waiting_for_memory and self.wait is not None and self.behind is None
            else (),
            evicting=tuple(sorted(self.plan.victims)) if self.plan is not None else (),
            protected_for=self._protected_for(now),
            devices=self.devices,
            charges={device: self.charge_on(device) for device in self.devices},
            measured_on={device: self.measured_at(device) for device in self.devices},
            queued_by_client=self.queue.by_client(),
        )

    def _protected_for(self, now: float) -> float | None:
        if self.state is not InstanceState.READY or not self.idle or self.last_used is None:
            return None
        protect = self.protection_s
        if math.isinf(protect) or self.rule.residency is Residency.PINNED:
            return None
        return max(0.0, self.last_used + protect - now)
