"""Memory samples: bulk writes, reads for the memory views, and downsampling.

Retention (docs/api.md, ``GET /api/services/{name}/memory``): one row a second for the
last hour, one a minute for a week. ``downsample`` folds each whole minute of fine rows
into one coarse row holding the worst case of the minute (the peak of what was used, the
trough of what was free), since diagnosis asks "did it ever get that high", not "what was
the average".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Row, delete, insert, select
from sqlalchemy.orm import Session

from service.store.models import COARSE, FINE, DeviceSample, InstanceSample

MINUTE = 60.0


def add_device_samples(session: Session, *, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert device rows: ``ts``, ``device``, ``total_bytes``, ``used_bytes``,
    ``free_bytes``, ``foreign_bytes``, ``budget_bytes`` (``resolution`` defaults to fine).
    """
    if rows:
        session.execute(insert(DeviceSample), [{"resolution": FINE, **row} for row in rows])


def add_instance_samples(session: Session, *, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert instance rows: ``ts``, ``service``, ``instance_id``, ``device_bytes``,
    ``host_bytes``, ``in_flight``, ``requests_served``, optional ``kv_cache_bytes``
    (``resolution`` defaults to fine).
    """
    if rows:
        session.execute(
            insert(InstanceSample),
            [{"resolution": FINE, "kv_cache_bytes": None, **row} for row in rows],
        )


def instance_samples(
    session: Session, *, service: str, since_ts: float | None = None, limit: int = 3600
) -> list[InstanceSample]:
    """A service's samples (both resolutions) from ``since_ts`` on, oldest first.

    When more than ``limit`` match, the newest ``limit`` are returned: a memory view
    cut short should lose its oldest end, not its present.
    """
    stmt = select(InstanceSample).where(InstanceSample.service == service)
    if since_ts is not None:
        stmt = stmt.where(InstanceSample.ts >= since_ts)
    stmt = stmt.order_by(InstanceSample.ts.desc(), InstanceSample.id.desc()).limit(limit)
    rows = list(session.scalars(stmt))
    rows.reverse()
    return rows


def device_samples(
    session: Session, *, device: int | None = None, since_ts: float | None = None, limit: int = 3600
) -> list[DeviceSample]:
    """Device samples (of one device, if given) from ``since_ts`` on, oldest first; like
    ``instance_samples``, the newest ``limit`` when more match."""
    stmt = select(DeviceSample)
    if device is not None:
        stmt = stmt.where(DeviceSample.device == device)
    if since_ts is not None:
        stmt = stmt.where(DeviceSample.ts >= since_ts)
    stmt = stmt.order_by(DeviceSample.ts.desc(), DeviceSample.id.desc()).limit(limit)
    rows = list(session.scalars(stmt))
    rows.reverse()
    return rows


class DownsampleCounts(NamedTuple):
    fine_deleted: int
    coarse_written: int
    coarse_pruned: int


def downsample(
    session: Session,
    *,
    now: float,
    keep_fine_s: float = 3600,
    keep_coarse_s: float = 7 * 86400,
) -> DownsampleCounts:
    """Fold fine rows older than ``keep_fine_s`` into minute rows; drop minute rows older
    than ``keep_coarse_s``. ``now`` is passed in (no clock reads in the store).

    Only whole minutes are folded (the cut-off is rounded down to a minute), so a minute
    is never split across two runs into two coarse rows. Device rows are grouped per
    device, instance rows per (service, instance): a restart within a minute must not
    mix two processes' counters. Instance rows keep the peak of each byte figure and of
    ``in_flight``, and the last ``requests_served`` (a running total).
    """
    fine_cutoff = math.floor((now - keep_fine_s) / MINUTE) * MINUTE
    coarse_cutoff = now - keep_coarse_s
    device = _downsample_table(
        session, DeviceSample, ("device",), _fold_device, fine_cutoff, coarse_cutoff
    )
    instance = _downsample_table(
        session,
        InstanceSample,
        ("service", "instance_id"),
        _fold_instance,
        fine_cutoff,
        coarse_cutoff,
    )
    return DownsampleCounts(*(a + b for a, b in zip(device, instance, strict=True)))


# Folds a minute of fine rows (in time order) into one coarse row starting at the minute.
_Fold = Callable[[list[Row[Any]], float], dict[str, Any]]


def _downsample_table(
    session: Session,
    model: type[DeviceSample] | type[InstanceSample],
    key: tuple[str, ...],
    fold: _Fold,
    fine_cutoff: float,
    coarse_cutoff: float,
) -> DownsampleCounts:
    table = model.__table__
    old_fine = (table.c.resolution == FINE, table.c.ts < fine_cutoff)
    rows = session.execute(
        select(table).where(*old_fine).order_by(*(table.c[k] for k in key), table.c.ts)
    ).all()

    def group_of(row: Row[Any]) -> tuple[Any, ...]:
        return (*(row._mapping[k] for k in key), math.floor(row.ts / MINUTE) * MINUTE)

    folded = [
        fold(list(group), group_key[-1])
        for group_key, group in itertools.groupby(rows, key=group_of)
    ]
    if folded:
        session.execute(insert(model), folded)
    deleted = session.execute(delete(model).where(*old_fine))
    pruned = session.execute(
        delete(model).where(table.c.resolution == COARSE, table.c.ts < coarse_cutoff)
    )
    return DownsampleCounts(_rowcount(deleted), len(folded), _rowcount(pruned))


def _fold_device(rows: list[Row[Any]], minute: float) -> dict[str, Any]:
    return {
        "ts": minute,
        "device": rows[0].device,
        "total_bytes": max(r.total_bytes for r in rows),
        "used_bytes": max(r.used_bytes for r in rows),
        "free_bytes": min(r.free_bytes for r in rows),
        "foreign_bytes": max(r.foreign_bytes for r in rows),
        "budget_bytes": min(r.budget_bytes for r in rows),
        "resolution": COARSE,
    }


def _fold_instance(rows: list[Row[Any]], minute: float) -> dict[str, Any]:
    kv_cache = [r.kv_cache_bytes for r in rows if r.kv_cache_bytes is not None]
    return {
        "ts": minute,
        "service": rows[0].service,
        "instance_id": rows[0].instance_id,
        "device_bytes": max(r.device_bytes for r in rows),
        "host_bytes": max(r.host_bytes for r in rows),
        "kv_cache_bytes": max(kv_cache) if kv_cache else None,
        "in_flight": max(r.in_flight for r in rows),
        "requests_served": rows[-1].requests_served,
        "resolution": COARSE,
    }


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)
