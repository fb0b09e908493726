"""The event log: every decision and state change, persisted, logged and streamed.

DESIGN asks that every decision be explained: why this victim, why this refusal, what
was measured. Each one becomes an ``events`` row in SQLite (served by
``GET /api/events``), a log line, and a message to live subscribers
(``GET /api/events/stream``). Subscribers get bounded queues: a slow reader loses its
oldest events (and is told so) rather than growing the daemon's memory.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from service.clock import Clock
from service.errors import StoreError
from service.store import Store, queries

log = logging.getLogger("vramd.events")

SUBSCRIBER_QUEUE = 1000


class EventLog:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    def record(
        self,
        kind: str,
        message: str,
        *,
        service: str | None = None,
        instance_id: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Persist one event and hand it to every subscriber; returns it as a dict."""
        ts = self._clock.now()
        event: dict[str, Any] = {
            "id": None,
            "ts": ts,
            "kind": kind,
            "service": service,
            "instance_id": instance_id,
            "message": message,
            "data": data or {},
        }
        try:
            with self._store.session() as session:
                row = queries.record_event(
                    session,
                    ts=ts,
                    kind=kind,
                    message=message,
                    service=service,
                    instance_id=instance_id,
                    data=data or {},
                )
                event["id"] = row.id
        except StoreError as exc:
            # The decision stands even if the disk refuses the record; say so loudly.
            log.error("event not persisted (%s): %s", exc, message)
        log.info("%s%s: %s", f"[{service}] " if service else "", kind, message)
        for queue in list(self._subscribers):
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(event)
        return event

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=SUBSCRIBER_QUEUE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(queue)
