"""The application factory: the only place that wires concrete classes together."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
from fastapi import FastAPI

from service import __version__
from service.api import admin, openai, ui, upstream
from service.api.auth import AuthConfig, install_auth
from service.api.errors import install_error_handlers
from service.api.metrics import Metrics
from service.clock import Clock, SystemClock, time_of_day
from service.devices import DeviceProbe, create_probe
from service.errors import VramdError
from service.health.healthz import Health
from service.kernel.effects import KernelEffects
from service.kernel.orchestrator import Orchestrator
from service.kernel.sleeping import SleepMode
from service.kernel.tickets import Tickets
from service.kernel.tuning import AutoTuning
from service.live.events import EventLog
from service.live.leases import Waiters
from service.live.runtimes import RuntimeTable
from service.live.usage import Accounts, UsageBook
from service.maintenance.windows import Windows
from service.memory.doctor import Doctor
from service.memory.sampling import LastReading, Sampler
from service.policy import Policy, load_policy
from service.proxy.request import ProxyConfig
from service.scheduler import TICK_S, Learned, Pump, Scheduler, rules_from_policy
from service.settings import Settings, server_address
from service.store import Store, StoreWriter, open_store, queries
from service.store.lock import DatabaseLock
from service.store.policy_records import persist_policy
from service.supervisor import ProcessLauncher, SubprocessLauncher
from service.swapstate import StateKeeper

log = logging.getLogger("vramd")
HANDOVER_ID_GAP = 100_000


@dataclass
class Daemon:
    """Everything the lifespan built, to be closed in reverse order."""

    settings: Settings
    store: Store
    writer: StoreWriter
    probe: DeviceProbe
    clock: Clock
    orchestrator: Orchestrator
    metrics: Metrics
    lock: DatabaseLock
    # Renews /metrics' snapshot of vramd's own series while someone scrapes.
    metrics_refresh: asyncio.Task[None] | None = None


def build_orchestrator(
    *,
    policy: Policy,
    store: Store,
    writer: StoreWriter,
    probe: DeviceProbe,
    clock: Clock,
    settings: Settings,
    launcher: ProcessLauncher | None = None,
    metrics: Metrics | None = None,
) -> Orchestrator:
    """The kernel, wired: each part gets only its ports (``metrics``: made unless given)."""
    events = EventLog(writer, clock)
    runtimes = RuntimeTable(
        dict(policy.services),
        launcher=launcher or SubprocessLauncher(clock, output_dir=runtime_output(store)),
        clock=clock,
        http=httpx.AsyncClient(timeout=httpx.Timeout(2.0)),  # for health polls
    )
    rules, device_rule = rules_from_policy(policy)
    scheduler = Scheduler(
        rules,
        device_rule,
        learned=restore_stats(store, runtimes),
        clock_text=time_of_day(clock),
    )
    pump = Pump(scheduler, clock.monotonic)
    last = LastReading()
    doctor, sampler = _memory_truth(
        pump, scheduler, runtimes, events, last, policy, store, writer, probe, clock, settings
    )
    windows = Windows(
        policy=policy, feed=pump.feed, runtimes=runtimes, store=store, writer=writer,
        events=events, clock=clock,
    )  # fmt: skip
    health = Health(
        clock=clock, last=last, runtimes=runtimes, backend=probe.backend, events=events,
        tick_s=TICK_S, sample_interval_s=policy.device.sample_interval,
        grace_s=settings.liveness_grace_s, stall_after_s=settings.watchdog_stall_s,
    )  # fmt: skip
    metrics = metrics or new_metrics(lambda: orchestrator, policy, backend=probe.backend)
    accounts = Accounts(metrics, UsageBook(clock.now))
    waiters, tickets = Waiters(), Tickets()
    keeper = StateKeeper(
        store.path.parent / "state", runtimes=runtimes, events=events, clock=clock,
        flag=doctor.flag, clear_flags=doctor.clear_flags,
    )  # fmt: skip
    effects = KernelEffects(
        feed=pump.feed, runtimes=runtimes, waiters=waiters, tickets=tickets,
        sleep=SleepMode(
            events=events, probe=probe, clock=clock, settle_timeout_s=settings.settle_timeout
        ),
        doctor=doctor, sampler=sampler, events=events, accounts=accounts, writer=writer,
        probe=probe, clock=clock, settle_timeout_s=settings.settle_timeout, keeper=keeper,
    )  # fmt: skip
    pump.connect(effects)
    orchestrator = Orchestrator(
        policy=policy,
        pump=pump,
        effects=effects,
        runtimes=runtimes,
        waiters=waiters,
        tickets=tickets,
        sampler=sampler,
        last=last,
        doctor=doctor,
        windows=windows,
        health=health,
        events=events,
        accounts=accounts,
        store=store,
        writer=writer,
        clock=clock,
        settings=settings,
        tuning=AutoTuning(
            pump=pump, events=events, clock=clock, policy=lambda: orchestrator.policy
        ),
    )
    return orchestrator


def runtime_output(store: Store) -> Path:
    """Where runtimes write their output: beside the database, so the next daemon on it
    finds the files of the runtimes it adopts."""
    return Path(f"{store.path}.output")


def _memory_truth(
    pump: Pump,
    scheduler: Scheduler,
    runtimes: RuntimeTable,
    events: EventLog,
    last: LastReading,
    policy: Policy,
    store: Store,
    writer: StoreWriter,
    probe: DeviceProbe,
    clock: Clock,
    settings: Settings,
) -> tuple[Doctor, Sampler]:
    """The memory package's two workers: the doctor (flags, verdicts, the watches) and
    the sampler that feeds it and the scheduler."""
    doctor = Doctor(
        writer=writer,
        events=events,
        clock=clock,
        settings=settings,
        last=last,
        runtimes=runtimes,
        feed=pump.feed,
        gpu=probe.backend != "host",
    )
    sampler = Sampler(
        feed=pump.feed,
        view=scheduler,
        runtimes=runtimes,
        watches=doctor.watches,
        on_finding=doctor.on_finding,
        last=last,
        probe=probe,
        store=store,
        writer=writer,
        clock=clock,
        interval_s=policy.device.sample_interval,
    )
    return doctor, sampler


def new_metrics(kernel: Callable[[], Orchestrator], policy: Policy, *, backend: str) -> Metrics:
    """The exposition; it asks the orchestrator only when scraped, so ``kernel`` may
    answer one built after it."""
    return Metrics(
        lambda: kernel().status(),
        node_load=lambda: kernel().node_load(),
        client_usage=lambda: kernel().client_usage(),
        yielding=lambda: kernel().tuning.view(),
        version=__version__,
        backend=backend,
        refresh_s=policy.device.sample_interval,
    )


def restore_stats(store: Store, runtimes: RuntimeTable) -> dict[str, Learned]:
    """Counters and learned figures survive daemon restarts (SQLite); flags describe
    an instance, and every instance of a new daemon is new, so they start clear."""
    learned = {}
    with store.session() as session:
        for stats in queries.all_stats(session):
            rt = runtimes.get(stats.service)
            if rt is None:
                continue
            rt.requests_served = stats.requests_served or 0
            rt.placement.loads = stats.loads or 0
            rt.placement.evictions = stats.evictions or 0
            rt.placement.restarts = stats.restarts or 0
            rt.measured.learned_peak = stats.learned_peak_bytes
            rt.measured.learned_load_s = stats.learned_load_s
            learned[stats.service] = Learned(stats.learned_peak_bytes, stats.learned_load_s)
    return learned


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
    """``create_app(settings, probe=..., clock=..., launcher=...)`` returns a FastAPI app whose
    lifespan loads the policy, opens (and migrates) the database, records the policy as a
    version, starts the store writer (the one thread that writes the daemon's records),
    creates the device probe and the kernel, and on shutdown stops every runtime, then
    commits what the writer still holds, before closing the database. Tests pass fakes for
    the injectable parts.

    ``build_orchestrator`` assembles the kernel (docs/architecture.md): the scheduler and its
    pump, the runtime table, and the helpers on their narrow ports -- the sampler, the
    doctor, the windows and sleep mode get ``feed``, a read-only scheduler view and the
    runtime table, never the orchestrator -- then the effects that carry actions out, and
    the orchestrator that owns them all.
    """

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
    app.include_router(openai.alias_router)
    app.include_router(upstream.router)
    app.include_router(admin.health_router)
    app.include_router(admin.router)
    app.include_router(ui.router)
    app.add_route("/metrics", ui.metrics, methods=["GET"])  # plain: see ui.metrics
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
        # A daemon being replaced writes the last of its rows beside ours.
        writer = StoreWriter(store, id_gap=HANDOVER_ID_GAP if settings.replacing else 0)
        writer.start()
    except BaseException:
        store.close()
        lock.release()
        raise
    try:
        metrics = new_metrics(lambda: orchestrator, policy, backend=probe.backend)
        orchestrator = build_orchestrator(
            policy=policy,
            store=store,
            writer=writer,
            probe=probe,
            clock=clock,
            launcher=launcher,
            settings=settings,
            metrics=metrics,
        )
        await orchestrator.start()
    except BaseException:
        writer.close()
        store.close()
        lock.release()
        raise
    return Daemon(
        lock=lock,
        settings=settings,
        store=store,
        writer=writer,
        probe=probe,
        clock=clock,
        orchestrator=orchestrator,
        metrics=metrics,
        metrics_refresh=asyncio.create_task(metrics.keep_fresh(), name="metrics snapshot"),
    )


async def _stop_daemon(daemon: Daemon, *, own_probe: bool) -> None:
    if daemon.metrics_refresh is not None:
        daemon.metrics_refresh.cancel()
        with suppress(asyncio.CancelledError):
            await daemon.metrics_refresh
    try:
        await daemon.orchestrator.close()
    finally:
        if own_probe:
            daemon.probe.close()
        await asyncio.to_thread(daemon.writer.close)  # the records of the shutdown too
        daemon.store.close()
        daemon.lock.release()
