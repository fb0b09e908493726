"""The three watchers around one proxied exchange: client hang-up, runtime silence, ACKs."""

from __future__ import annotations

import asyncio
import socket
import weakref
from typing import Any

import httpx
from starlette.types import Message, Receive, Send

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only

# Each upstream connection's socket, found once per connection: asking httpcore for it
# (``get_extra_info("socket")``, through anyio's typed attributes) costs ~5 us a time,
# more than the setsockopt it is wanted for. Weak keys: a closed connection's entry goes.
_sockets: weakref.WeakKeyDictionary[Any, socket.socket | None] = weakref.WeakKeyDictionary()


class Acker:
    """Sends the pending ACK on an upstream connection now (see the module docstring)."""

    __slots__ = ("_sock",)

    def __init__(self, upstream: httpx.Response) -> None:
        stream = upstream.extensions.get("network_stream")  # absent for mock transports
        self._sock = None
        if stream is not None and _QUICKACK is not None:
            try:
                self._sock = _sockets[stream]
            except KeyError:
                self._sock = _sockets[stream] = stream.get_extra_info("socket")
            except TypeError:  # a stream that cannot be weakly referenced: ask each time
                self._sock = stream.get_extra_info("socket")
        self()

    def __call__(self) -> None:
        if self._sock is not None and _QUICKACK is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                self._sock = None


class DisconnectWatch:
    """Cancels the task serving a request when its client hangs up.

    Like ``asyncio.timeout`` with the hang-up as the deadline: the cancellation is told
    apart from any other by ``gone`` and ``Task.uncancel``. ``send`` is wrapped so that
    the ``http.disconnect`` a server reports once the response is complete is not taken
    for a hang-up.

    ``ProxyResponse`` (``service.proxy.forward``) serves each request inside these:

    - ``DisconnectWatch`` cancels the exchange when the client hangs up, wherever it is (in
      the queue, waiting for the first byte, relaying a stream);
    - ``Silence`` enforces ``read_timeout`` as the longest silence between a runtime's
      chunks, with one timer per answer instead of one per chunk;
    - ``Acker`` asks the kernel for an immediate TCP ACK on the upstream connection, so a
      runtime that writes in small separate sends is not held back by delayed ACKs.

    Each is told apart from other cancellations the way ``asyncio.timeout`` does it, with
    ``Task.uncancel``.
    """

    __slots__ = ("_complete", "_task", "_watcher", "gone")

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._complete = False
        self.gone = False
        self._watcher = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._complete:
            self.gone = True
            self._task.cancel()

    def wrap(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self._complete = True
            await send(message)

        return wrapped

    def absorbs(self) -> bool:
        """True when a CancelledError came from the hang-up alone and should end quietly."""
        return self.gone and self._task.uncancel() == 0

    def stop(self) -> None:
        self._watcher.cancel()


class Silence:
    """The longest silence allowed between a runtime's chunks (``read_timeout``).

    Like ``asyncio.timeout`` around each read, but with one timer for the whole answer:
    entering an ``asyncio.timeout`` schedules and cancels a timer (~6 us), and an event
    stream would pay that for every event. Here ``reading`` and ``heard`` only note when
    a wait begins and ends; the timer, when it fires, re-arms itself for the current
    wait's own deadline unless that has passed, and then cancels the task. Time spent
    writing to the client is not the runtime's silence. ``timed_out`` tells this
    cancellation apart from any other, as ``asyncio.timeout`` does, with
    ``Task.uncancel``.
    """

    __slots__ = ("_cancelling", "_handle", "_limit", "_loop", "_since", "_task", "expired")

    def __init__(self, limit: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._loop = asyncio.get_running_loop()
        self._limit = limit
        self._since: float | None = None  # when the current read began; None: not reading
        self.expired = False
        self._handle = self._loop.call_at(self._loop.time() + limit, self._check)

    def reading(self) -> None:
        """The relay starts waiting for the runtime's next chunk."""
        self._since = self._loop.time()

    def heard(self) -> None:
        """The chunk came (the relay now writes it to the client)."""
        self._since = None

    def _check(self) -> None:
        now = self._loop.time()
        due = now + self._limit if self._since is None else self._since + self._limit
        if now < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.expired = True
        self._task.cancel()

    def timed_out(self) -> bool:
        """After a CancelledError: True when this timer alone cancelled (absorb it)."""
        return self.expired and self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        self._handle.cancel()
