"""Usage per client and service: how every request ended, counted where it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.store import StoreWriter, queries

HOUR_S = 3600.0
OK = "ok"
# How often what changed is handed to the store writer (and once more at shutdown).
STORE_EVERY_S = 10.0


class Counters(Protocol):
    """The request and load counters the kernel keeps (``service.api.metrics.Metrics``)."""

    def request_done(self, service: str, code: str, queue_s: float | None = None) -> None: ...

    def load_done(self, service: str, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class AnswerUsage:
    """What a runtime's answer reported: tokens in and out, images made, audio seconds."""

    tokens_in: int = 0
    tokens_out: int = 0
    images: int = 0
    audio_s: float = 0.0


@dataclass(slots=True)
class Usage:
    """One client's use of one service over some time."""

    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # by code
    tokens_in: int = 0
    tokens_out: int = 0
    runtime_s: float = 0.0
    images: int = 0
    audio_s: float = 0.0

    def add(self, code: str, runtime_s: float, usage: AnswerUsage | None) -> None:
        self.requests += 1
        if code != OK:
            self.errors[code] = self.errors.get(code, 0) + 1
        self.runtime_s += runtime_s
        if usage is not None:
            self.tokens_in += usage.tokens_in
            self.tokens_out += usage.tokens_out
            self.images += usage.images
            self.audio_s += usage.audio_s

    def row(self) -> dict[str, Any]:
        """The figures as ``usage_hours`` stores them."""
        return {
            "requests": self.requests,
            "errors": dict(self.errors),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "runtime_s": self.runtime_s,
            "images": self.images,
            "audio_s": self.audio_s,
        }


# (hour start as Unix time, client, service)
HourKey = tuple[float, str, str]


class UsageBook:
    """Usage in memory: totals since start, and the hours' changes not yet stored."""

    def __init__(self, wall_clock: Callable[[], float]) -> None:
        self._now = wall_clock
        self.totals: dict[tuple[str, str], Usage] = {}  # (client, service)
        self._pending: dict[HourKey, Usage] = {}
        self._stored_at = -float("inf")

    def count(
        self,
        client: str,
        service: str,
        code: str,
        *,
        runtime_s: float = 0.0,
        usage: AnswerUsage | None = None,
    ) -> None:
        total = self.totals.get((client, service))
        if total is None:
            total = self.totals[client, service] = Usage()
        total.add(code, runtime_s, usage)
        key = (self._now() // HOUR_S * HOUR_S, client, service)
        hour = self._pending.get(key)
        if hour is None:
            hour = self._pending[key] = Usage()
        hour.add(code, runtime_s, usage)

    def of_clients(self, clients: Iterable[str]) -> dict[tuple[str, str], Usage]:
        """The totals since start of these clients only."""
        wanted = set(clients)
        return {key: use for key, use in self.totals.items() if key[0] in wanted}

    def take(self) -> dict[HourKey, Usage]:
        """The changes since the last take, per hour, client and service (for the store)."""
        pending, self._pending = self._pending, {}
        return pending

    def store(self, writer: StoreWriter, *, now: float | None = None) -> None:
        """Hand what changed to the store writer: at once, or (``now`` given, monotonic)
        when ``STORE_EVERY_S`` has passed since the last time."""
        if now is not None:
            if now - self._stored_at < STORE_EVERY_S:
                return
            self._stored_at = now
        rows = [
            {"hour": hour, "client": client, "service": service, **usage.row()}
            for (hour, client, service), usage in self.take().items()
        ]
        if rows:
            writer.put(lambda session: queries.add_usage(session, rows=rows))


class Accounts:
    """Where a request's end is counted: the metrics' counters and the usage book.

    ``Accounts.ended`` is called once per request, however it ended (answered, refused,
    timed out, its client gone): it counts the outcome in the daemon's metrics and in the
    ``UsageBook``, which keeps two things: totals since the daemon started, per client and
    service (the per-client series of ``/metrics``), and what changed per hour since the
    store last took it (``take``), for ``usage_hours`` in SQLite (docs/operations.md,
    "Usage per client").
    """

    def __init__(self, counters: Counters, usage: UsageBook) -> None:
        self.counters = counters
        self.usage = usage

    def ended(
        self,
        service: str,
        code: str,
        *,
        client: str,
        queue_s: float | None = None,
        runtime_s: float = 0.0,
        usage: AnswerUsage | None = None,
    ) -> None:
        self.counters.request_done(service, code, queue_s=queue_s)
        self.usage.count(client, service, code, runtime_s=runtime_s, usage=usage)


__all__ = ["Accounts", "AnswerUsage", "Counters", "HourKey", "Usage", "UsageBook"]
