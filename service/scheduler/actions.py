"""The plan that flows out: what the orchestrator must do, in the order given.

Actions are the scheduler's only output. They say what to do and why, never how: a
``Start`` does not know about ports or argv, a ``Reject`` does not know about HTTP. The
``Note`` explains a decision that has no other visible effect (a wait, the figures behind
an admission) so that ``GET /api/events`` can answer "why did this happen?".

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from service.domain import EventKind
from service.errors import ErrorCode


class Answer(enum.StrEnum):
    """How an operator's load, unload or restart ended (``Resolve.outcome``)."""

    READY = "ready"
    WAITING = "waiting"  # for memory others hold; the load still happens when it can
    REFUSED = "refused"  # it can never fit
    FAILED = "failed"
    WINDOW_CLOSED = ErrorCode.WINDOW_CLOSED.value
    STOPPED = "stopped"
    IGNORED = "ignored"

    @property
    def error(self) -> ErrorCode | None:
        """The error an operator's client gets for this answer, if it is one."""
        return _ANSWER_ERRORS.get(self)


_ANSWER_ERRORS = {
    Answer.FAILED: ErrorCode.RUNTIME_FAILED,
    Answer.REFUSED: ErrorCode.INSUFFICIENT_CAPACITY,
    Answer.WINDOW_CLOSED: ErrorCode.WINDOW_CLOSED,
}


@dataclass(frozen=True, slots=True)
class Start:
    """Spawn the service on ``device`` now; its expected peak is charged from now on.

    ``wake``: the service sleeps on that device (``InstanceAsleep``): wake it rather
    than load it (if waking fails, stop the sleeper and load afresh). ``retry``: a
    restart after backoff of the instance that crashed or failed to start.
    """

    service: str
    device: int
    reason: str
    wake: bool = False
    retry: bool = False
    # Every device of the instance, lowest first: ``(device,)`` unless it spans several.
    spans: tuple[int, ...] = ()

    @property
    def devices(self) -> tuple[int, ...]:
        return self.spans or (self.device,)


@dataclass(frozen=True, slots=True)
class Stop:
    """``drain=True``: take no new requests. ``drain=False``: terminate the process now.

    ``sleepable``: the stop only makes room (an eviction, an idle unload), so a runtime
    with a sleep mode may sleep instead. Restarts, unloads and removals really stop.
    """

    service: str
    reason: str
    drain: bool
    sleepable: bool = False


@dataclass(frozen=True, slots=True)
class StopSleeper:
    """Stop a sleeping runtime's process for good; report ``InstanceStopped`` after.

    Admission already counts a sleeper stopped: this frees what little it kept on the
    device (its context) and the host memory its weights took.
    """

    service: str
    reason: str


@dataclass(frozen=True, slots=True)
class Grant:
    """Forward the request to the service's instance now."""

    request_id: str
    service: str


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer the request with an error; ``retry_after`` in seconds when known."""

    request_id: str
    service: str
    code: ErrorCode
    message: str
    retry_after: float | None = None
    client: str | None = None  # the request's client, when it was known


@dataclass(frozen=True, slots=True)
class Note:
    """A decision explained, for the event log. ``kind`` is one of:

    admit (a load fits: need, available, budget), evict (victims and why), wait (a load
    cannot be placed yet, and why), refuse (a load can never fit: who holds the memory),
    drop-plan (the last waiter of a planned load left), backoff (a crash the supervisor
    retries), exited (an instance stopped unasked), ignored (an event that changed
    nothing, such as a duplicate request id).
    """

    service: str | None
    kind: EventKind
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    # The services an ``evict`` stops (also in ``data``, for the event log).
    victims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Resolve:
    """Answer an operator's load, unload or restart (the event's ``ticket``)."""

    ticket: str
    service: str
    outcome: Answer
    message: str = ""
    retry_after: float | None = None


Action = Start | Stop | StopSleeper | Grant | Reject | Note | Resolve
