"""Maintenance windows' clock: when each opens and closes (APScheduler jobs).

This module only keeps time; ``service.maintenance.windows`` acts on what it says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger

from service.clock import Clock
from service.policy.cron import cron_trigger, next_fire_time

log = logging.getLogger("vramd.maintenance")


@dataclass(frozen=True)
class WindowSpec:
    name: str
    duration_s: float
    restart: str | tuple[str, ...]
    allow: tuple[str, ...]
    timezone: str = "UTC"
    cron: str | None = None
    start_at: float | None = None  # one-off windows (epoch seconds)
    origin: str = "policy"


@dataclass
class OpenWindow:
    spec: WindowSpec
    opened_at: float
    closes_at: float
    trigger: str
    run_id: int | None = None
    actions: list[dict[str, object]] = field(default_factory=list)


OnOpen = Callable[[WindowSpec, str], None]
OnClose = Callable[[OpenWindow], None]


class Maintenance:
    """Owns the APScheduler instance and which windows are open now.

    Windows come from the active policy (cron + duration) and from operators through the API
    (one-off: a start time + duration, stored in SQLite so they survive restarts).
    APScheduler jobs are derived from them at startup and whenever a policy is applied —
    never pickled into the database. A job only *posts* ("window W opened") to
    ``service.maintenance.windows``; what a window does (restart flagged services by
    draining them, let window-only services load, stop those when it closes) is decided
    there, with the scheduler, like every other change. Cron lines are read by
    ``service.policy.cron``, the same code the policy checks them with.
    """

    def __init__(self, *, clock: Clock, on_open: OnOpen, on_close: OnClose) -> None:
        self._clock = clock
        self._on_open = on_open
        self._on_close = on_close
        self._windows: dict[str, WindowSpec] = {}
        self.open: dict[str, OpenWindow] = {}
        self._scheduler: AsyncIOScheduler | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, windows: Iterable[WindowSpec]) -> None:
        """Start APScheduler in the running event loop with jobs for ``windows``.

        A window that is open right now (the daemon started inside it) opens at once
        for what is left of it.
        """
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._scheduler.start()
        self.configure(windows)
        now = self._clock.now()
        for spec in self._windows.values():
            opened = self._opened_at(spec, now)
            if opened is not None and opened <= now < opened + spec.duration_s:
                self.open_window(spec.name, trigger="startup", opened_at=opened)

    @staticmethod
    def _opened_at(spec: WindowSpec, now: float) -> float | None:
        """When the window's current (or latest) opening began, if it could be open now."""
        if spec.start_at is not None:
            return spec.start_at
        if spec.cron is None:
            return None
        return next_fire_time(spec.cron, spec.timezone, since=now - spec.duration_s)

    def shutdown(self) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduler = None

    def configure(self, windows: Iterable[WindowSpec]) -> None:
        """Derive the jobs again from scratch (startup, and every policy apply)."""
        self._windows = {w.name: w for w in windows}
        if self._scheduler is None:
            return
        for job in self._scheduler.get_jobs():
            if job.id.startswith("open:"):
                job.remove()
        now = datetime.fromtimestamp(self._clock.now(), UTC)
        for spec in self._windows.values():
            trigger = self._trigger(spec, now)
            if trigger is not None:
                self._scheduler.add_job(
                    self._fire,
                    trigger,
                    args=[spec.name],
                    id=f"open:{spec.name}",
                    coalesce=True,
                    misfire_grace_time=60,
                    max_instances=1,
                )

    @staticmethod
    def _trigger(spec: WindowSpec, now: datetime) -> CronTrigger | DateTrigger | None:
        if spec.cron is not None:
            return cron_trigger(spec.cron, spec.timezone)
        if spec.start_at is not None:
            start = datetime.fromtimestamp(spec.start_at, UTC)
            if start + timedelta(seconds=spec.duration_s) <= now:
                return None  # a one-off that is over
            return DateTrigger(run_date=max(start, now))
        return None

    # ------------------------------------------------------------------- queries

    @property
    def windows(self) -> dict[str, WindowSpec]:
        return dict(self._windows)

    def next_start(self, name: str) -> float | None:
        """Epoch seconds of the window's next opening, if any."""
        if self._scheduler is None:
            return None
        job = self._scheduler.get_job(f"open:{name}")
        if job is None or job.next_run_time is None:
            return None
        return float(job.next_run_time.timestamp())

    def allowed(self) -> frozenset[str]:
        """Window-only services allowed by a window open now."""
        return frozenset(s for w in self.open.values() for s in w.spec.allow)

    def next_allowed_at(self) -> dict[str, float]:
        """For each service some window allows: the epoch time it may next run."""
        out: dict[str, float] = {}
        for spec in self._windows.values():
            start = self.next_start(spec.name)
            if start is None:
                continue
            for service in spec.allow:
                out[service] = min(out.get(service, start), start)
        return out

    # ------------------------------------------------------------ opening, closing

    async def _fire(self, name: str) -> None:
        self.open_window(name, trigger="schedule")

    def open_window(
        self, name: str, *, trigger: str, opened_at: float | None = None
    ) -> OpenWindow | None:
        """Open ``name`` now until ``opened_at`` (default: now) plus its duration.

        A no-op if it is already open. A one-off window that fires late (the daemon was
        down at its start) still closes when it was meant to.
        """
        spec = self._windows.get(name)
        if spec is None:
            raise KeyError(name)
        if name in self.open:
            return self.open[name]
        now = self._clock.now()
        if opened_at is None and spec.start_at is not None and trigger == "schedule":
            opened_at = spec.start_at
        start = now if opened_at is None else min(opened_at, now)
        window = OpenWindow(spec, opened_at=now, closes_at=start + spec.duration_s, trigger=trigger)
        self.open[name] = window
        if self._scheduler is not None:
            self._scheduler.add_job(
                self._close,
                DateTrigger(run_date=datetime.fromtimestamp(window.closes_at, UTC)),
                args=[name],
                id=f"close:{name}",
                replace_existing=True,
                misfire_grace_time=None,
            )
        log.info("maintenance window %s opened (%s)", name, trigger)
        self._on_open(spec, trigger)
        return window

    async def _close(self, name: str) -> None:
        self.close_window(name)

    def close_window(self, name: str) -> None:
        window = self.open.pop(name, None)
        if window is None:
            return
        if self._scheduler is not None and self._scheduler.get_job(f"close:{name}"):
            self._scheduler.remove_job(f"close:{name}")
        log.info("maintenance window %s closed", name)
        self._on_close(window)
