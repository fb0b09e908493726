"""uvicorn's server, telling the orchestrator the moment SIGTERM or SIGINT arrives, and
running the Ollama listener beside it when the policy asks for one.

uvicorn's graceful shutdown first waits (up to its timeout) for open connections, and
only then runs the app's lifespan shutdown. A request queued behind a load would hold
that wait for its whole length; so the orchestrator hears of the signal at once
(``begin_shutdown``: refuse what waits, let what runs finish), then uvicorn goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from service.domain import InstanceState as S
from service.errors import RequestRejected, StoreError
from service.handover import ControlPoint, Handing, Predecessor, hand_over_blocked_here
from service.live.leases import Lease, Outcome
from service.settings import Settings
from service.store.lock import DatabaseLock

log = logging.getLogger("vramd.server")
# After a hand-over: how long an idle kept-alive connection is left open for a next
# request (answered with Connection: close), and the bound on the whole wait.
IDLE_GRACE_S = 1.0
LEAVE_TIMEOUT_S = 60.0
# How long the new daemon waits for a slot to hold for the replaced one's request.
HOLD_WAIT_S = 1.0
# uvicorn's wait for open connections at shutdown, after the orchestrator has drained.
GRACEFUL_S = 30


class CompanionServer(uvicorn.Server):
    """A listener the daemon's server starts and stops; it never handles signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class DaemonServer(uvicorn.Server):
    """``listener``: the daemon's listening socket (bound, or handed over by the daemon
    it replaces, ``predecessor``); ``database`` names its control socket.

    A companion listener (``server.ollama``) is a second uvicorn server on the same event
    loop, serving an app that shares the daemon's state. It starts once the daemon is up
    (its requests need the orchestrator), leaves signals to the daemon's server, and is shut
    down before the daemon is: its requests finish while there is still a daemon to serve
    them.
    """

    def __init__(
        self,
        app: FastAPI,
        config: uvicorn.Config,
        companions: Sequence[tuple[CompanionServer, socket.socket]] = (),
        *,
        listener: socket.socket,
        database: Path,
        predecessor: Predecessor | None = None,
    ) -> None:
        super().__init__(config)
        self.app = app
        self._companions = list(companions)
        self._companion_tasks: list[asyncio.Task[None]] = []
        self._listener = listener
        self._database = database
        self._predecessor = predecessor
        self._control: ControlPoint | None = None
        self._leaving: asyncio.Task[None] | None = None
        self._holding: asyncio.Task[None] | None = None
        self.started_at = time.monotonic()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        daemon = getattr(self.app.state, "daemon", None)
        if daemon is not None:
            # A signal handler runs between two bytecodes of the loop's own thread: hand
            # the call to the loop rather than run it in the middle of whatever ran.
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_soon_threadsafe(daemon.orchestrator.begin_shutdown)
        for companion, _ in self._companions:
            companion.should_exit = True
            companion.force_exit = companion.force_exit or self.should_exit
        super().handle_exit(sig, frame)

    def run_all(self) -> None:
        """Serve until a signal, with the companions; ``run`` serves this app alone."""
        loop_factory = self.config.get_loop_factory()
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(self._serve_all())

    async def _serve_all(self) -> None:
        main = asyncio.create_task(self.serve(sockets=[self._listener]))
        while not self.started and not main.done():
            await asyncio.sleep(0.01)
        if self.started:
            for server, sock in self._companions:
                task = asyncio.create_task(server.serve(sockets=[sock]))
                task.add_done_callback(_report_failure)
                self._companion_tasks.append(task)
            await self._took_over()
        try:
            await main
        finally:
            await self._stop_companions()
            if self._control is not None:
                await self._control.close()
            if self._predecessor is not None:
                self._predecessor.close()

    async def _took_over(self) -> None:
        """Serving: tell the daemon replaced (and systemd), open our own control socket."""
        while self._companions and not all(c.started for c, _ in self._companions):
            await asyncio.sleep(0.01)
        pid = os.getpid()
        if self._predecessor is not None:
            held = self._predecessor.serving()
            self._holding = asyncio.create_task(self._hold_for_predecessor(held))
            log.info(
                "took over from pid %d: sockets after %.0f ms, serving %.0f ms after start",
                self._predecessor.pid, self._predecessor.waited_s * 1000,
                (time.monotonic() - self.started_at) * 1000,
            )  # fmt: skip
            notify_systemd(f"MAINPID={pid}\nREADY=1")
        else:
            notify_systemd("READY=1")
        self._control = ControlPoint(self._database, self._handing())
        await self._control.open()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, self._spawn_successor)

    async def _hold_for_predecessor(self, held: dict[str, int]) -> None:
        """Hold a slot for each request the replaced daemon still has at a runtime, each
        let go as that request ends: no request beyond a runtime's concurrency, and no
        stop of a runtime that still answers the old daemon."""
        orchestrator = self.app.state.daemon.orchestrator
        leases: dict[str, list[Lease]] = {}
        for name, count in held.items():
            rt = orchestrator.runtimes.get(name)
            for i in range(min(count, rt.spec.max_concurrency) if rt is not None else 0):
                with contextlib.suppress(TimeoutError, RequestRejected):
                    lease = orchestrator.acquire(name, request_id=f"handover-{name}-{i}")
                    leases.setdefault(name, []).append(await asyncio.wait_for(lease, HOLD_WAIT_S))
        assert self._predecessor is not None
        if not leases:
            return
        async for counts in self._predecessor.in_flight():
            for name, kept in leases.items():
                while len(kept) > counts.get(name, 0):
                    # Never sent to a runtime by this daemon: not counted as a request.
                    orchestrator.release(kept.pop(), outcome=Outcome.NOT_SENT)

    def _all_servers(self) -> list[uvicorn.Server]:
        return [self, *(c for c, _ in self._companions)]

    async def _leave_when_idle(self) -> None:
        """Handed over: wait until every connection is closed or idle for
        ``IDLE_GRACE_S``, then exit (closing what is left).

        A kept-alive connection's next request is relayed to the new daemon, answered
        with ``Connection: close``, and the client's following one goes to the new
        daemon. A connection is never closed, nor its keep-alive withdrawn, while an
        answer is on its way: the client, told nothing, would send its next request on
        it as it closes, and get a reset."""
        idle_since: dict[object, float] = {}
        deadline = time.monotonic() + LEAVE_TIMEOUT_S
        while time.monotonic() < deadline:
            now, waiting = time.monotonic(), False
            for server in self._all_servers():
                for conn in list(server.server_state.connections):
                    cycle = getattr(conn, "cycle", None)
                    if cycle is not None and not cycle.response_complete:
                        idle_since.pop(conn, None)
                        waiting = True
                    elif now - idle_since.setdefault(conn, now) < IDLE_GRACE_S:
                        waiting = True
            if not waiting:
                break
            await asyncio.sleep(0.02)
        for server in self._all_servers():
            server.should_exit = True

    def _spawn_successor(self) -> None:
        """SIGUSR2 (``systemctl reload``): start ``vramd serve --replace`` with our own
        arguments; it takes over through the control socket."""
        blocked = hand_over_blocked_here()
        if blocked:
            log.error(
                "SIGUSR2 ignored: %s. In a container, restart the container to upgrade; "
                "vramd apply (or SIGHUP) reloads the policy without a restart",
                blocked,
            )
            return
        argv = [sys.executable, *sys.orig_argv[1:]]
        if "--replace" not in argv:
            argv.append("--replace")
        log.info("SIGUSR2: starting a new vramd to take over: %s", " ".join(argv))
        subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def _handing(self) -> Handing:
        daemon = self.app.state.daemon
        orchestrator = daemon.orchestrator
        keep = orchestrator.keep_runtimes

        async def quiesce(timeout_s: float) -> str:
            deadline = time.monotonic() + timeout_s
            while busy := [
                rt.name
                for rt in orchestrator.runtimes.values()
                if rt.instance.state in (S.STARTING, S.STOPPING, S.DRAINING)
            ]:
                if time.monotonic() >= deadline:
                    return f"{', '.join(busy)} still starting or stopping after {timeout_s:g}s"
                await asyncio.sleep(0.02)
            return ""

        async def flush() -> None:
            await daemon.writer.flushed(timeout=10.0)

        def retake_lock() -> None:
            try:
                daemon.lock = DatabaseLock(self._database)
            except StoreError as exc:
                log.error("cannot take the database lock back: %s", exc)

        def leave() -> None:
            orchestrator.hand_over()  # from here on, requests not yet at a runtime go on
            for server in self._all_servers():
                for listening in server.servers:
                    listening.close()
            self._leaving = asyncio.create_task(self._leave_when_idle())

        def in_flight() -> dict[str, int]:
            counts = {
                name: orchestrator.scheduler.service_view(name).in_flight
                for name in orchestrator.runtimes
            }
            return {name: count for name, count in counts.items() if count}

        def abort() -> None:
            orchestrator.keep_runtimes = keep

        return Handing(
            sockets=lambda: [self._listener, *(sock for _, sock in self._companions)],
            quiesce=quiesce, release_lock=lambda: daemon.lock.release(), retake_lock=retake_lock,
            flush=flush, leave=leave, in_flight=in_flight, abort=abort,
        )  # fmt: skip

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._stop_companions()
        await super().shutdown(sockets)

    async def _stop_companions(self) -> None:
        for companion, _ in self._companions:
            companion.should_exit = True
        if self._companion_tasks:
            await asyncio.gather(*self._companion_tasks, return_exceptions=True)
            self._companion_tasks = []


def _report_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("the Ollama listener stopped: %s", exc, exc_info=exc)


def assemble(
    settings: Settings,
    *,
    listener: socket.socket,
    database: Path,
    ollama: socket.socket | None = None,
    predecessor: Predecessor | None = None,
    access_log: bool = True,
) -> DaemonServer:
    """The daemon as ``vramd serve`` runs it, on sockets already bound: the app, its
    uvicorn server and, on ``ollama``, the Ollama listener. The test harness's in-thread
    daemon is assembled here too, so what the tests run is what users run."""
    from service.api.ollama import create_ollama_app
    from service.app import create_app

    application = create_app(settings)
    companions = []
    if ollama is not None:
        config = uvicorn.Config(
            create_ollama_app(application),
            log_level=settings.log_level,
            timeout_graceful_shutdown=GRACEFUL_S,
            lifespan="off",
        )
        companions.append((CompanionServer(config), ollama))
    config = uvicorn.Config(
        application,
        log_level=settings.log_level,
        access_log=access_log,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    return DaemonServer(
        application,
        config,
        companions,
        listener=listener,
        database=database,
        predecessor=predecessor,
    )


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; ``OSError`` saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def notify_systemd(message: str) -> None:
    """Tell systemd (``Type=notify``) we are ready, or that a new main process serves."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(message.encode(), address)
