"""The store's one writer: a queue and one thread, so SQLite stays off the event loop.

A locked or slow database delays records, never requests, and loses none of them
(docs/operations.md, "The database while serving"). Producers (the event loop, the
watchdog's thread) put a write on a queue and go on at once; one thread drains the queue
and commits what it finds in one transaction. The model is the standard library's
``QueueHandler`` / ``QueueListener``::

    writer = StoreWriter(store)
    writer.start()
    writer.put(lambda session: queries.add_device_samples(session, rows=rows))
    event_id = writer.put_row("events", lambda s, row_id: queries.record_event(s, id=row_id, ...))
    await writer.flushed(timeout=2.0)    # what was put before this is committed
    writer.close()                       # flush and join on shutdown: nothing queued is lost

A write is a function of a session (the transaction it runs in, with the batch's other
writes). Failures:

- The database is locked ("database is locked": another process holds the write lock,
  which SQLite's busy timeout already waited for): the same batch is tried again after a
  pause that doubles up to ``MAX_BACKOFF_S``, for as long as it takes. Nothing is dropped,
  and the loop never notices.
- Anything else (a full or read-only disk, a bug in a write): the batch is tried one
  write at a time, so one bad write cannot take the others with it; a write that fails
  alone is logged and dropped, as a refused record was before this writer existed.

Row ids: the daemon is its database's only writer (``DatabaseLock``), so the ids of new
events and instances are counted here, from the largest found at startup, and a producer
learns a row's id when it puts the row, without waiting for SQLite. Ids are counted and
put under one lock, so rows are committed in the order of their ids (a reader paging
events by id never skips one).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from contextlib import suppress
from typing import Literal

from sqlalchemy.orm import Session

from service.errors import StoreError
from service.store import queries
from service.store.engine import Store, is_busy

log = logging.getLogger("vramd.store")

Write = Callable[[Session], object]
RowWrite = Callable[[Session, int], object]
CountedTable = Literal["events", "instances"]

BATCH_MAX = 500  # writes per transaction: a backlog drains in few commits
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
CLOSE_TIMEOUT_S = 30.0  # at shutdown, how long a locked database may hold the last writes


class _Stop:
    """The last item ``close`` puts: the thread commits what came before, then ends."""


_STOP = _Stop()


class StoreWriter:
    """Commits writes in its own thread, in the order they were put."""

    def __init__(self, store: Store, *, batch_max: int = BATCH_MAX) -> None:
        self._store = store
        self._batch_max = batch_max
        self._queue: queue.SimpleQueue[Write | Future[None] | _Stop] = queue.SimpleQueue()
        # Guards the id counters, ``_closed`` and the order of puts (see the docstring).
        self._lock = threading.Lock()
        self._closed = False
        with store.read() as session:
            self._last_ids: dict[str, int] = queries.last_ids(session)
        self._thread = threading.Thread(target=self._run, name="vramd-store-writer", daemon=True)
        self.committed_batches = 0  # for tests and the curious: transactions committed

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------ producers

    def put(self, write: Write) -> None:
        """Queue one write; returns at once.

        After ``close`` (a record made during shutdown) it is written here instead, with
        one try: nothing is left to drain a queue.
        """
        with self._lock:
            if not self._closed:
                self._queue.put(write)
                return
        self._write([write], patient=False)

    def put_row(self, table: CountedTable, write: RowWrite) -> int:
        """Queue the write of a new row of ``table``; returns the id it is written with."""
        with self._lock:
            self._last_ids[table] += 1
            row_id = self._last_ids[table]
            closed = self._closed
            if not closed:
                self._queue.put(lambda session: write(session, row_id))
        if closed:
            self._write([lambda session: write(session, row_id)], patient=False)
        return row_id

    # ------------------------------------------------------------------ flushing

    def flush(self, timeout: float) -> bool:
        """Wait (blocking) until every write put before this call is committed.

        Returns False if that took longer than ``timeout`` (the database is locked): the
        writes are still queued and will be committed. Not for the event loop: there,
        ``await flushed(timeout)``.
        """
        marker = self._marker()
        if marker is None:
            return True
        try:
            marker.result(timeout)
        except TimeoutError:
            return False
        return True

    async def flushed(self, timeout: float) -> bool:
        """``flush`` for async code: the loop goes on serving while it waits."""
        marker = self._marker()
        if marker is None:
            return True
        try:
            await asyncio.wait_for(asyncio.wrap_future(marker), timeout)
        except TimeoutError:
            return False
        return True

    def _marker(self) -> Future[None] | None:
        marker: Future[None] = Future()
        with self._lock:
            if self._closed:
                return None  # a closed writer writes in the caller: nothing is queued
            self._queue.put(marker)
        return marker

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Commit everything queued, then stop the thread; later puts write at once.

        If the database stays locked past ``timeout``, what is still queued is logged as
        lost rather than holding the daemon's shutdown forever.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        if not self._thread.is_alive():
            self._run()  # never started: write what was put, here
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error(
                "database %s stayed locked for %.0fs at shutdown: about %d queued writes "
                "were not stored",
                self._store.path,
                timeout,
                self._queue.qsize(),
            )

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while True:
            batch: list[Write] = []
            markers: list[Future[None]] = []
            stop = False
            item = self._queue.get()
            while True:
                if isinstance(item, _Stop):
                    stop = True
                elif isinstance(item, Future):
                    markers.append(item)
                else:
                    batch.append(item)
                if stop or len(batch) >= self._batch_max:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._write(batch)
            for marker in markers:
                with suppress(InvalidStateError):  # its waiter gave up (timed out)
                    marker.set_result(None)
            if stop:
                return

    def _write(self, batch: list[Write], *, patient: bool = True) -> None:
        error = self._commit(batch, patient=patient)
        if error is None:
            return
        failed = [error]
        if len(batch) > 1:  # find the bad one(s); the rest are committed
            failed = [e for w in batch if (e := self._commit([w], patient=patient)) is not None]
        for error in failed:
            # A database problem is explained by its message; anything else is a bug.
            trace = None if isinstance(error, StoreError) else error
            log.error("a record was not stored: %s", error, exc_info=trace)

    def _commit(self, batch: list[Write], *, patient: bool) -> Exception | None:
        """Commit ``batch`` in one transaction; the error if it failed.

        ``patient``: on a locked database, wait and try again until it is not.
        """
        backoff = FIRST_BACKOFF_S
        locked_since: float | None = None
        while True:
            try:
                with self._store.session() as session:
                    for write in batch:
                        write(session)
            except Exception as exc:
                if not (patient and is_busy(exc)):
                    return exc
                if locked_since is None:
                    locked_since = time.monotonic()
                    log.warning(
                        "database %s is locked by another process: %d writes wait (retrying)",
                        self._store.path,
                        len(batch) + self._queue.qsize(),
                    )
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self.committed_batches += 1
            if locked_since is not None:
                log.info(
                    "database %s writable again after %.1fs; the waiting writes are stored",
                    self._store.path,
                    time.monotonic() - locked_since,
                )
            return None
