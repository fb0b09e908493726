"""Per-service learned figures and counters, kept across policy changes and restarts.

The learned peak and load time feed admission (docs/operations.md, "Estimates, caps and
learned peaks"); the counters and flags are what ``vramd ps`` and ``GET /api/services``
report.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import ServiceStats

COUNTERS = frozenset({"loads", "evictions", "restarts", "requests_served"})
UPDATABLE = frozenset(ServiceStats.__table__.columns.keys()) - {"service"}


def get_stats(session: Session, *, service: str) -> ServiceStats:
    """The service's stats row, created with zero counters if it has none yet."""
    stats = session.get(ServiceStats, service)
    if stats is None:
        stats = ServiceStats(
            service=service,
            learned_peak_bytes=None,
            learned_load_s=None,
            loads=0,
            evictions=0,
            restarts=0,
            requests_served=0,
            flags=[],
            last_error=None,
            updated_at=None,
        )
        session.add(stats)
        session.flush()
    return stats


def update_stats(session: Session, *, service: str, **fields: object) -> ServiceStats:
    """Set columns of the service's stats (e.g. ``learned_peak_bytes=..., flags=[...]``).

    Pass new values rather than mutating ``flags`` in place: a JSON column only notices
    assignment. Unknown field names raise ``ValueError``.
    """
    unknown = sorted(set(fields) - UPDATABLE)
    if unknown:
        raise ValueError(f"unknown service_stats fields: {', '.join(unknown)}")
    stats = get_stats(session, service=service)
    for name, value in fields.items():
        setattr(stats, name, value)
    session.flush()
    return stats


def bump_counter(session: Session, *, service: str, name: str, by: int = 1) -> int:
    """Add ``by`` to one counter (``loads``, ``evictions``, ``restarts``,
    ``requests_served``); returns the new value.

    The read and the write happen in the caller's transaction, which holds SQLite's write
    lock from its start (see ``engine``), so concurrent bumps cannot lose an update.
    """
    if name not in COUNTERS:
        raise ValueError(f"unknown counter {name!r}; expected one of {sorted(COUNTERS)}")
    stats = get_stats(session, service=service)
    value: int = getattr(stats, name) + by
    setattr(stats, name, value)
    session.flush()
    return value


def all_stats(session: Session) -> list[ServiceStats]:
    """Every service's stats, by name (including services no longer in the policy)."""
    return list(session.scalars(select(ServiceStats).order_by(ServiceStats.service)))
