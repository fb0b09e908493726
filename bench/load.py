"""The client side of ``bench.proxy``: a lean HTTP/1.1 client, bursts at a concurrency.

The client is written on asyncio streams rather than taken from httpx: on a 2-core
machine the load generator shares the CPUs with the servers it measures, and at a
concurrency of 16 an httpx request's few hundred microseconds of client work would be
measured as the servers' latency. This one formats a request in one write and parses
just what the servers under test send: a status line, headers, then a body framed by
``Content-Length`` or ``Transfer-Encoding: chunked`` (every server here frames its
answers one of these ways; anything else is an error, not a guess).

A request's latency runs from the write of the request to the last byte of the answer;
its first-byte time, to the first byte of the body (for a stream: the first event).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

# Idle connections older than this are not reused: uvicorn closes them after 5 s
# (--timeout-keep-alive), and a request sent on one a server is closing would fail.
KEEP_ALIVE_S = 2.0


class ProtocolError(Exception):
    """An answer this client does not understand, or an error status."""


@dataclass(frozen=True, slots=True)
class Timing:
    """One request: seconds to the first body byte and to the end of the answer."""

    first: float
    total: float


class Connection:
    """One keep-alive connection to one server, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.open = True

    @classmethod
    async def connect(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def post(self, request: bytes) -> Timing:
        """Send the formatted ``request``; read the whole answer."""
        reader = self._reader
        started = time.perf_counter()
        self._writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, _, rest = head.partition(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[bytes, bytes] = {}
        for line in rest.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip().lower()
        if headers.get(b"connection") == b"close":
            self.open = False
        if status >= 400:
            self.open = False
            raise ProtocolError(f"status {status}: {head!r}")
        length = headers.get(b"content-length")
        if length is not None:
            await reader.readexactly(int(length))
            end = time.perf_counter()
            return Timing(first=end - started, total=end - started)
        if headers.get(b"transfer-encoding") != b"chunked":
            self.open = False
            raise ProtocolError(f"an answer framed neither by length nor in chunks: {head!r}")
        first = None
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                break
            await reader.readexactly(size + 2)  # the chunk and its CRLF
            if first is None:
                first = time.perf_counter() - started
        total = time.perf_counter() - started
        return Timing(first=total if first is None else first, total=total)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


class Target:
    """One server under test: where to send, what to send, a pool of connections."""

    def __init__(self, url: str, path: str, headers: Mapping[str, str] | None = None) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None, url
        self.host, self.port = parts.hostname, parts.port
        self._path = path
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[tuple[float, Connection]] = []  # (when it was last used, it)

    def request(self, body: bytes) -> bytes:
        head = (
            f"POST {self._path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{self._extra}\r\n"
        )
        return head.encode() + body

    async def send(self, request: bytes) -> Timing:
        conn = await self._connection()
        try:
            timing = await conn.post(request)
        except BaseException:
            await conn.close()
            raise
        if conn.open:
            self._idle.append((time.monotonic(), conn))
        else:
            await conn.close()
        return timing

    async def _connection(self) -> Connection:
        while self._idle:
            used, conn = self._idle.pop()
            if time.monotonic() - used < KEEP_ALIVE_S:
                return conn
            await conn.close()
        return await Connection.connect(self.host, self.port)

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop()[1].close()


@dataclass(frozen=True, slots=True)
class Burst:
    """``count`` requests sent over ``concurrency`` connections, as fast as they answer."""

    timings: list[Timing]
    wall_s: float

    @property
    def rate(self) -> float:
        return len(self.timings) / self.wall_s if self.wall_s > 0 else 0.0


async def burst(target: Target, request: bytes, *, count: int, concurrency: int) -> Burst:
    timings: list[Timing] = []
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            timings.append(await target.send(request))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return Burst(timings, time.perf_counter() - started)
