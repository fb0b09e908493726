"""A real ``Orchestrator`` for integration tests: host probe, SQLite, demo runtimes.

    text = policy_text({"chat": demo_service(memory_mib=60)})
    harness = OrchestratorHarness(tmp_path)
    daemon = await harness.start(text)          # Orchestrator.start() has run
    lease = await daemon.orchestrator.acquire("chat")
    daemon.events(kind="evict")                 # persisted events, oldest first
    await harness.close()                       # close() every orchestrator, then check

The orchestrator is wired by ``service.app.build_orchestrator`` (policy parsed from
text, a fresh SQLite file in the test's temp directory and its store writer,
``create_probe("host")``, the system clock, the real subprocess launcher), minus the
HTTP app. Services run
``python -m service.demo_runtime`` on a free loopback port. ``close`` always stops every
runtime through ``Orchestrator.close`` and then fails if a demo runtime child survived
(after killing it, so one broken test does not leak processes into the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from service.app import build_orchestrator
from service.clock import SystemClock
from service.devices import DeviceProbe, create_probe
from service.kernel.orchestrator import Orchestrator
from service.policy import load_policy
from service.settings import Settings
from service.store import Store, StoreWriter, open_store, queries
from service.supervisor import ProcessLauncher

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_MARKER = "service.demo_runtime"
# What the demo runtime's own interpreter adds to --memory (PSS is ~16MiB), with margin:
# an estimate below the real footprint would be "learned" upwards mid-test.
INTERPRETER_MIB = 30


def demo_service(
    *,
    memory_mib: int,
    estimate_mib: int | None = None,
    residency: str = "on-demand",
    priority: int = 100,
    load_seconds: float = 0.2,
    latency_ms: float = 0,
    **keys: Any,
) -> dict[str, Any]:
    """One policy service running the demo runtime; ``keys`` adds or overrides policy keys.

    The estimate defaults to ``memory_mib + INTERPRETER_MIB`` so it covers what the host
    probe will measure; pass a larger one to make a small process count as a big one.
    """
    estimate = estimate_mib if estimate_mib is not None else memory_mib + INTERPRETER_MIB
    command = [
        "${PYTHON}",
        "-m",
        DEMO_MARKER,
        "--port",
        "${PORT}",
        "--model",
        "${MODEL}",
        "--memory",
        f"{memory_mib}MiB",
        "--load-seconds",
        str(load_seconds),
        "--latency-ms",
        str(latency_ms),
    ]
    service: dict[str, Any] = {
        "kind": "chat",
        "command": command,
        "cwd": str(REPO_ROOT),
        "health": "/health",
        "memory": {"estimate": f"{estimate}MiB"},
        "residency": residency,
        "priority": priority,
        "startup_timeout": "20s",
        "stop_timeout": "10s",
    }
    service.update(keys)
    return service


def policy_text(
    services: Mapping[str, Mapping[str, Any]],
    *,
    budget: str = "400MiB",
    headroom: str = "16MiB",
    sample_interval: float = 0.2,
) -> str:
    """A version 1 policy on the host backend; each service serves a model of its name."""
    doc = {
        "version": 1,
        "device": {
            "backend": "host",
            "budget": budget,
            "headroom": headroom,
            "sample_interval": sample_interval,
        },
        "services": {
            name: {"models": [name], **dict(spec)} for name, spec in sorted(services.items())
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class RunningDaemon:
    orchestrator: Orchestrator
    store: Store
    writer: StoreWriter
    probe: DeviceProbe

    def events(
        self, *, kind: str | None = None, service: str | None = None
    ) -> list[dict[str, Any]]:
        """Persisted events (oldest first) as plain dicts, read back from SQLite once the
        writer has committed what was recorded before the call."""
        assert self.writer.flush(10.0), "the store writer did not commit within 10s"
        with self.store.read() as session:
            rows = queries.list_events(session, kind=kind, service=service, limit=100_000)
            return [
                {
                    "id": row.id,
                    "kind": row.kind,
                    "service": row.service,
                    "message": row.message,
                    "data": dict(row.data or {}),
                }
                for row in rows
            ]

    def view(self, name: str) -> dict[str, Any]:
        by_name = {view.name: view for view in self.orchestrator.services_view()}
        return by_name[name].model_dump()


class OrchestratorHarness:
    """Starts orchestrators for one test and guarantees their teardown."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        settle_timeout: float = 5.0,
        launcher: ProcessLauncher | None = None,
        probe: DeviceProbe | None = None,
        **settings: Any,
    ) -> None:
        self._tmp_path = tmp_path
        self._settle_timeout = settle_timeout
        self._launcher = launcher
        self._probe = probe
        self._settings = settings
        self._running: list[RunningDaemon] = []

    async def start(self, text: str) -> RunningDaemon:
        index = len(self._running)
        config = self._tmp_path / f"vramd-{index}.yaml"
        config.write_text(text, encoding="utf-8")
        policy = load_policy(text)
        store = open_store(self._tmp_path / f"vramd-{index}.db")
        writer = StoreWriter(store)
        writer.start()
        probe = self._probe or create_probe("host")
        orchestrator = build_orchestrator(
            policy=policy,
            store=store,
            writer=writer,
            probe=probe,
            clock=SystemClock(),
            settings=Settings(config=config, settle_timeout=self._settle_timeout, **self._settings),
            launcher=self._launcher,
        )
        daemon = RunningDaemon(orchestrator, store, writer, probe)
        # Registered before start(): a start that fails half-way is still closed.
        self._running.append(daemon)
        await orchestrator.start()
        return daemon

    async def close(self) -> None:
        """Close every orchestrator (stopping its runtimes), then check none survived."""
        errors: list[BaseException] = []
        for daemon in reversed(self._running):
            try:
                await daemon.orchestrator.close()
            except Exception as exc:
                errors.append(exc)
            finally:
                daemon.probe.close()
                daemon.writer.close()
                daemon.store.close()
        self._running.clear()
        survivors = await surviving_demo_children()
        if survivors:
            kill_processes(survivors)
            described = ", ".join(f"pid {p.pid}" for p in survivors)
            raise AssertionError(
                f"demo runtime processes outlived Orchestrator.close(): {described}"
            )
        if errors:
            raise errors[0]


def demo_children() -> list[psutil.Process]:
    """Live (non-zombie) descendants of this process running the demo runtime."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(DEMO_MARKER in part for part in child.cmdline()):
                found.append(child)
    return found


async def surviving_demo_children(grace_s: float = 2.0) -> list[psutil.Process]:
    """Demo runtime children still alive after ``grace_s`` (a process being reaped gets
    that long to vanish from the table)."""
    deadline = time.monotonic() + grace_s
    while True:
        found = await asyncio.to_thread(demo_children)
        if not found or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(0.1)


def kill_processes(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.kill()
    psutil.wait_procs(processes, timeout=5)
