"""The store's one writer: a queue and one thread, so SQLite stays off the event loop."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from contextlib import suppress
from typing import Generic, Literal, TypeVar

from sqlalchemy.orm import Session

from service.errors import StoreError
from service.store import queries
from service.store.engine import Store, is_busy

log = logging.getLogger("vramd.store")

T = TypeVar("T")
Write = Callable[[Session], object]
RowWrite = Callable[[Session, int], object]
CountedTable = Literal["events", "instances", "incidents", "maintenance_runs"]

BATCH_MAX = 500  # writes per transaction: a backlog drains in few commits
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
CLOSE_TIMEOUT_S = 30.0  # at shutdown, how long a locked database may hold the last writes


class _Stop:
    """The last item ``close`` puts: the thread commits what came before, then ends."""


_STOP = _Stop()


class _Answered(Generic[T]):
    """A write whose caller awaits its result: resolved once its transaction commits."""

    def __init__(self, write: Callable[[Session], T]) -> None:
        self._write = write
        self._result: T | None = None
        self.future: Future[T] = Future()

    def __call__(self, session: Session) -> None:
        self._result = self._write(session)

    def settle(self, error: Exception | None) -> None:
        with suppress(InvalidStateError):  # its caller was cancelled
            if error is None:
                self.future.set_result(self._result)  # type: ignore[arg-type]
            else:
                self.future.set_exception(error)


class StoreWriter:
    """Commits writes in its own thread, in the order they were put.

    A locked or slow database delays records, never requests, and loses none of them
    (docs/operations.md, "The database while serving"). Producers (the event loop, the
    watchdog's thread) put a write on a queue and go on at once; one thread drains the queue
    and commits what it finds in one transaction. The model is the standard library's
    ``QueueHandler`` / ``QueueListener``::

        writer = StoreWriter(store)
        writer.start()
        writer.put(lambda session: queries.add_device_samples(session, rows=rows))
        event_id = writer.put_row(
            "events", lambda s, row_id: queries.record_event(s, id=row_id, ...)
        )
        deleted = await writer.call(lambda s: queries.delete_api_window(s, name=name))
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

    A caller that needs an answer (whether a row was there to delete, a policy's version)
    ``await``s ``call``: the write goes through the same queue, and the caller's future is
    resolved once its batch has committed (or with the write's own exception).

    Row ids: the daemon is its database's only writer (``DatabaseLock``), so the ids of new
    events, instances, incidents and maintenance runs are counted here, from the largest
    found at startup, and a producer learns a row's id when it puts the row, without waiting
    for SQLite. Ids are counted and put under one lock, so rows are committed in the order
    of their ids (a reader paging events by id never skips one).
    """

    def __init__(self, store: Store, *, batch_max: int = BATCH_MAX, id_gap: int = 0) -> None:
        """``id_gap``: counted ids start this far past the last ones, where a daemon being
        replaced still writes rows beside this one (docs/operations.md, "Restarts and
        upgrades"): its rows keep the ids below, ours never collide with them."""
        self._store = store
        self._batch_max = batch_max
        self._queue: queue.SimpleQueue[Write | Future[None] | _Stop] = queue.SimpleQueue()
        # Guards the id counters, ``_closed`` and the order of puts (see the docstring).
        self._lock = threading.Lock()
        self._closed = False
        with store.read() as session:
            self._last_ids: dict[str, int] = {
                table: last + id_gap for table, last in queries.last_ids(session).items()
            }
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

    async def call(self, write: Callable[[Session], T]) -> T:
        """Queue a write whose result the caller needs, and await it; the loop goes on.

        Raises what the write raised (it is not retried alone and logged, as a ``put``
        is). On a locked database it waits, like every write, until the lock is gone.
        """
        answered = _Answered(write)
        with self._lock:
            closed = self._closed
            if not closed:
                self._queue.put(answered)
        if closed:
            self._write([answered], patient=False)
        return await asyncio.wrap_future(answered.future)

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
        if self._thread.ident is None:
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
        errors: list[Exception | None] = [error] * len(batch)
        if error is not None and len(batch) > 1:  # find the bad one(s); the rest commit
            errors = [self._commit([w], patient=patient) for w in batch]
        for write, error in zip(batch, errors, strict=True):
            if isinstance(write, _Answered):
                write.settle(error)  # its caller hears of its error
            elif error is not None:
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
