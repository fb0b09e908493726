"""Maintenance windows as the daemon lives them: what opening one does, and the API.

``schedule.Maintenance`` knows *when* windows open and close (APScheduler jobs); this
module decides what that means for the services, through scheduler events like every
other change: restarting the window's targets (``RestartRequested``: drain first),
allowing its window-only services (``WindowChanged``), recording each run in SQLite,
and the operator's one-off windows (``POST``/``DELETE /api/maintenance``).
"""

from __future__ import annotations

from collections.abc import Callable

from service.clock import Clock
from service.contract import Window, WindowList
from service.domain import INSTANCE_FLAGS, EventKind
from service.errors import InvalidRequest, ServiceNotFound
from service.live.events import EventLog
from service.live.runtimes import RuntimeTable
from service.maintenance.schedule import Maintenance, OpenWindow, WindowSpec
from service.policy import Policy
from service.scheduler import Event, RestartRequested, WindowChanged
from service.store import Store, StoreWriter, queries


class Windows:
    """Its ports are narrow (docs/architecture.md): ``feed``, the runtime table (which services
    run, and their flags), the store, the event log and the clock; the active policy is
    handed over by ``reconfigure`` after every apply.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        feed: Callable[[Event], None],
        runtimes: RuntimeTable,
        store: Store,
        writer: StoreWriter,
        events: EventLog,
        clock: Clock,
    ) -> None:
        self._policy = policy
        self._feed = feed
        self._runtimes = runtimes
        self._store = store
        self._writer = writer
        self._events = events
        self._clock = clock
        self.maintenance = Maintenance(clock=clock, on_open=self._opened, on_close=self._closed)

    def start(self) -> None:
        self.maintenance.start(self.specs())
        self.changed()

    def shutdown(self) -> None:
        self.maintenance.shutdown()

    def reconfigure(self, policy: Policy | None = None) -> None:
        """Derive the jobs again (a policy was applied, an API window added or removed)."""
        if policy is not None:
            self._policy = policy
        self.maintenance.configure(self.specs())
        self.changed()

    def specs(self) -> list[WindowSpec]:
        """The policy's windows and the one-off windows operators created (SQLite)."""
        specs = [
            WindowSpec(
                name=w.name,
                cron=w.cron,
                duration_s=w.duration,
                timezone=w.timezone,
                restart=w.restart if isinstance(w.restart, str) else tuple(w.restart),
                allow=tuple(w.allow),
            )
            for w in self._policy.maintenance.windows
        ]
        with self._store.read() as session:
            for row in queries.list_windows(session):
                if row.origin == "api" and row.start_at is not None:
                    specs.append(
                        WindowSpec(
                            name=row.name,
                            start_at=row.start_at,
                            duration_s=row.duration_s,
                            timezone=row.timezone,
                            restart=row.restart
                            if isinstance(row.restart, str)
                            else tuple(row.restart),
                            allow=tuple(row.allow),
                            origin="api",
                        )
                    )
        return specs

    def changed(self) -> None:
        mono, wall = self._clock.monotonic(), self._clock.now()
        next_open = {
            name: mono + max(0.0, at - wall)
            for name, at in self.maintenance.next_allowed_at().items()
        }
        self._feed(WindowChanged(self.maintenance.allowed(), next_open))

    def _restart_targets(self, restart: str | tuple[str, ...]) -> list[str]:
        resident = [n for n, rt in self._runtimes.items() if rt.instance.pid is not None]
        if restart == "all":
            return resident
        if restart == "flagged":
            return [n for n in resident if self._runtimes[n].health.flags & INSTANCE_FLAGS]
        if isinstance(restart, tuple):
            return [n for n in restart if n in resident]
        return []

    def _opened(self, spec: WindowSpec, trigger: str) -> None:
        window = self.maintenance.open[spec.name]
        window.run_id = self._writer.put_row(
            "maintenance_runs",
            lambda session, run_id: queries.record_maintenance_run(
                session, id=run_id, window=spec.name, trigger=trigger, started_at=window.opened_at
            ),
        )
        targets = self._restart_targets(spec.restart)
        for name in targets:
            reason = f"maintenance window {spec.name}"
            flags = self._runtimes[name].health.flags
            if flags:
                reason += f" (flagged {', '.join(sorted(flags))})"
            window.actions.append({"service": name, "action": "restart", "reason": reason})
            self._feed(RestartRequested(name, reason))
        self._events.record(
            EventKind.WINDOW_OPEN,
            f"maintenance window {spec.name} open ({trigger}) for "
            f"{spec.duration_s:g}s; restarting {', '.join(targets) or 'nothing'}"
            + (f"; allowing {', '.join(spec.allow)}" if spec.allow else ""),
            data={"window": spec.name, "restart": targets, "allow": list(spec.allow)},
        )
        self.changed()

    def _closed(self, window: OpenWindow) -> None:
        if (run_id := window.run_id) is not None:
            ended_at, actions = self._clock.now(), list(window.actions)
            self._writer.put(
                lambda session: queries.finish_maintenance_run(
                    session, run_id=run_id, ended_at=ended_at, actions=actions
                )
            )
        self._events.record(
            EventKind.WINDOW_CLOSE,
            f"maintenance window {window.spec.name} closed",
            data={"window": window.spec.name},
        )
        self.changed()

    def run(self, name: str) -> Window:
        """Open a window now for its duration (``POST /api/maintenance/{name}/run``)."""
        if name not in self.maintenance.windows:
            raise ServiceNotFound(f"no maintenance window named {name!r}")
        self.maintenance.open_window(name, trigger="manual")
        return self.window(name)

    async def add(
        self,
        *,
        name: str,
        start_at: float,
        duration_s: float,
        restart: str | list[str],
        allow: list[str],
    ) -> Window:
        """A one-off window an operator scheduled; stored, so it survives restarts."""
        problems = [
            f"no service named {svc!r}"
            for svc in (restart if isinstance(restart, list) else []) + allow
            if svc not in self._policy.services
        ]
        problems += [
            f"{svc!r} is not a window-only service"
            for svc in allow
            if svc in self._policy.services
            and self._policy.services[svc].residency.value != "window-only"
        ]
        if problems:
            raise InvalidRequest("; ".join(problems))
        created_at = self._clock.now()
        try:
            await self._writer.call(
                lambda session: queries.add_api_window(
                    session,
                    name=name,
                    start_at=start_at,
                    duration_s=duration_s,
                    restart=restart,
                    allow=allow,
                    created_at=created_at,
                )
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        self.maintenance.configure(self.specs())
        self.changed()
        self._events.record(
            EventKind.WINDOW_ADDED,
            f"one-off maintenance window {name} at {start_at:.0f} for {duration_s:g}s "
            f"(restart {restart})",
            data={"window": name},
        )
        return self.window(name)

    async def delete(self, name: str) -> None:
        deleted = await self._writer.call(
            lambda session: queries.delete_api_window(session, name=name)
        )
        if not deleted:
            raise ServiceNotFound(f"no maintenance window named {name!r} created through the API")
        self.maintenance.close_window(name)
        self.maintenance.configure(self.specs())
        self.changed()
        self._events.record(EventKind.WINDOW_DELETED, f"maintenance window {name} deleted")

    def view(self) -> WindowList:
        return WindowList(
            windows=[self._window(spec) for spec in self.maintenance.windows.values()]
        )

    def window(self, name: str) -> Window:
        return self._window(self.maintenance.windows[name])

    def _window(self, spec: WindowSpec) -> Window:
        window = self.maintenance.open.get(spec.name)
        return Window(
            name=spec.name,
            origin=spec.origin,
            cron=spec.cron,
            start_at=spec.start_at,
            duration_s=spec.duration_s,
            timezone=spec.timezone,
            restart=spec.restart if isinstance(spec.restart, str) else list(spec.restart),
            allow=list(spec.allow),
            next_start=self.maintenance.next_start(spec.name),
            open=window is not None,
            closes_at=window.closes_at if window else None,
        )
