"""The store writer against a real SQLite file, and a second connection holding its lock.

The lock is real: a plain ``sqlite3`` connection in ``BEGIN EXCLUSIVE``, which refuses
every other writer (the writer's store waits 50 ms for it, then retries on its own).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from service.store import Store, StoreWriter, open_store, queries
from service.store.writer import RowWrite


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(tmp_path / "vramd.db", busy_timeout_ms=50)
    yield store
    store.close()


@pytest.fixture
def writer(store: Store) -> Iterator[StoreWriter]:
    writer = StoreWriter(store)
    writer.start()
    yield writer
    writer.close()


@contextmanager
def locked(store: Store) -> Iterator[None]:
    """A second connection holds the write lock of ``store`` for the block."""
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
        conn.rollback()
    finally:
        conn.close()


def event(n: int) -> RowWrite:
    def write(session: Session, row_id: int) -> None:
        queries.record_event(session, id=row_id, ts=float(n), kind="test", message=f"e{n}")

    return write


def stored(store: Store) -> list[str]:
    """The messages of the committed events, in id order (read by a third connection)."""
    conn = sqlite3.connect(store.path)
    try:
        return [row[0] for row in conn.execute("select message from events order by id")]
    finally:
        conn.close()


def test_writes_put_together_are_committed_in_one_transaction(store: Store) -> None:
    writer = StoreWriter(store)
    for n in range(200):
        writer.put_row("events", event(n))
    writer.start()  # the thread finds all 200 queued
    try:
        assert writer.flush(10)
        assert stored(store) == [f"e{n}" for n in range(200)]
        assert writer.committed_batches == 1
    finally:
        writer.close()


def test_a_batch_has_at_most_batch_max_writes(store: Store) -> None:
    writer = StoreWriter(store, batch_max=50)
    for n in range(200):
        writer.put_row("events", event(n))
    writer.start()
    writer.close()
    assert len(stored(store)) == 200
    assert writer.committed_batches == 4


def test_a_locked_database_delays_writes_and_loses_none(
    store: Store, writer: StoreWriter, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="vramd.store"):
        with locked(store):
            for n in range(100):
                writer.put_row("events", event(n))
            # The writer waits out its busy timeout (50 ms), again and again.
            assert writer.flush(0.5) is False
            assert stored(store) == []
        assert writer.flush(10) is True
    assert stored(store) == [f"e{n}" for n in range(100)]
    assert "is locked by another process" in caplog.text
    assert "writable again" in caplog.text


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_a_producer_never_waits_for_a_locked_database(store: Store, writer: StoreWriter) -> None:
    with locked(store):
        started = time.monotonic()
        for n in range(2000):
            writer.put_row("events", event(n))
        took = time.monotonic() - started
    assert took < 0.5, f"2000 puts took {took:.2f}s"
    writer.flush(10)
    assert len(stored(store)) == 2000


def test_put_row_ids_are_known_at_once_and_are_the_rows_ids(
    store: Store, writer: StoreWriter
) -> None:
    ids = [writer.put_row("events", event(n)) for n in range(3)]
    assert ids == [1, 2, 3]
    writer.flush(10)
    with store.read() as session:
        assert [e.id for e in queries.list_events(session)] == ids


def test_ids_continue_after_the_largest_ever_used(store: Store) -> None:
    with store.session() as session:
        for n in range(5):
            queries.record_event(session, ts=float(n), kind="old", message="m")
        queries.prune_events(session, before_ts=10.0)  # all gone; the ids stay used
        queries.record_instance_spawn(
            session,
            id=41,
            service="chat",
            pid=1,
            pgid=1,
            proc_start_time=0.0,
            port=1,
            device=0,
            started_at=0.0,
        )
    writer = StoreWriter(store)
    assert writer.put_row("events", event(0)) == 6
    assert writer.put_row("instances", lambda s, i: None) == 42
    writer.close()


async def test_flushed_waits_without_blocking_the_loop(store: Store, writer: StoreWriter) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        with locked(store):
            writer.put_row("events", event(1))
            assert await writer.flushed(0.5) is False
        assert ticks >= 10, "the loop ran while the flush waited"
        assert await writer.flushed(10) is True
        assert stored(store) == ["e1"]
    finally:
        ticker.cancel()


def test_flush_covers_what_was_put_before_it(store: Store, writer: StoreWriter) -> None:
    for n in range(50):
        writer.put_row("events", event(n))
        if n % 10 == 0:
            assert writer.flush(10)
            assert len(stored(store)) == n + 1


def test_close_waits_out_a_lock_and_commits_everything_queued(store: Store) -> None:
    writer = StoreWriter(store)
    writer.start()
    conn = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN EXCLUSIVE")

    def release() -> None:
        conn.rollback()
        conn.close()

    for n in range(300):
        writer.put_row("events", event(n))
    releaser = threading.Timer(0.5, release)
    releaser.start()
    started = time.monotonic()
    writer.close()  # while still locked
    assert time.monotonic() - started >= 0.4
    releaser.join()
    assert len(stored(store)) == 300
    writer.put_row("events", event(300))  # after close: written at once, not queued
    assert len(stored(store)) == 301


def test_a_failing_write_is_logged_and_the_others_are_kept(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(session: Session) -> None:
        queries.record_instance_exit(
            session, instance_id=999, stopped_at=0.0, exit_code=None, reason="no such"
        )

    writer = StoreWriter(store)
    writer.put_row("events", event(1))
    writer.put(broken)
    writer.put_row("events", event(2))
    with caplog.at_level(logging.ERROR, logger="vramd.store"):
        writer.start()  # all three in one batch, which the broken write fails
        writer.close()
    assert stored(store) == ["e1", "e2"]
    assert "a record was not stored: no instance record 999" in caplog.text
    assert "LookupError" in caplog.text  # a bug: logged with its traceback


@pytest.mark.timing  # asserts on wall-clock time: run alone (make test)
def test_reads_do_not_wait_for_a_lock(store: Store, writer: StoreWriter) -> None:
    writer.put_row("events", event(1))
    writer.flush(10)
    with locked(store):
        started = time.monotonic()
        with store.read() as session:
            assert [e.message for e in queries.list_events(session)] == ["e1"]
        assert time.monotonic() - started < 0.05  # not even the busy timeout
