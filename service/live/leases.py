"""Leases: the contract between the proxy and the kernel (docs/architecture.md).

A request gets a ``Lease`` -- the right to send one request to one ready instance --
from a ``LeaseProvider`` (the orchestrator), and gives it back exactly once with its
``Outcome``. ``Waiters`` holds the requests waiting for their lease: the scheduler's
``Grant`` and ``Reject`` actions resolve them, a client that goes away withdraws its own.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from service.adapters.base import NativeRoute
from service.errors import (
    ErrorCode,
    HandedOver,
    InsufficientCapacity,
    RequestRejected,
)
from service.live.usage import AnswerUsage
from service.policy.clients import ANONYMOUS


class Outcome(enum.StrEnum):
    """How a leased request ended, as reported to ``LeaseProvider.release``."""

    OK = "ok"
    UPSTREAM_ERROR = "upstream_error"  # the runtime answered 4xx/5xx
    CLIENT_GONE = "client_gone"
    RUNTIME_FAILED = (
        ErrorCode.RUNTIME_FAILED.value
    )  # unreachable, or died before the answer was whole
    # The request never reached the runtime (it refused the connection: it had just
    # died): the proxy asks for a lease again, and this one counts as never granted.
    NOT_SENT = "not_sent"
    RUNTIME_TIMEOUT = ErrorCode.RUNTIME_TIMEOUT.value
    PROXY_ERROR = "proxy_error"  # a bug here, not the runtime's fault


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model name and the service that serves it (``GET /v1/models``)."""

    id: str
    service: str
    kind: str
    state: str


@dataclass(frozen=True, slots=True)
class Routed:
    """Where a client's request goes: the service, and the path its runtime answers at."""

    service: str
    path: str
    # JSON fields to set over the client's (the service's set_params for the model).
    params: Mapping[str, Any] | None = None
    # How the runtime serves the route through an API of its own (piper's /synthesize);
    # ``None`` for runtimes that speak the route's API.
    native: NativeRoute | None = None


@dataclass(slots=True)
class Lease:
    """The right to send one request to one ready runtime instance, until released."""

    request_id: str
    service: str
    base_url: str  # the instance, e.g. "http://127.0.0.1:41234"
    client: httpx.AsyncClient  # the instance's pooled client; owned by the orchestrator
    upstream_model: str | None = None  # rewrite "model" to this before forwarding
    queue_ms: float = 0.0  # time spent waiting (queue + load)
    cold_start: bool = False  # the request waited for a load
    caller: str = ANONYMOUS  # the client who asked (docs/policy.md, "Clients and keys")
    granted_at: float = 0.0  # monotonic: when the slot was given (usage's runtime seconds)
    # Told (request body, answer) after a whole answer or stream: set only while a
    # restored state awaits its verdict (``swapstate.verify``), so it costs nothing else.
    answered: Callable[[bytes, bytes], None] | None = None
    # Called when the runtime's answer begins: set only for a new instance's first request
    # (its ``swap`` event's ``first_byte_ms``).
    first_byte: Callable[[], None] | None = None


class LeaseProvider(Protocol):
    """What the proxy needs from the orchestrator (the single owner of live state)."""

    def resolve(self, model: str, route: str) -> Routed:
        """The service serving ``model`` on ``route``, and its runtime's path for it.

        Raises ModelNotFound (404), or InvalidRequest (400) when the service does not
        serve the route.
        """
        ...

    def service_named(self, name: str) -> str:
        """``name`` if it is a service of the active policy; ServiceNotFound (404) if not."""
        ...

    async def acquire(
        self,
        service: str,
        *,
        request_id: str,
        request_info: dict[str, Any] | None = None,
        client: str = ANONYMOUS,
    ) -> Lease:
        """Wait for a slot at a ready instance (queueing, loading as needed).

        Raises ``RequestRejected`` subclasses (QueueFull, InsufficientCapacity, ...). If
        the awaiting task is cancelled (the client went away) the provider withdraws the
        request itself.
        """
        ...

    def release(
        self,
        lease: Lease,
        *,
        outcome: str,
        error: str | None = None,
        status: int | None = None,
        usage: AnswerUsage | None = None,
    ) -> None:
        """Called exactly once per acquired lease, however the request ended.

        ``error`` carries the upstream error text (body or message), so the orchestrator
        can spot out-of-memory reports; ``status`` is the runtime's HTTP status and
        ``usage`` what its answer reported (tokens, images, audio), for usage per client.
        """
        ...

    def models(self) -> list[ServedModel]:
        """Every model name the policy serves, with its service's kind and state."""
        ...


@dataclass
class Waiter:
    """A request waiting for its lease."""

    future: asyncio.Future[Lease]
    service: str
    arrived: float
    cold: bool
    client: str = ANONYMOUS


class Waiters:
    """The requests waiting for a lease, by request id."""

    def __init__(self) -> None:
        self._waiting: dict[str, Waiter] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def ids(self) -> list[str]:
        return list(self._waiting)

    def add(
        self, request_id: str, service: str, *, arrived: float, cold: bool, client: str
    ) -> Waiter:
        future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        waiter = Waiter(future, service, arrived, cold, client)
        self._waiting[request_id] = waiter
        return waiter

    def withdraw(self, request_id: str) -> Waiter | None:
        """Take the waiter out (granted, refused, or its client went away)."""
        return self._waiting.pop(request_id, None)

    def refuse(self, request_id: str, error: RequestRejected) -> Waiter | None:
        """Answer a waiter with ``error``; None if nobody waits under that id any more."""
        waiter = self._waiting.pop(request_id, None)
        if waiter is None or waiter.future.done():
            return None
        waiter.future.set_exception(error)
        return waiter

    def refuse_all(self, message: str, *, retry_after: float) -> None:
        for request_id in list(self._waiting):
            self.refuse(request_id, InsufficientCapacity(message, retry_after=retry_after))

    def hand_over_all(self) -> None:
        """A new daemon took over: every waiter goes to it (``HandedOver``)."""
        for request_id in list(self._waiting):
            self.refuse(request_id, HandedOver("a new vramd serves", retry_after=0))


__all__ = ["Lease", "LeaseProvider", "Outcome", "ServedModel", "Waiter", "Waiters"]
