"""Everything the scheduler hears about: the events that flow in.

The orchestrator turns what happens in the real world (a request, a process becoming
healthy, a probe sample, a policy apply, a timer) into one of these values and hands it to
``Scheduler.handle`` with the time it happened. The bench simulator produces the same
values on a virtual clock. Events are facts, not commands: the scheduler decides what
they mean (docs/architecture.md, "The kernel's shape").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from service.domain import DeviceReading
from service.scheduler.fairness import ANONYMOUS, ClientRule
from service.scheduler.rules import DeviceRule, Learned, ServiceRule
from service.scheduler.yielding import Tuning


@dataclass(frozen=True, slots=True)
class RequestArrived:
    request_id: str
    service: str
    client: str = ANONYMOUS  # whose fair share it counts against (docs/policy.md)


@dataclass(frozen=True, slots=True)
class RequestCancelled:
    """The client went away, whether its request was queued or in flight."""

    request_id: str


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """A granted request ended, whatever its outcome."""

    request_id: str


@dataclass(frozen=True, slots=True)
class InstanceReady:
    service: str


@dataclass(frozen=True, slots=True)
class InstanceAdopted:
    """A runtime a previous daemon started is this daemon's now, ready on ``devices``:
    resident from this moment, with no load (docs/operations.md, "Restarts and
    upgrades")."""

    service: str
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InstanceBackoff:
    """The instance crashed or failed to start and may be retried.

    Its reservation is kept (the retry needs the same bytes) and its queue keeps waiting.
    ``retry_at`` is when the supervisor's backoff ends: the first pass at or after it
    issues the retry's ``Start`` if the service is still wanted (``None``: the retry is
    not the scheduler's to issue). ``crashed``: the instance had been ready (it died;
    never given up on), else its start failed.
    """

    service: str
    error: str
    retry_at: float | None = None
    crashed: bool = False


@dataclass(frozen=True, slots=True)
class InstanceFailed:
    """The supervisor gave up: memory released, queue rejected, failed until a load."""

    service: str
    error: str


@dataclass(frozen=True, slots=True)
class InstanceStopped:
    """A stop we asked for completed and memory settled, or the process died unasked.

    Also sent when a sleeper's process has been stopped for good (``StopSleeper``).
    """

    service: str


@dataclass(frozen=True, slots=True)
class InstanceAsleep:
    """A sleepable stop was carried out as a sleep (vLLM's sleep mode): the weights left
    the device and the process lives on. To admission the service is stopped; its next
    ``Start`` on the same device wakes it instead of loading it."""

    service: str


@dataclass(frozen=True, slots=True)
class MemorySampled:
    """A probe sample: every device, and each resident service's measured bytes."""

    devices: tuple[DeviceReading, ...]
    footprints: Mapping[str, int] = field(default_factory=dict)
    # Service -> device -> bytes, for instances that span devices (the rest need none).
    per_device: Mapping[str, Mapping[int, int]] = field(default_factory=dict)


# How often the orchestrator (and the simulator, on its virtual clock) feeds a Tick.
TICK_S = 0.2


@dataclass(frozen=True, slots=True)
class Tick:
    """Periodic: queue timeouts, idle TTLs and drain deadlines are checked only here."""


@dataclass(frozen=True, slots=True)
class WindowChanged:
    """Which window-only services may run now, and when each may next run (absolute)."""

    allowed: frozenset[str]
    next_open_at: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PolicyChanged:
    """A policy was applied (the first one at startup).

    ``restart`` names services whose process changed (command, env, GPUs...): they are
    restarted at once, drained (docs/policy.md, "Restarts").
    """

    rules: Mapping[str, ServiceRule]
    device: DeviceRule
    restart: frozenset[str] = frozenset()
    clients: Mapping[str, ClientRule] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TuningChanged:
    """``yielding: auto`` stands for ``tuning`` from now on (the tuner chose it)."""

    tuning: Tuning


@dataclass(frozen=True, slots=True)
class LearnedChanged:
    service: str
    learned: Learned


@dataclass(frozen=True, slots=True)
class LoadRequested:
    """An operator asked for a load; also the only way out of ``failed``.

    ``ticket``: the operator waits for an answer (``Resolve``): ready, waiting for
    memory, refused, failed or window closed.
    """

    service: str
    ticket: str | None = None


@dataclass(frozen=True, slots=True)
class UnloadRequested:
    """An operator asked for an unload: drain, then stop, whatever the residency.

    ``ticket`` is resolved ``stopped`` once the process is gone.
    """

    service: str
    ticket: str | None = None


@dataclass(frozen=True, slots=True)
class RestartRequested:
    """Restart a loaded service (a maintenance window, ``on_cap: restart``, an operator).

    Drained at once: no new requests (they queue for the new instance), those in flight
    finish within ``stop_timeout``, then it stops and starts again with its memory kept
    claimed in between. Ignored for a service that is not starting or ready -- unless
    it carries a ``ticket`` (an operator's restart), which then loads it.
    The ticket is resolved when the new instance is ready (or cannot be).
    """

    service: str
    reason: str
    ticket: str | None = None


@dataclass(frozen=True, slots=True)
class ShutdownRequested:
    """The daemon is stopping: refuse what waits, drain everything, start nothing."""


@dataclass(frozen=True, slots=True)
class MakeRoom:
    """A load of ``service`` failed with out-of-memory: evict everything it may evict on
    its device before the supervisor's retry, to tell fragmentation (the retry then
    fits) from a real capacity shortage (it fails again). The retry waits until those
    victims are gone."""

    service: str
    reason: str


Event = (
    RequestArrived
    | RequestCancelled
    | RequestFinished
    | InstanceReady
    | InstanceAdopted
    | InstanceBackoff
    | InstanceFailed
    | InstanceStopped
    | InstanceAsleep
    | MemorySampled
    | Tick
    | WindowChanged
    | PolicyChanged
    | TuningChanged
    | LearnedChanged
    | LoadRequested
    | UnloadRequested
    | RestartRequested
    | MakeRoom
    | ShutdownRequested
)
