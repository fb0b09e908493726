"""The daemon's own health: is its periodic work on time and its event loop running?

``Health`` answers ``GET /healthz``: the scheduler's ticks and the memory samples must
keep coming (``watchdog.Liveness``), the event loop must not be blocked (the watchdog
thread watches it), and no background loop may have died. The watchdog's stall reports
are recorded here too: one written from the watchdog's thread while the loop is blocked,
one when it runs again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from service.clock import Clock
from service.domain import EventKind
from service.health.watchdog import Liveness, Stall, Watchdog
from service.live.events import EventLog
from service.live.runtimes import RuntimeTable
from service.memory.sampling import LastReading


class Health:
    def __init__(
        self,
        *,
        clock: Clock,
        last: LastReading,
        runtimes: RuntimeTable,
        backend: str,
        tick_s: float,
        sample_interval_s: float,
        grace_s: float,
        stall_after_s: float,
        events: EventLog,
    ) -> None:
        self._clock = clock
        self._last = last
        self._runtimes = runtimes
        self.backend = backend
        self._events = events
        self.last_tick: float | None = None  # monotonic; the orchestrator's ticker sets it
        self.watchdog = Watchdog(
            stall_after_s=stall_after_s, on_stall=self._stall_noticed, on_recover=self._stall_ended
        )
        self.liveness = Liveness(
            {
                "scheduler ticks": (
                    lambda: self._age(self.last_tick),
                    max(grace_s / 3, 5 * tick_s),
                ),
                "memory samples": (
                    lambda: self._age(self._last.at),
                    max(grace_s, 5 * sample_interval_s),
                ),
            }
        )

    def report(self, *, failed: Iterable[asyncio.Task[Any]], closing: bool) -> dict[str, Any]:
        """Liveness for /healthz: periodic work on time, no loop stall, loops alive."""
        reading = self._last.reading
        live = self.liveness.report()
        problems = list(live["problems"])
        for task in failed:
            problems.append(f"{task.get_name()} died: {task.exception()!r}")
        stalled = self.watchdog.stalled_for
        if stalled is not None:
            problems.append(f"event loop blocked for {stalled:.1f}s")
        if closing:
            problems.append("shutting down")
        last = self.watchdog.last_stall
        return {
            "ok": not problems,
            "problems": problems,
            "backend": self.backend,
            "degraded": reading.degraded if reading else None,
            "progress_age_s": live["ages_s"],
            "last_stall": {"blocked_s": round(last.duration, 3), "where": last.where}
            if last
            else None,
            "services": {name: rt.instance.state.value for name, rt in self._runtimes.items()},
        }

    def _age(self, since: float | None) -> float | None:
        return None if since is None else self._clock.monotonic() - since

    def _stall_noticed(self, stall: Stall) -> None:
        """From the watchdog thread: the loop is blocked, so only queue the row (the
        store writer's thread is not blocked by the loop)."""
        message = (
            f"event loop blocked for {stall.duration:.1f}s: no request, load or stop can "
            f"proceed; the loop is at:\n{stall.where}"
        )
        self._events.persist(EventKind.WATCHDOG, message)

    def _stall_ended(self, stall: Stall) -> None:
        self._events.record(
            EventKind.WATCHDOG_RECOVERED,
            f"event loop ran again after being blocked for {stall.duration:.1f}s",
            data={"blocked_s": stall.duration, "where": stall.where},
        )
