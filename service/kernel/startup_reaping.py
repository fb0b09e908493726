"""Startup reaping: processes a previous vramd left running, found by their SQLite rows.

Every spawn is recorded (pid, process group, start time) before its health wait, so a
daemon that died without stopping its runtimes leaves rows without an exit. The next
daemon kills those groups -- only where pid *and* start time still match, so a reused
pid is never touched (``supervisor.reap_orphans``) -- closes the rows, and says so.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.orm import Session

from service.clock import Clock
from service.live.events import EventLog
from service.store import Store, StoreWriter, queries
from service.supervisor import OrphanRecord, ReapOutcome, reap_orphans


async def reap_previous_daemon(
    *, store: Store, writer: StoreWriter, events: EventLog, clock: Clock
) -> None:
    with store.read() as session:
        records = [
            (row.id, row.service, OrphanRecord(row.pid, row.pgid, row.proc_start_time))
            for row in queries.live_instances(session)
        ]
    if not records:
        return
    results = await asyncio.to_thread(reap_orphans, [r for _, _, r in records])
    now = clock.now()

    def write(session: Session) -> None:
        for (instance_id, _, _), result in zip(records, results, strict=True):
            reaped = result.outcome is ReapOutcome.REAPED
            queries.record_instance_exit(
                session,
                instance_id=instance_id,
                stopped_at=now,
                exit_code=None,
                reason="reaped at startup" if reaped else "gone before startup",
                reaped=reaped,
            )

    writer.put(write)
    for (instance_id, service, record), result in zip(records, results, strict=True):
        if result.outcome is ReapOutcome.REAPED:
            events.record(
                "reap",
                f"killed pid {record.pid} of {service}, left running by a previous vramd",
                service=service,
                instance_id=instance_id,
                data={"pid": record.pid, "pgid": record.pgid},
            )
