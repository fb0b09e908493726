"""Restart without a gap: a new daemon takes over from the one serving the same database."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger("vramd.handover")

# Inits that exit when their one child does, ending the container with it: under one, a
# successor would be orphaned and killed with the container (docs/deployment.md, "What a
# container restart does to loaded models").
CONTAINER_INITS = frozenset({"tini", "tini-static", "docker-init", "dumb-init", "catatonit"})


def hand_over_blocked(pid: int, parent_name: str) -> str:
    """Why a hand-over from this process could not work, or "" when it can."""
    if pid == 1:
        return "vramd is its container's pid 1: the container ends when it exits"
    if parent_name in CONTAINER_INITS:
        return f"vramd runs under {parent_name}, which exits, ending its container, when vramd does"
    return ""


def hand_over_blocked_here() -> str:
    """``hand_over_blocked`` for this process."""
    parent_name = ""
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process().parent()
        parent_name = parent.name() if parent else ""
    return hand_over_blocked(os.getpid(), parent_name)


# Bounds of each step: the old daemon waits this long for loads and stops to finish
# before it gives up the sockets, and this long for the new one to serve.
QUIET_TIMEOUT_S = 120.0
SERVING_TIMEOUT_S = 120.0
IN_FLIGHT_POLL_S = 0.02


def control_address(database: Path) -> str:
    """The abstract unix socket of the daemon serving ``database``."""
    digest = hashlib.sha256(str(database.expanduser().absolute()).encode()).hexdigest()
    return f"\0vramd-control-{digest[:32]}"


def _send(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(conn, [data], fds)
    else:
        conn.sendall(data)


def _peer_allowed(conn: socket.socket) -> bool:
    """Only the daemon's own user, or root, may take it over."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid in (0, os.getuid())


# ---------------------------------------------------------------- the new daemon


@dataclass
class Predecessor:
    """The daemon being replaced: its sockets, and the line to tell it we serve."""

    conn: socket.socket
    sockets: list[socket.socket]
    pid: int
    waited_s: float
    _buffer: bytes = b""

    def serving(self) -> dict[str, int]:
        """Tell the old daemon to stop accepting and leave (it exits on its own); returns
        its requests still at a runtime, per service."""
        try:
            _send(self.conn, {"op": "serving", "pid": os.getpid()})
            self.conn.settimeout(10.0)
            return self._counts(self._line())
        except (OSError, ValueError):
            return {}

    async def in_flight(self) -> AsyncIterator[dict[str, int]]:
        """The old daemon's requests at a runtime each time their number changes, down to
        none (or until it is gone)."""
        self.conn.settimeout(None)
        while True:
            try:
                line = await asyncio.to_thread(self._line)
                counts = self._counts(line)
            except (OSError, ValueError):
                counts = {}
            yield counts
            if not counts:
                return

    def _line(self) -> bytes:
        while b"\n" not in self._buffer:
            data = self.conn.recv(65536)
            if not data:
                raise ConnectionError("the old daemon is gone")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    @staticmethod
    def _counts(line: bytes) -> dict[str, int]:
        return {str(k): int(v) for k, v in json.loads(line).get("in_flight", {}).items()}

    def close(self) -> None:
        """Let go of the control connection (``gone`` returns, in its thread, too)."""
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.conn.close()


class HandoverRefused(Exception):
    """The running daemon said no (busy beyond its bound, or another hand-over)."""


def ask_to_hand_over(database: Path) -> Predecessor | None:
    """Take over the daemon serving ``database``; None if none runs. Blocking: it runs
    before the new daemon's loop. Raises ``HandoverRefused`` with the old one's reason.

    ``vramd serve --replace`` (and SIGUSR2, which ``systemctl reload vramd`` sends) hands the
    daemon over (docs/operations.md, "Restarts and upgrades"):

    1. The new daemon connects to the old one's control socket (abstract, named after the
       database; only the same user or root may use it) and asks.
    2. The old one waits until no runtime is starting or stopping, releases the database
       lock and sends its listening sockets (``SCM_RIGHTS``). Both now hold them: the
       kernel's accept queue never closes, so no connection is refused.
    3. The new daemon adopts the runtimes (``kernel/takeover.py``), serves on the sockets,
       and says ``serving``.
    4. The old one stops accepting, forwards every request it has not yet sent to a runtime
       (queued, or arriving on a kept-alive connection) to the new one, lets the ones at a
       runtime finish, and exits leaving its runtimes running. It tells the new one how many
       of its requests each runtime still serves, as that changes: the new daemon holds as
       many of the service's slots, so it neither overfills a runtime nor stops one that
       still answers the old daemon.

    If the new daemon fails before it serves, the old one takes its lock back and goes on.
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(control_address(database))
    except (ConnectionRefusedError, FileNotFoundError):
        conn.close()
        return None
    began = time.monotonic()
    conn.settimeout(QUIET_TIMEOUT_S + 30)
    _send(conn, {"op": "handover", "pid": os.getpid()})
    data, fds, _, _ = socket.recv_fds(conn, 65536, 8)
    if not data:
        conn.close()
        raise HandoverRefused("the running vramd closed the control connection")
    reply = json.loads(data.split(b"\n", 1)[0])
    if not reply.get("ok"):
        for fd in fds:
            os.close(fd)
        conn.close()
        raise HandoverRefused(str(reply.get("why", "refused")))
    conn.settimeout(None)
    sockets = [socket.socket(fileno=fd) for fd in fds]
    return Predecessor(conn, sockets, int(reply["pid"]), time.monotonic() - began)


# ---------------------------------------------------------------- the old daemon


@dataclass
class Handing:
    """What the old daemon does at each step; the server supplies it."""

    sockets: Callable[[], list[socket.socket]]  # the listening sockets, in order
    quiesce: Callable[[float], Awaitable[str]]  # "" once no runtime starts or stops
    release_lock: Callable[[], None]
    retake_lock: Callable[[], None]
    flush: Callable[[], Awaitable[None]]  # every record written before the new one reads
    leave: Callable[[], None]  # stop accepting, forward the rest, exit when idle
    # Our requests still at a runtime, per service: the new daemon holds as many slots.
    in_flight: Callable[[], dict[str, int]]
    abort: Callable[[], None]  # the new daemon failed: go on as before


class ControlPoint:
    """The old daemon's end: a unix server that hands over to one asker at a time."""

    def __init__(self, database: Path, handing: Handing) -> None:
        self._address = control_address(database)
        self._handing = handing
        self._server: asyncio.AbstractServer | None = None
        self._busy = False
        self._kept: list[asyncio.StreamWriter] = []  # the line to the new daemon

    async def open(self) -> None:
        try:
            self._server = await asyncio.start_unix_server(self._handle, path=self._address)
        except OSError as exc:  # another daemon's (being replaced) is still there
            log.warning("no control socket (%s): this daemon cannot be replaced", exc)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = writer.get_extra_info("socket")
        try:
            line = await reader.readline()
            request = json.loads(line or b"{}")
        except (ValueError, OSError):
            writer.close()
            return
        if request.get("op") != "handover" or not _peer_allowed(conn):
            await _reply(writer, {"ok": False, "why": "not allowed"})
            return
        if self._busy:
            await _reply(writer, {"ok": False, "why": "another hand-over is under way"})
            return
        if why := hand_over_blocked_here():
            await _reply(writer, {"ok": False, "why": why})
            return
        self._busy = True
        try:
            await self._hand_over(reader, writer, int(request.get("pid", 0)))
        finally:
            self._busy = False

    async def _hand_over(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int
    ) -> None:
        handing = self._handing
        log.info("pid %d asks to take over", pid)
        why = await handing.quiesce(QUIET_TIMEOUT_S)
        if why:
            await _reply(writer, {"ok": False, "why": why})
            return
        await handing.flush()
        handing.release_lock()
        await self.close()  # the new daemon opens its own
        fds = [s.fileno() for s in handing.sockets()]
        data = (json.dumps({"ok": True, "pid": os.getpid()}) + "\n").encode()
        with socket.socket(fileno=os.dup(writer.get_extra_info("socket").fileno())) as conn:
            conn.setblocking(True)
            socket.send_fds(conn, [data], fds)
        try:
            line = await asyncio.wait_for(reader.readline(), SERVING_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if not line:
            log.warning("pid %d did not take over; serving on", pid)
            handing.retake_lock()
            handing.abort()
            await self.open()
            writer.close()
            return
        log.info("pid %d serves: leaving", pid)
        self._kept.append(writer)  # closed by our exit: the new daemon sees us gone
        handing.leave()
        last: dict[str, int] | None = None
        with contextlib.suppress(OSError):
            while True:
                counts = handing.in_flight()
                if counts != last:
                    writer.write((json.dumps({"in_flight": counts}) + "\n").encode())
                    await writer.drain()
                    last = counts
                if not counts:
                    break
                await asyncio.sleep(IN_FLIGHT_POLL_S)


async def _reply(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        writer.write((json.dumps(message) + "\n").encode())
        await writer.drain()
        writer.close()
