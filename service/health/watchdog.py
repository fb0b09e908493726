"""The daemon watching itself: is the event loop, and the work on it, still moving?"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vramd.watchdog")

BEAT_S = 0.25


@dataclass
class Stall:
    started: float  # monotonic
    duration: float
    where: str  # the loop thread's innermost frames when it was noticed


class Watchdog:
    """A heartbeat task on the loop and a thread that notices when it stops.

    Ollama's scheduler once deadlocked in its eviction path and nobody noticed for hours.
    vramd checks its own liveness two ways:

    - A **thread** outside the event loop expects a heartbeat from the loop every
      ``BEAT_S``. If none comes for ``stall_after_s`` the loop is blocked (a decision stuck
      in a loop, a blocking call where none belongs): the thread logs where the loop's
      thread is stuck (its Python stack) and records a ``watchdog`` event itself, on the
      store writer's queue — nothing on the loop can, since the loop is what is stuck, and
      the writer's thread does not need the loop. When beats resume, the stall is reported
      from the loop as ``watchdog-recovered``.
    - ``Liveness`` checks, from the loop, that the periodic work still happens: the
      scheduler's ticks and the memory samples (a probe stuck in the driver shows here).
      ``/healthz`` fails while any of them is late, so systemd, Docker and load balancers
      see it.
    """

    def __init__(
        self,
        *,
        stall_after_s: float,
        on_stall: Callable[[Stall], None],
        on_recover: Callable[[Stall], None],
    ) -> None:
        self.stall_after_s = stall_after_s
        self._on_stall = on_stall  # called from the watchdog thread
        self._on_recover = on_recover  # called on the loop
        self._last_beat = time.monotonic()
        self._loop_thread_id: int | None = None
        self._stall: Stall | None = None
        self.last_stall: Stall | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beater: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_thread_id = threading.get_ident()
        self._last_beat = time.monotonic()
        self._beater = asyncio.get_running_loop().create_task(self._beat(), name="heartbeat")
        self._thread = threading.Thread(target=self._watch, name="vramd-watchdog", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._beater is not None:
            self._beater.cancel()
            await asyncio.gather(self._beater, return_exceptions=True)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)

    @property
    def stalled_for(self) -> float | None:
        """Seconds the loop has been blocked, while it is (seen from the loop: rarely)."""
        stall = self._stall
        return time.monotonic() - stall.started if stall else None

    async def _beat(self) -> None:
        while True:
            self._last_beat = time.monotonic()
            stall, self._stall = self._stall, None
            if stall is not None:
                stall.duration = time.monotonic() - stall.started
                self.last_stall = stall
                self._on_recover(stall)
            await asyncio.sleep(BEAT_S)

    def _watch(self) -> None:
        while not self._stop.wait(BEAT_S):
            silent = time.monotonic() - self._last_beat
            if silent < self.stall_after_s or self._stall is not None:
                continue
            stall = Stall(started=self._last_beat, duration=silent, where=self._where())
            self._stall = stall
            log.error(
                "event loop blocked for %.1fs; the loop thread is at:\n%s", silent, stall.where
            )
            try:
                self._on_stall(stall)
            except Exception:
                log.exception("recording the stall failed")

    def _where(self) -> str:
        frame = sys._current_frames().get(self._loop_thread_id or 0)
        if frame is None:
            return "(loop thread not found)"
        return "".join(traceback.format_stack(frame)[-6:])


@dataclass
class Liveness:
    """How late each piece of periodic work is; ``/healthz`` fails when one is too late."""

    checks: dict[str, tuple[Callable[[], float | None], float]]

    def report(self) -> dict[str, Any]:
        problems = []
        ages: dict[str, float | None] = {}
        for name, (age_of, limit) in self.checks.items():
            age = age_of()
            ages[name] = None if age is None else round(age, 3)
            if age is not None and age > limit:
                problems.append(f"{name} made no progress for {age:.1f}s (limit {limit:g}s)")
        return {"ok": not problems, "problems": problems, "ages_s": ages}
