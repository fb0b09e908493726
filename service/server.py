"""uvicorn's server, telling the orchestrator the moment SIGTERM or SIGINT arrives, and
running the Ollama listener beside it when the policy asks for one.

uvicorn's graceful shutdown first waits (up to its timeout) for open connections, and
only then runs the app's lifespan shutdown. A request queued behind a load would hold
that wait for its whole length; so the orchestrator hears of the signal at once
(``begin_shutdown``: refuse what waits, let what runs finish), then uvicorn goes on.

A companion listener (``server.ollama``) is a second uvicorn server on the same event
loop, serving an app that shares the daemon's state. It starts once the daemon is up
(its requests need the orchestrator), leaves signals to the daemon's server, and is shut
down before the daemon is: its requests finish while there is still a daemon to serve
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator, Sequence
from types import FrameType

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("vramd.server")


class CompanionServer(uvicorn.Server):
    """A listener the daemon's server starts and stops; it never handles signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class DaemonServer(uvicorn.Server):
    def __init__(
        self,
        app: FastAPI,
        config: uvicorn.Config,
        companions: Sequence[tuple[CompanionServer, socket.socket]] = (),
    ) -> None:
        super().__init__(config)
        self._app = app
        self._companions = list(companions)
        self._companion_tasks: list[asyncio.Task[None]] = []

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        daemon = getattr(self._app.state, "daemon", None)
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
        main = asyncio.create_task(self.serve())
        while not self.started and not main.done():
            await asyncio.sleep(0.05)
        if self.started:
            for server, sock in self._companions:
                task = asyncio.create_task(server.serve(sockets=[sock]))
                task.add_done_callback(_report_failure)
                self._companion_tasks.append(task)
        try:
            await main
        finally:
            await self._stop_companions()

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
