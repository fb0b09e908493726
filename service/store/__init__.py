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

engine.py           Store, open_store: the engine, migrations at startup, clear StoreErrors
lock.py             DatabaseLock: one daemon per database, by a flock beside the file
models.py           the SQLAlchemy models: rules, history and measurement tables
writer.py           StoreWriter: the one writer thread, so SQLite stays off the event loop
policy_records.py   persist_policy: a validated policy stored as a version, its rules as rows
queries.py          every query function in one namespace (from service.store import queries)
queries_policy.py   policy versions, the active service rules, maintenance windows
queries_history.py  instances, events, maintenance runs, incidents
queries_samples.py  device and instance memory samples, and their downsampling
queries_stats.py    learned figures and counters per service
queries_usage.py    usage per client and service, per hour
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
    UsageHour,
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
    "UsageHour",
    "migrations_dir",
    "open_store",
    "queries",
]
