"""The faults ``bench.soak`` injects into a running vramd, on a seeded schedule.

Each kind has a period; the first of each falls at a random fraction of its period, so
a short run still sees most kinds, and the rest follow every period. Each fault runs as
its own task, so a hang held for seconds delays no kill. What they are:

- ``kill``: SIGKILL a random runtime that is ready (a crash while idle or serving);
- ``kill-mid-stream``: wait for a chat stream to be flowing, then SIGKILL the runtime it
  comes from (the proxy must end that stream with an error event);
- ``hang``: SIGSTOP a ready runtime for 5-10 s, then SIGCONT (health checks and requests
  time out meanwhile, then it answers again);
- ``apply``: apply the policy again through ``POST /api/policy``, alternating two texts
  that differ only in one service's priority (a change applied in place);
- ``db-lock``: open the daemon's SQLite file and hold ``BEGIN EXCLUSIVE`` for 2-4 s
  (records must wait, requests must not).

Runtimes are found through ``GET /api/services`` (``state``, ``pid``); a pid is signalled
only while its parent is the daemon this benchmark started, so a pid reused by another
process is never touched. Every fault is logged with its time, target and outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

MID_STREAM_WAIT_S = 15.0  # how long a mid-stream kill waits for a stream to be flowing
READY_WAIT_S = 10.0  # how long a kill or a hang waits for a runtime to be ready


@dataclass(frozen=True)
class Schedule:
    """Seconds between two faults of each kind."""

    kill: float = 15.0
    kill_mid_stream: float = 45.0
    hang: float = 90.0
    apply: float = 60.0
    db_lock: float = 120.0

    def periods(self) -> dict[str, float]:
        return {
            "kill": self.kill,
            "kill-mid-stream": self.kill_mid_stream,
            "hang": self.hang,
            "apply": self.apply,
            "db-lock": self.db_lock,
        }


@dataclass
class Faults:
    """Injects faults into the daemon at ``url`` (process ``daemon_pid``, database ``db``).

    ``streams`` is shared with the clients: service name -> streams being read now.
    ``policies`` are the two texts ``apply`` alternates between (the first is active).
    """

    url: str
    daemon_pid: int
    db: Path
    policies: tuple[str, str]
    streams: Counter[str]
    rng: random.Random
    started: float
    injected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    log: list[dict[str, Any]] = field(default_factory=list)
    pids_seen: dict[int, float] = field(default_factory=dict)  # pid -> its create_time
    _applies: int = 0

    async def run(self, schedule: Schedule, stop_at: float) -> None:
        """Inject faults until ``stop_at`` (monotonic); wait for those under way to end."""
        periods = schedule.periods()
        due = {kind: self.started + self.rng.uniform(0.3, 0.6) * p for kind, p in periods.items()}
        actions: dict[str, Callable[[httpx.AsyncClient], Awaitable[None]]] = {
            "kill": self._kill,
            "kill-mid-stream": self._kill_mid_stream,
            "hang": self._hang,
            "apply": self._apply,
            "db-lock": self._db_lock,
        }
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            while time.monotonic() < stop_at:
                now = time.monotonic()
                for kind in sorted(due):
                    if due[kind] <= now:
                        due[kind] += periods[kind]
                        task = asyncio.create_task(self._guarded(kind, actions[kind], http))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                await asyncio.sleep(0.25)
            await asyncio.gather(*tasks)

    async def _guarded(
        self,
        kind: str,
        action: Callable[[httpx.AsyncClient], Awaitable[None]],
        http: httpx.AsyncClient,
    ) -> None:
        """A fault that fails (the admin API did not answer) is logged, never raised."""
        try:
            await action(http)
        except (httpx.HTTPError, OSError, ValueError, sqlite3.Error) as exc:
            self.skipped[f"{kind}: {type(exc).__name__}"] += 1
            self._note(kind, error=f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ the faults

    async def _kill(self, http: httpx.AsyncClient) -> None:
        target = await self._ready_runtime(http)
        if target is None:
            self.skipped["kill: no ready runtime"] += 1
            return
        name, pid = target
        if self._signal(pid, signal.SIGKILL):
            self.injected["kill"] += 1
            self._note("kill", service=name, pid=pid)

    async def _kill_mid_stream(self, http: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + MID_STREAM_WAIT_S
        while time.monotonic() < deadline:
            flowing = sorted(name for name, count in self.streams.items() if count > 0)
            if flowing:
                name = self.rng.choice(flowing)
                pid = await self._pid_of(http, name)
                in_flight = self.streams[name]
                if pid is not None and in_flight > 0 and self._signal(pid, signal.SIGKILL):
                    self.injected["kill-mid-stream"] += 1
                    self._note("kill-mid-stream", service=name, pid=pid, streams=in_flight)
                    return
            await asyncio.sleep(0.05)
        self.skipped["kill-mid-stream: no stream in flight"] += 1

    async def _hang(self, http: httpx.AsyncClient) -> None:
        target = await self._ready_runtime(http)
        if target is None:
            self.skipped["hang: no ready runtime"] += 1
            return
        name, pid = target
        seconds = self.rng.uniform(5.0, 10.0)
        if not self._signal(pid, signal.SIGSTOP):
            return
        self.injected["hang"] += 1
        note = self._note("hang", service=name, pid=pid, seconds=round(seconds, 1))
        try:
            await asyncio.sleep(seconds)
        finally:
            # False: the process was gone by then (the daemon stopped it, or a kill did).
            note["resumed"] = self._signal(pid, signal.SIGCONT)

    async def _apply(self, http: httpx.AsyncClient) -> None:
        self._applies += 1
        text = self.policies[self._applies % 2]
        response = await http.post("/api/policy", content=text.encode())
        self.injected["apply"] += 1
        answer = response.json() if response.status_code == 200 else response.text[:300]
        version = answer.get("version") if isinstance(answer, dict) else None
        self._note("apply", status=response.status_code, version=version)
        if response.status_code != 200:
            self.skipped[f"apply: answered {response.status_code}"] += 1

    async def _db_lock(self, http: httpx.AsyncClient) -> None:
        seconds = self.rng.uniform(2.0, 4.0)
        waited = await asyncio.to_thread(hold_exclusive, self.db, seconds)
        self.injected["db-lock"] += 1
        self._note("db-lock", seconds=round(seconds, 1), waited_for_lock_s=round(waited, 2))

    # ------------------------------------------------------------------ helpers

    async def _ready_runtime(self, http: httpx.AsyncClient) -> tuple[str, int] | None:
        """A random ready runtime, waiting up to ``READY_WAIT_S`` while none is."""
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            services = await self.services(http)
            ready = [(s["name"], s["pid"]) for s in services if s["state"] == "ready" and s["pid"]]
            if ready:
                return self.rng.choice(sorted(ready))
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.5)

    async def _pid_of(self, http: httpx.AsyncClient, name: str) -> int | None:
        for svc in await self.services(http):
            if svc["name"] == name and svc["state"] in ("ready", "draining") and svc["pid"]:
                pid: int = svc["pid"]
                return pid
        return None

    async def services(self, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        """``GET /api/services``; every pid it names joins ``pids_seen``."""
        response = await http.get("/api/services")
        response.raise_for_status()
        services: list[dict[str, Any]] = response.json()
        for svc in services:
            if svc.get("pid"):
                self.remember(svc["pid"])
        return services

    def remember(self, pid: int) -> None:
        if pid not in self.pids_seen:
            with contextlib.suppress(psutil.Error):
                self.pids_seen[pid] = psutil.Process(pid).create_time()

    def _signal(self, pid: int, sig: signal.Signals) -> bool:
        """Send ``sig`` to ``pid`` if it is still a child of the daemon; whether it was."""
        try:
            if psutil.Process(pid).ppid() != self.daemon_pid:
                self.skipped[f"{sig.name}: pid {pid} no longer the daemon's child"] += 1
                return False
            os.kill(pid, sig)
        except (psutil.NoSuchProcess, ProcessLookupError):
            self.skipped[f"{sig.name}: pid gone"] += 1
            return False
        return True

    def _note(self, kind: str, **details: Any) -> dict[str, Any]:
        at = time.monotonic() - self.started
        note = {"t": round(at, 2), "clock": clock(), "kind": kind, **details}
        self.log.append(note)
        return note


def hold_exclusive(db: Path, seconds: float) -> float:
    """Hold SQLite's exclusive lock on ``db`` for ``seconds``; the seconds spent getting it."""
    asked = time.monotonic()
    con = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        con.execute("BEGIN EXCLUSIVE")
        got = time.monotonic()
        time.sleep(seconds)
        con.execute("COMMIT")
    finally:
        con.close()
    return got - asked


def clock() -> str:
    """Wall-clock time as the daemon's log writes it (to find a moment in ``vramd.log``)."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
