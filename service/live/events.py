"""The event log: every decision and state change, persisted, logged and streamed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from service.clock import Clock
from service.contract import EventRecord
from service.domain import EventKind
from service.store import StoreWriter, queries

log = logging.getLogger("vramd.events")

SUBSCRIBER_QUEUE = 1000


class EventLog:
    """Every decision is explained: why this victim, why this refusal, what was measured.
    Each one becomes an ``events`` row in SQLite (served by
    ``GET /api/events``), a log line, and a message to live subscribers
    (``GET /api/events/stream``). The row goes through the store writer: recording never
    waits for SQLite, and the event's id is known at once (the writer counts ids), so the
    stream and the table agree. Subscribers get bounded queues: a slow reader loses its
    oldest events (and is told so) rather than growing the daemon's memory.
    """

    def __init__(self, writer: StoreWriter, clock: Clock) -> None:
        self._writer = writer
        self._clock = clock
        self._subscribers: set[asyncio.Queue[EventRecord]] = set()

    def record(
        self,
        kind: EventKind,
        message: str,
        *,
        service: str | None = None,
        instance_id: int | None = None,
        data: Mapping[str, object] | None = None,
    ) -> EventRecord:
        """Persist one event and hand it to every subscriber; returns it."""
        event = self._persist(kind, message, service=service, instance_id=instance_id, data=data)
        log.info("%s%s: %s", f"[{service}] " if service else "", kind, message)
        for queue in list(self._subscribers):
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(event)
        return event

    def persist(
        self, kind: EventKind, message: str, *, data: Mapping[str, object] | None = None
    ) -> int:
        """Only store an event (no log line, no subscribers); safe from any thread.

        For the watchdog's thread, which records a stall while the loop is blocked.
        Returns the event's id.
        """
        return self._persist(kind, message, data=data).id

    def _persist(
        self,
        kind: EventKind,
        message: str,
        *,
        service: str | None = None,
        instance_id: int | None = None,
        data: Mapping[str, object] | None = None,
    ) -> EventRecord:
        ts = self._clock.now()
        stored = dict(data or {})
        event_id = self._writer.put_row(
            "events",
            lambda session, row_id: queries.record_event(
                session,
                id=row_id,
                ts=ts,
                kind=kind,
                message=message,
                service=service,
                instance_id=instance_id,
                data=stored,
            ),
        )
        return EventRecord(
            id=event_id,
            ts=ts,
            kind=kind,
            service=service,
            instance_id=instance_id,
            message=message,
            data=stored,
        )

    def subscribe(self) -> asyncio.Queue[EventRecord]:
        queue: asyncio.Queue[EventRecord] = asyncio.Queue(maxsize=SUBSCRIBER_QUEUE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[EventRecord]) -> None:
        self._subscribers.discard(queue)
