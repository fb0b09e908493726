"""The application factory: the only place that wires concrete classes together.

``create_app(settings, probe=..., clock=..., launcher=...)`` returns a FastAPI app whose
lifespan loads the policy, opens (and migrates) the database, records the policy as a
version, creates the device probe and the orchestrator, and on shutdown stops every
runtime before closing the database. Tests pass fakes for the injectable parts.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import __version__
from service.api import admin, openai, ui
from service.api.auth import AuthConfig, install_auth
from service.api.deps import Daemon
from service.api.errors import install_error_handlers
from service.clock import Clock, SystemClock
from service.devices import DeviceProbe, create_probe
from service.errors import VramdError
from service.orchestrator import Orchestrator
from service.policy import Policy, load_policy
from service.policy_records import persist_policy
from service.proxy import ProxyConfig
from service.settings import Settings, server_address
from service.store import open_store
from service.store.lock import DatabaseLock
from service.supervisor import ProcessLauncher

log = logging.getLogger("vramd")


def _use_server_settings(app: FastAPI, policy: Policy) -> None:
    """Keys and body limits from the active policy (again after every apply)."""
    app.state.auth = AuthConfig.from_server(policy.server)
    app.state.proxy = ProxyConfig.from_server(policy.server)


def _on_sighup(handler: Callable[[], None]) -> Callable[[], None]:
    """Re-read the policy file on SIGHUP (main thread only); returns the undo."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, handler)
    except (NotImplementedError, RuntimeError, ValueError):
        return lambda: None  # not the main thread (e.g. a test client): no signals

    def undo() -> None:
        loop.remove_signal_handler(signal.SIGHUP)

    return undo


def create_app(
    settings: Settings,
    *,
    probe: DeviceProbe | None = None,
    clock: Clock | None = None,
    launcher: ProcessLauncher | None = None,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            daemon = await _start_daemon(settings, probe=probe, clock=clock, launcher=launcher)
        except VramdError as exc:
            app.state.startup_failed = str(exc)
            log.error("vramd cannot start: %s", exc)
            raise
        app.state.daemon = daemon
        _use_server_settings(app, daemon.orchestrator.policy)
        daemon.orchestrator.policy_listeners.append(lambda p: _use_server_settings(app, p))
        hangup = _on_sighup(daemon.orchestrator.reload_policy_file)
        try:
            yield
        finally:
            hangup()
            await _stop_daemon(daemon, own_probe=probe is None)

    app = FastAPI(
        title="vramd",
        version=__version__,
        lifespan=lifespan,
        docs_url="/api/docs",
        redoc_url=None,
    )
    install_error_handlers(app)
    install_auth(app)
    # /v1 first: a request is matched against the routes in order, and the proxied
    # routes carry nearly all the traffic (behind /api's twenty they paid ~50 us each).
    # No path of one router overlaps another's, so the order changes nothing else.
    app.include_router(openai.router)
    app.include_router(admin.health_router)
    app.include_router(admin.router)
    app.include_router(ui.router)
    app.include_router(ui.metrics_router)
    return app


async def _start_daemon(
    settings: Settings,
    *,
    probe: DeviceProbe | None,
    clock: Clock | None,
    launcher: ProcessLauncher | None,
) -> Daemon:
    clock = clock or SystemClock()
    text = settings.config.read_text(encoding="utf-8")
    policy = load_policy(text)
    address = server_address(settings, policy)
    lock = DatabaseLock(address.database)
    try:
        store = open_store(address.database)
    except BaseException:
        lock.release()
        raise
    try:
        with store.session() as session:
            version, is_new = persist_policy(
                session, policy=policy, text=text, source=str(settings.config), now=clock.now()
            )
        log.info(
            "policy %s %s as version %d (%d services)",
            settings.config,
            "stored" if is_new else "unchanged",
            version,
            len(policy.services),
        )
        probe = probe or create_probe(policy.device.backend, policy.device.gpus)
        log.info("device backend: %s", probe.backend)
        orchestrator = Orchestrator(
            policy=policy,
            store=store,
            probe=probe,
            clock=clock,
            launcher=launcher,
            settings=settings,
        )
        await orchestrator.start()
    except BaseException:
        store.close()
        lock.release()
        raise
    return Daemon(
        lock=lock,
        settings=settings,
        store=store,
        probe=probe,
        clock=clock,
        orchestrator=orchestrator,
    )


async def _stop_daemon(daemon: Daemon, *, own_probe: bool) -> None:
    try:
        await daemon.orchestrator.close()
    finally:
        if own_probe:
            daemon.probe.close()
        daemon.store.close()
        daemon.lock.release()
