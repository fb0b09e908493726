"""How long each step of a swap took, per service: the ``swap`` events."""

from __future__ import annotations

import time
from collections.abc import Callable

from service.domain import EventKind
from service.live.events import EventLog
from service.live.runtimes import ServiceRuntime


def now() -> float:
    return time.perf_counter()


def ms(start: float, end: float) -> float:
    return round((end - start) * 1000, 1)


class SwapSteps:
    """A swap is a stop (drain, save, stop, settle) and a start (spawn, ready, restore, first
    byte). The kernel's effects mark each step's moments as they happen; a stop's steps are
    one ``swap`` event once its memory has settled, a start's once the scheduler has been
    told the instance is ready, and the first byte of the first request the new instance
    answers is a third (``phase: first-byte``): ``{"phase": ..., "steps": {"save_ms": ...}}``.
    Times are ``time.perf_counter`` readings; only differences are reported.
    """

    def __init__(self, events: EventLog) -> None:
        self._events = events
        # Per service: the moments of its current stop or start, by name.
        self._marks: dict[str, dict[str, float]] = {}
        # Per service: when its new instance was declared ready, until its first answer.
        self._ready: dict[str, float] = {}

    def begin(self, name: str, step: str) -> None:
        """A stop or start begins with ``step`` (``drain``, ``start``): earlier marks go."""
        self._marks[name] = {step: now()}

    def mark(self, name: str, step: str) -> None:
        self._marks.setdefault(name, {})[step] = now()

    def take(self, name: str) -> dict[str, float]:
        return self._marks.pop(name, {})

    def started(self, rt: ServiceRuntime, ready: float, restore_ms: float | None) -> None:
        """The start's event: spawn (decision to process), ready (process to health),
        restore; its first answer is awaited from here on."""
        marks = self.take(rt.name)
        steps: dict[str, float] = {}
        if "start" in marks and "spawned" in marks:
            steps["spawn_ms"] = ms(marks["start"], marks["spawned"])
            steps["ready_ms"] = ms(marks["spawned"], ready)
        if restore_ms is not None:
            steps["restore_ms"] = restore_ms
        self.record(rt, "start", steps)

    def awaiting(self, name: str) -> None:
        """The new instance is about to be declared ready: its first answer is awaited
        (set before the scheduler hears it, which may grant a request at once)."""
        self._ready[name] = now()

    def first_answer(self, rt: ServiceRuntime) -> Callable[[], None] | None:
        """For the first request granted to a new instance: called when the runtime's
        answer begins, it records ``first_byte_ms`` from ready."""
        ready = self._ready.pop(rt.name, None)
        if ready is None:
            return None
        return lambda: self.record(rt, "first-byte", {"first_byte_ms": ms(ready, now())})

    def forget(self, name: str) -> None:
        """The instance is gone: nothing of it is awaited any more."""
        self._ready.pop(name, None)

    def record(self, rt: ServiceRuntime, phase: str, steps: dict[str, float]) -> None:
        text = ", ".join(
            f"{key.removesuffix('_ms')} {value:.1f} ms" for key, value in steps.items()
        )
        self._events.record(
            EventKind.SWAP,
            f"{rt.name} {phase}: {text or 'no steps timed'}",
            service=rt.name,
            instance_id=rt.placement.instance_id,
            data={"phase": phase, "steps": steps},
        )
