"""vramd's SQLite store: typed models, ``open_store`` and keyword-only query functions.

Usage::

    store = open_store(settings.database)      # creates, migrates, checks it can write
    with store.session() as session:           # one transaction
        queries.record_event(session, ts=clock.now(), kind="load", message="...")
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
    "migrations_dir",
    "open_store",
    "queries",
]
