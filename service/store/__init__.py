"""vramd's SQLite store: typed models, ``open_store`` and keyword-only query functions.

Usage::

    store = open_store(settings.database)      # creates, migrates, checks it can write
    with store.session() as session:           # one transaction
        queries.record_event(session, ts=clock.now(), kind="load", message="...")
    with store.read() as session:              # never waits for the write lock
        queries.list_events(session, limit=10)
    writer = StoreWriter(store)                # the daemon's writes: a queue and a thread
    writer.start()
    writer.put(lambda session: queries.downsample(session, now=clock.now()))
    writer.close()
    store.close()

Schema changes go through Alembic revisions in the top-level ``migrations/`` directory.
"""

from __future__ import annotations

from service.store import queries
from service.store.engine import Store, migrations_dir, open_store
from service.store.models import (
    Base,
    DeviceSample,
    Event,
    Incident,
    InstanceRecord,
    InstanceSample,
    MaintenanceRun,
    MaintenanceWindow,
    PolicyVersion,
    ServiceRule,
    ServiceStats,
)
from service.store.writer import StoreWriter

__all__ = [
    "Base",
    "DeviceSample",
    "Event",
    "Incident",
    "InstanceRecord",
    "InstanceSample",
    "MaintenanceRun",
    "MaintenanceWindow",
    "PolicyVersion",
    "ServiceRule",
    "ServiceStats",
    "Store",
    "StoreWriter",
    "migrations_dir",
    "open_store",
    "queries",
]
