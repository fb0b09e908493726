"""The pump: events in, one at a time; each action handed to an ``Effects``.

The daemon's kernel and the bench's simulated vramd run this same loop and differ only
in their ``Effects``: the kernel's start and stop real processes and answer HTTP
requests, the simulator's move a virtual device on a virtual clock. So every decision
the bench measures is one the daemon would take (docs/architecture.md, "The kernel's
shape").

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from service.scheduler.actions import Grant, Note, Reject, Resolve, Start, Stop, StopSleeper
from service.scheduler.core import Scheduler
from service.scheduler.events import (
    Event,
    MemorySampled,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
)
from service.scheduler.traffic import Traffic


class Effects(Protocol):
    """How actions become real. Each call returns at once; slow work reports back
    later with further events through the pump's ``feed``."""

    def start(self, action: Start) -> None:
        """Spawn (or wake, or retry) the service on ``action.device``."""

    def drain(self, action: Stop) -> None:
        """The instance takes no new requests (``Stop(drain=True)``)."""

    def stop(self, action: Stop) -> None:
        """Terminate the instance (or put it to sleep if ``sleepable`` and it can);
        report ``InstanceStopped`` (or ``InstanceAsleep``) once its memory is back."""

    def stop_sleeper(self, action: StopSleeper) -> None:
        """Stop a sleeping runtime for good; report ``InstanceStopped`` after."""

    def grant(self, action: Grant) -> None:
        """Forward the request; report ``RequestFinished`` when it ends."""

    def reject(self, action: Reject) -> None:
        """Answer the request with the error."""

    def note(self, action: Note) -> None:
        """Record the decision."""

    def resolve(self, action: Resolve) -> None:
        """Answer the operator waiting on ``action.ticket``."""


class Pump:
    def __init__(self, scheduler: Scheduler, now: Callable[[], float]) -> None:
        self.scheduler = scheduler
        self._now = now
        self._effects: Effects | None = None
        self._pending: deque[Event] = deque()
        self._feeding = False
        self.traffic = Traffic()

    def connect(self, effects: Effects) -> None:
        """Attach the effects (they usually need ``feed`` themselves, so come second)."""
        self._effects = effects

    def feed(self, event: Event) -> None:
        """Hand one event to the scheduler and carry out its plan."""
        self._pending.append(event)
        if self._feeding:
            return
        effects = self._effects
        assert effects is not None, "connect() the effects before feeding events"
        self._feeding = True
        try:
            while self._pending:
                event, now = self._pending.popleft(), self._now()
                self._record(event, now)
                for action in self.scheduler.handle(event, now):
                    if isinstance(action, Grant):
                        self.traffic.granted(action.request_id, now)
                    elif isinstance(action, Reject):
                        self.traffic.ended(action.request_id, now)
                    _dispatch(effects, action)
        finally:
            self._feeding = False

    def _record(self, event: Event, now: float) -> None:
        match event:
            case RequestArrived():
                self.traffic.arrived(event.request_id, event.service, now)
            case RequestFinished() | RequestCancelled():
                self.traffic.ended(event.request_id, now)
            case MemorySampled():
                self.traffic.device_totals = tuple(d.total for d in event.devices)


def _dispatch(effects: Effects, action: object) -> None:
    match action:
        case Start():
            effects.start(action)
        case Stop(drain=True):
            effects.drain(action)
        case Stop():
            effects.stop(action)
        case StopSleeper():
            effects.stop_sleeper(action)
        case Grant():
            effects.grant(action)
        case Reject():
            effects.reject(action)
        case Note():
            effects.note(action)
        case Resolve():
            effects.resolve(action)
