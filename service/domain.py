"""Pure values shared by every layer: kinds, residencies, instance states, device figures.

Nothing here does I/O. ``InstanceState`` and ``TRANSITIONS`` are the single statement of
which lifecycle moves are legal; ``check_transition`` is what every setter calls.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from service.errors import IllegalTransition


class ServiceKind(enum.StrEnum):
    CHAT = "chat"
    EMBEDDING = "embedding"
    DIFFUSION = "diffusion"
    SPEECH = "speech"
    RERANK = "rerank"


class Residency(enum.StrEnum):
    PINNED = "pinned"
    WARM = "warm"
    ON_DEMAND = "on-demand"
    WINDOW_ONLY = "window-only"


class Yielding(enum.StrEnum):
    """How readily an idle protected holder yields early to lower priorities
    (docs/policy.md, "Yielding"); ``auto`` lets the daemon choose among the others."""

    EAGER = "eager"
    BALANCED = "balanced"
    RELUCTANT = "reluctant"
    AT_DEADLINE = "at-deadline"
    AUTO = "auto"


class OnCap(enum.StrEnum):
    RESTART = "restart"
    STOP = "stop"
    WARN = "warn"


class Flag(enum.StrEnum):
    CREEPING = "creeping"
    FRAGMENTED = "fragmented"
    OVER_CAP = "over-cap"
    CRASH_LOOPING = "crash-looping"
    # A restore of saved state did nothing; saving is off until the command changes.
    STATE_INEFFECTIVE = "state-ineffective"


# Flags that describe one instance (a fresh instance starts without them) and that a
# maintenance restart cures; crash-looping belongs to the service until a load.
INSTANCE_FLAGS = frozenset({Flag.CREEPING, Flag.FRAGMENTED, Flag.OVER_CAP})


class InstanceState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    FAILED = "failed"
    # A runtime with a sleep mode (vLLM) put to sleep instead of stopped: the process
    # lives, its weights sit in host memory, and waking it is far cheaper than a load.
    SLEEPING = "sleeping"


S = InstanceState


class EventKind(enum.StrEnum):
    """The kind of every event the daemon records (docs/api.md, ``GET /api/events``)."""

    # The scheduler's decisions (its Note actions) and refusals.
    ADMIT = "admit"
    EVICT = "evict"
    WAIT = "wait"
    REFUSE = "refuse"
    REJECT = "reject"
    BACKOFF = "backoff"
    NO_RETRY = "no-retry"
    EXITED = "exited"
    DROP_PLAN = "drop-plan"
    MAKE_ROOM = "make-room"
    IGNORED = "ignored"
    TUNING = "tuning"
    # Instances and their memory.
    STATE = "state"
    LOAD = "load"
    SWAP = "swap"
    ADOPTED = "adopted"
    NOT_ADOPTED = "not-adopted"
    FLAG = "flag"
    FLAG_CLEARED = "flag-cleared"
    CAP_STOP = "cap-stop"
    OOM = "oom"
    VERDICT = "verdict"
    SETTLE_TIMEOUT = "settle-timeout"
    SLEEP = "sleep"
    SLEEP_SKIPPED = "sleep-skipped"
    SLEEP_FAILED = "sleep-failed"
    WAKE = "wake"
    WAKE_FAILED = "wake-failed"
    STATE_SAVE = "state-save"
    STATE_RESTORE = "state-restore"
    STATE_VERIFIED = "state-verified"
    STATE_DROPPED = "state-dropped"
    STATE_INEFFECTIVE = "state-ineffective"
    # Operators, policy, windows and the daemon itself.
    OPERATOR = "operator"
    POLICY = "policy"
    POLICY_ERROR = "policy-error"
    WINDOW_OPEN = "window-open"
    WINDOW_CLOSE = "window-close"
    WINDOW_ADDED = "window-added"
    WINDOW_DELETED = "window-deleted"
    DAEMON = "daemon"
    WATCHDOG = "watchdog"
    WATCHDOG_RECOVERED = "watchdog-recovered"


# Every legal move of an instance's lifecycle. A crash while starting or ready goes to
# BACKOFF (a restart is scheduled) or FAILED (retries exhausted); BACKOFF either starts
# again or is cancelled by an unload. FAILED leaves only when an operator or a request
# asks for a load. SLEEPING (sleep mode) wakes to READY, or is stopped like any other.
TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    S.STOPPED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.READY, S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED}),
    S.READY: frozenset({S.DRAINING, S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED, S.SLEEPING}),
    S.DRAINING: frozenset({S.STOPPING, S.BACKOFF, S.FAILED, S.STOPPED, S.SLEEPING}),
    S.SLEEPING: frozenset({S.READY, S.STOPPING, S.STOPPED, S.FAILED}),
    S.STOPPING: frozenset({S.STOPPED, S.FAILED}),
    S.BACKOFF: frozenset({S.STARTING, S.STOPPED, S.FAILED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPED}),
}

# States in which an instance holds (or is about to hold) device memory and is charged
# against the budget.
RESIDENT_STATES = frozenset({S.STARTING, S.READY, S.DRAINING, S.STOPPING})


def check_transition(current: InstanceState, new: InstanceState) -> None:
    """Raise ``IllegalTransition`` unless ``current -> new`` is in ``TRANSITIONS``."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"illegal instance transition {current} -> {new}")


@dataclass(frozen=True, slots=True)
class InstanceMemory:
    """What a probe measured for one managed instance."""

    device_bytes: int
    host_bytes: int
    pids: tuple[int, ...] = ()
    # Device index -> bytes the instance holds there (``device_bytes`` is their sum). One
    # entry for an instance on one device; one per device for a ``span: N`` instance.
    per_device: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One device's memory at one moment: what the scheduler's ledger needs.

    ``used`` includes every process; ``managed`` is the part attributed to our instances;
    ``foreign = used - managed`` (never negative).
    """

    index: int
    total: int
    used: int
    free: int
    managed: int = 0

    @property
    def foreign(self) -> int:
        """Memory used by processes vramd did not start (never negative)."""
        return max(0, self.used - self.managed)


@dataclass(frozen=True, slots=True)
class DeviceSnapshot(DeviceReading):
    """A device reading as a probe took it, with the device's name for people.

    ``visible_total`` is the total a runtime on the device sees (CUDA's
    ``cudaMemGetInfo``, which vLLM multiplies ``--gpu-memory-utilization`` by): on NVML it
    includes the driver's reserve that ``total`` leaves out. None: the same as ``total``.
    """

    name: str = ""
    visible_total: int | None = None

    @property
    def runtime_total(self) -> int:
        return self.total if self.visible_total is None else self.visible_total


@dataclass(frozen=True, slots=True)
class ProbeReading:
    """A whole probe sample: every device, and every instance's footprint by key."""

    backend: str
    devices: tuple[DeviceSnapshot, ...]
    instances: dict[str, InstanceMemory] = field(default_factory=dict)
    degraded: str | None = None
