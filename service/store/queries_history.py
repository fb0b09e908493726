"""What happened: instances started and stopped, events, maintenance runs, incidents.

These rows are append-mostly history. They name services by string rather than by a
foreign key so that they outlive the rule of a service a later policy removed.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from service.store.models import Event, Incident, InstanceRecord, MaintenanceRun

# --------------------------------------------------------------------------- instances


def record_instance_spawn(
    session: Session,
    *,
    id: int | None = None,
    service: str,
    pid: int,
    pgid: int,
    proc_start_time: float,
    port: int,
    device: int | None,
    started_at: float,
    identity: str | None = None,
    argv: list[str] | None = None,
    devices: list[int] | None = None,
    output: str | None = None,
    vramd_version: str | None = None,
) -> int:
    """Record a process the moment it is spawned; returns the instance id.

    Written before the runtime is ready so that a daemon crash during a slow load still
    leaves enough (pid, start time) for the next daemon to reap it, and enough
    (``identity``, ``argv``, ``devices``, ``output``) for it to adopt the runtime instead.
    ``id`` is the one the store writer counted (see ``last_ids``); without it SQLite
    picks the next.
    """
    record = InstanceRecord(
        id=id,
        service=service,
        pid=pid,
        pgid=pgid,
        proc_start_time=proc_start_time,
        port=port,
        device=device,
        started_at=started_at,
        reaped=False,
        identity=identity,
        argv=argv,
        devices=devices,
        output=output,
        vramd_version=vramd_version,
    )
    session.add(record)
    session.flush()
    return record.id


def record_instance_ready(session: Session, *, instance_id: int, ready_at: float) -> None:
    _instance(session, instance_id).ready_at = ready_at
    session.flush()


def record_instance_adopted(session: Session, *, instance_id: int, adopted_at: float) -> None:
    """A daemon adopted the instance a previous one started (its row goes on)."""
    _instance(session, instance_id).adopted_at = adopted_at
    session.flush()


def record_instance_asleep(session: Session, *, instance_id: int, asleep: bool) -> None:
    """Put to sleep or woken: a sleeper left behind by a daemon is not adopted."""
    _instance(session, instance_id).asleep = asleep
    session.flush()


def record_instance_exit(
    session: Session,
    *,
    instance_id: int,
    stopped_at: float,
    exit_code: int | None,
    reason: str,
    peak_bytes: int | None = None,
    reaped: bool = False,
) -> None:
    """Close an instance's record. ``reaped`` marks one a previous daemon left running."""
    record = _instance(session, instance_id)
    record.stopped_at = stopped_at
    record.exit_code = exit_code
    record.reason = reason
    record.reaped = reaped
    if peak_bytes is not None:
        record.peak_bytes = peak_bytes
    session.flush()


def live_instances(session: Session) -> list[InstanceRecord]:
    """Instances with no recorded stop: at startup, the candidates for reaping."""
    stmt = (
        select(InstanceRecord)
        .where(InstanceRecord.stopped_at.is_(None))
        .order_by(InstanceRecord.id)
    )
    return list(session.scalars(stmt))


def list_instances(
    session: Session, *, service: str | None = None, limit: int = 50
) -> list[InstanceRecord]:
    """Recent instances (of one service, if given), newest first."""
    stmt = select(InstanceRecord).order_by(InstanceRecord.id.desc()).limit(limit)
    if service is not None:
        stmt = stmt.where(InstanceRecord.service == service)
    return list(session.scalars(stmt))


def recent_peaks(session: Session, *, per_service: int) -> dict[str, list[int | None]]:
    """The peaks of each service's last ``per_service`` instances, newest first (None
    where an instance left no peak): what the learned peak is taken from."""
    newest = func.row_number().over(
        partition_by=InstanceRecord.service, order_by=InstanceRecord.id.desc()
    )
    ranked = select(
        InstanceRecord.service, InstanceRecord.peak_bytes, newest.label("rank")
    ).subquery()
    stmt = (
        select(ranked.c.service, ranked.c.peak_bytes)
        .where(ranked.c.rank <= per_service)
        .order_by(ranked.c.service, ranked.c.rank)
    )
    peaks: dict[str, list[int | None]] = {}
    for service, peak in session.execute(stmt):
        peaks.setdefault(service, []).append(peak or None)
    return peaks


def last_ids(session: Session) -> dict[str, int]:
    """The largest id used so far in the tables whose ids the writer counts (0 for none).

    The daemon is the database's only writer (``DatabaseLock``), so it counts the ids of
    new rows itself from these and a producer knows a row's id before it is written.
    ``events`` is AUTOINCREMENT: an id of a pruned event is never given out again.
    """
    found = {
        "events": session.scalar(select(func.max(Event.id))) or 0,
        "instances": session.scalar(select(func.max(InstanceRecord.id))) or 0,
        "incidents": session.scalar(select(func.max(Incident.id))) or 0,
        "maintenance_runs": session.scalar(select(func.max(MaintenanceRun.id))) or 0,
    }
    sequence = session.execute(
        text("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
    ).scalar()
    found["events"] = max(found["events"], int(sequence or 0))
    return found


def _instance(session: Session, instance_id: int) -> InstanceRecord:
    record = session.get(InstanceRecord, instance_id)
    if record is None:
        raise LookupError(f"no instance record {instance_id}")
    return record


# --------------------------------------------------------------------------- events


def record_event(
    session: Session,
    *,
    id: int | None = None,
    ts: float,
    kind: str,
    message: str,
    service: str | None = None,
    instance_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    event = Event(
        id=id,
        ts=ts,
        kind=kind,
        message=message,
        service=service,
        instance_id=instance_id,
        data=data if data is not None else {},
    )
    session.add(event)
    session.flush()
    return event


def list_events(
    session: Session,
    *,
    since_id: int | None = None,
    since_ts: float | None = None,
    service: str | None = None,
    kind: str | None = None,
    limit: int = 500,
) -> list[Event]:
    """Events matching the filters, oldest first.

    With ``since_id`` (exclusive) this pages forward from a cursor: the first ``limit``
    newer events, so a stream reader never skips any. Without it, the newest ``limit``
    matching events are returned (still oldest first), which is what a "recent events"
    view wants. ``since_ts`` is inclusive.
    """
    stmt = select(Event)
    if since_id is not None:
        stmt = stmt.where(Event.id > since_id)
    if since_ts is not None:
        stmt = stmt.where(Event.ts >= since_ts)
    if service is not None:
        stmt = stmt.where(Event.service == service)
    if kind is not None:
        stmt = stmt.where(Event.kind == kind)
    if since_id is not None:
        return list(session.scalars(stmt.order_by(Event.id).limit(limit)))
    newest = list(session.scalars(stmt.order_by(Event.id.desc()).limit(limit)))
    newest.reverse()
    return newest


def prune_events(session: Session, *, before_ts: float) -> int:
    """Delete events older than ``before_ts``; returns how many went."""
    result = session.execute(delete(Event).where(Event.ts < before_ts))
    return int(getattr(result, "rowcount", 0))


# --------------------------------------------------------------------------- maintenance runs


def record_maintenance_run(
    session: Session, *, window: str, trigger: str, started_at: float, id: int | None = None
) -> int:
    """Record that a window opened (``trigger``: "schedule" or "manual"); returns its id
    (``id``: the one the store writer counted for it)."""
    run = MaintenanceRun(id=id, window=window, trigger=trigger, started_at=started_at, actions=[])
    session.add(run)
    session.flush()
    return run.id


def finish_maintenance_run(
    session: Session, *, run_id: int, ended_at: float, actions: list[Any]
) -> None:
    """Close a run with what it did (e.g. ``[{"service": "chat", "action": "restart"}]``)."""
    run = session.get(MaintenanceRun, run_id)
    if run is None:
        raise LookupError(f"no maintenance run {run_id}")
    run.ended_at = ended_at
    run.actions = list(actions)
    session.flush()


def list_maintenance_runs(
    session: Session, *, window: str | None = None, limit: int = 50
) -> list[MaintenanceRun]:
    """Recent runs (of one window, if given), newest first."""
    stmt = select(MaintenanceRun).order_by(MaintenanceRun.id.desc()).limit(limit)
    if window is not None:
        stmt = stmt.where(MaintenanceRun.window == window)
    return list(session.scalars(stmt))


# --------------------------------------------------------------------------- incidents


def record_incident(
    session: Session,
    *,
    ts: float,
    service: str,
    kind: str,
    summary: str,
    data: dict[str, Any],
    verdict: str | None = None,
    id: int | None = None,
) -> int:
    """Record an out-of-memory failure (``kind``: "load" or "request"); returns its id
    (``id``: the one the store writer counted for it).

    ``data`` carries the evidence docs/operations.md lists ("Fragmentation versus
    capacity"): device figures, each instance's footprint, the largest recent request and
    the events before the failure.
    """
    incident = Incident(
        id=id, ts=ts, service=service, kind=kind, summary=summary, data=data, verdict=verdict
    )
    session.add(incident)
    session.flush()
    return incident.id


def list_incidents(session: Session, *, limit: int = 100) -> list[Incident]:
    """Recent incidents, newest first."""
    stmt = select(Incident).order_by(Incident.id.desc()).limit(limit)
    return list(session.scalars(stmt))


def get_incident(session: Session, *, id: int) -> Incident | None:
    return session.get(Incident, id)


def set_incident_verdict(session: Session, *, id: int, verdict: str) -> None:
    """Fill in the diagnosis once known (the retry after evicting everything decides it)."""
    incident = session.get(Incident, id)
    if incident is None:
        raise LookupError(f"no incident {id}")
    incident.verdict = verdict
    session.flush()
