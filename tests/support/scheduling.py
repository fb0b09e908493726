"""The scheduler's tests' one kit: a service's ``rule`` and the ``World`` it runs in."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from service.domain import DeviceReading, Residency
from service.scheduler import (
    Action,
    DeviceRule,
    Event,
    Grant,
    InstanceReady,
    InstanceStopped,
    Learned,
    MemorySampled,
    Note,
    Pump,
    Reject,
    RequestArrived,
    RequestFinished,
    Resolve,
    Scheduler,
    ServiceRule,
    Start,
    Stop,
    StopSleeper,
    Tick,
)

MiB = 1024 * 1024


def rule(
    name: str = "svc",
    residency: Residency = Residency.ON_DEMAND,
    *,
    mib: float = 600,
    **fields: Any,
) -> ServiceRule:
    """A rule as the policy's defaults make it: ``mib`` MiB on demand, priority 100, four
    slots and eight queued, a minute's queue timeout, never idled out; any other
    ``ServiceRule`` field by keyword (``estimate`` in bytes wins over ``mib``)."""
    base = ServiceRule(
        name=name,
        residency=residency,
        priority=100,
        estimate=int(mib * MiB),
        cap=None,
        max_concurrency=4,
        queue_max=8,
        queue_timeout_s=60.0,
        idle_ttl_s=0.0,
        stop_timeout_s=15.0,
    )
    return replace(base, **fields)


RESIDENT = ("starting", "ready", "draining", "stopping")


@dataclass
class Recorder:
    """An ``Effects`` that keeps every action it is handed, in order."""

    actions: list[Action] = field(default_factory=list)

    def start(self, action: Start) -> None:
        self.actions.append(action)

    def drain(self, action: Stop) -> None:
        self.actions.append(action)

    def stop(self, action: Stop) -> None:
        self.actions.append(action)

    def stop_sleeper(self, action: StopSleeper) -> None:
        self.actions.append(action)

    def grant(self, action: Grant) -> None:
        self.actions.append(action)

    def reject(self, action: Reject) -> None:
        self.actions.append(action)

    def note(self, action: Note) -> None:
        self.actions.append(action)

    def resolve(self, action: Resolve) -> None:
        self.actions.append(action)

    def take(self) -> list[Action]:
        taken, self.actions = self.actions, []
        return taken


class World:
    """The pure scheduler on a fake clock, fed through the same ``Pump`` the daemon and
    the bench feed it through; the devices it places on, and memory samples consistent
    with what it placed where: the one world the scheduler's tests build.

    A resident instance measures its expected peak once ready (0 while starting), unless
    ``footprints`` (its total) or ``measured`` (per device) say otherwise; ``foreign`` is
    what others hold on a device. ``step``: seconds the clock moves per event sent
    without a time.
    """

    def __init__(
        self,
        *rules: ServiceRule,
        devices: dict[int, int] | None = None,
        device_rule: DeviceRule | None = None,
        learned: dict[str, Learned] | None = None,
        foreign: dict[int, int] | None = None,
        sample: bool = True,
        step: float = 0.0,
        clock_text: Callable[[float], str] | None = None,
    ) -> None:
        self.rules = {r.name: r for r in rules}
        self.device_rule = device_rule or DeviceRule()
        self.sched = Scheduler(self.rules, self.device_rule, learned=learned, clock_text=clock_text)
        self.effects = Recorder()
        self.pump = Pump(self.sched, lambda: self.now)
        self.pump.connect(self.effects)
        self.totals = devices or {0: 1000 * MiB}
        self.foreign = dict(foreign or {})
        self.footprints: dict[str, int] = {}
        self.measured: dict[str, dict[int, int]] = {}
        self.step = step
        self.now = 0.0
        if sample:
            self.sample()

    def send(self, event: Event, at: float | None = None) -> list[Action]:
        self.now = self.now + self.step if at is None else at
        self.pump.feed(event)
        return self.effects.take()

    def sample(self, at: float | None = None, *, free_gap: int = 0) -> list[Action]:
        """A sample of every device; ``free_gap`` hides some free memory (as drivers do
        with reserved memory)."""
        per_device: dict[str, dict[int, int]] = {}
        for name in self.sched.service_names():
            view = self.sched.service_view(name)
            if view.state not in RESIDENT or not view.devices:
                continue
            if name in self.measured:
                per_device[name] = self.measured[name]
            elif len(view.devices) > 1:
                per_device[name] = {} if view.state == "starting" else dict(view.charges)
            else:
                default = 0 if view.state == "starting" else view.expected_peak
                per_device[name] = {view.devices[0]: self.footprints.get(name, default)}
        readings = []
        for d, total in sorted(self.totals.items()):
            managed = sum(on.get(d, 0) for on in per_device.values())
            used = managed + self.foreign.get(d, 0)
            readings.append(DeviceReading(d, total, used, total - used - free_gap, managed))
        footprints = {name: sum(on.values()) for name, on in per_device.items()}
        spread = {name: on for name, on in per_device.items() if len(on) > 1}
        return self.send(MemorySampled(tuple(readings), footprints, spread), at)

    def request(self, rid: str, service: str, at: float | None = None) -> list[Action]:
        return self.send(RequestArrived(rid, service), at)

    def ready(self, service: str, at: float | None = None) -> list[Action]:
        return self.send(InstanceReady(service), at)

    def stopped(self, service: str, at: float | None = None) -> list[Action]:
        return self.send(InstanceStopped(service), at)

    def finish(self, rid: str, at: float | None = None) -> list[Action]:
        return self.send(RequestFinished(rid), at)

    def tick(self, at: float) -> list[Action]:
        return self.send(Tick(), at)

    def serve(self, service: str, rid: str | None = None) -> None:
        """Load ``service`` through a request that then finishes: ready and idle."""
        rid = rid or f"warmup-{service}"
        assert starts(self.request(rid, service)) == [service]
        assert grants(self.ready(service)) == [rid]
        self.finish(rid)
        self.sample()

    def state(self, service: str) -> str:
        return self.sched.service_view(service).state


def starts(actions: Iterable[Action]) -> list[str]:
    return [a.service for a in actions if isinstance(a, Start)]


def grants(actions: Iterable[Action]) -> list[str]:
    return [a.request_id for a in actions if isinstance(a, Grant)]
