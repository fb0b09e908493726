"""uvicorn's server, telling the orchestrator the moment SIGTERM or SIGINT arrives.

uvicorn's graceful shutdown first waits (up to its timeout) for open connections, and
only then runs the app's lifespan shutdown. A request queued behind a load would hold
that wait for its whole length; so the orchestrator hears of the signal at once
(``begin_shutdown``: refuse what waits, let what runs finish), then uvicorn goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import FrameType

import uvicorn
from fastapi import FastAPI


class DaemonServer(uvicorn.Server):
    def __init__(self, app: FastAPI, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        daemon = getattr(self._app.state, "daemon", None)
        if daemon is not None:
            # A signal handler runs between two bytecodes of the loop's own thread: hand
            # the call to the loop rather than run it in the middle of whatever ran.
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_soon_threadsafe(daemon.orchestrator.begin_shutdown)
        super().handle_exit(sig, frame)
