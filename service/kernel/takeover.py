"""Taking over from a previous daemon: adopt the runtimes it left that still fit, reap the rest."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
from sqlalchemy.orm import Session

from service import __version__
from service.clock import Clock
from service.domain import EventKind
from service.live.events import EventLog
from service.live.runtimes import RuntimeTable, ServiceRuntime
from service.policy import expand_placeholders, process_identity
from service.store import Store, StoreWriter, queries
from service.store.models import InstanceRecord
from service.supervisor import (
    AdoptedProcess,
    LaunchSpec,
    OrphanRecord,
    OutputFiles,
    OutputFollower,
    ReapOutcome,
    RuntimeProcess,
    not_the_same_process,
    reap_orphans,
)
from service.supervisor.launch import health_path

log = logging.getLogger("vramd.takeover")

HEALTH_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Left:
    """One runtime a previous daemon left, as its row says."""

    instance_id: int
    service: str
    pid: int
    pgid: int
    proc_start_time: float
    port: int
    identity: str | None
    argv: tuple[str, ...]
    devices: tuple[int, ...]
    output: str | None
    asleep: bool

    @classmethod
    def of(cls, row: InstanceRecord) -> Left:
        devices = row.devices if row.devices is not None else [row.device or 0]
        return cls(
            row.id, row.service, row.pid, row.pgid, row.proc_start_time, row.port,
            row.identity, tuple(row.argv or ()), tuple(devices), row.output, bool(row.asleep),
        )  # fmt: skip


# Makes an adopted process the service's instance: (runtime, process, its launch, its
# instance id, its devices). The kernel's effects own those fields (``effects.adopt``).
Adopt = Callable[[ServiceRuntime, AdoptedProcess, LaunchSpec, int, tuple[int, ...]], None]


@dataclass(frozen=True, slots=True)
class Adoption:
    """What the takeover did with each runtime left behind."""

    adopted: tuple[str, ...] = ()
    reaped: tuple[str, ...] = ()


def record_spawn(
    writer: StoreWriter,
    rt: ServiceRuntime,
    proc: RuntimeProcess,
    argv: list[str],
    port: int,
    devices: tuple[int, ...],
    started_at: float,
) -> int:
    """Record a process the moment it is spawned, with all a later daemon needs to reap
    or adopt it; returns its instance id."""
    identity = process_identity(rt.spec)
    output = str(proc.output.base) if proc.output is not None else None
    return writer.put_row(
        "instances",
        lambda session, row_id: queries.record_instance_spawn(
            session, id=row_id, service=rt.name, pid=proc.pid, pgid=proc.pgid,
            proc_start_time=proc.proc_start_time, port=port,
            device=devices[0] if devices else None, started_at=started_at,
            identity=identity, argv=argv, devices=list(devices), output=output,
            vramd_version=__version__,
        ),
    )  # fmt: skip


def record_sleep(writer: StoreWriter, rt: ServiceRuntime, *, asleep: bool) -> None:
    """A sleeper is not adopted (its weights are in host memory): say which ones sleep."""
    if rt.placement.instance_id is not None:
        writer.put(
            partial(
                queries.record_instance_asleep, instance_id=rt.placement.instance_id, asleep=asleep
            )
        )


async def take_over_previous_daemon(
    *,
    store: Store,
    writer: StoreWriter,
    events: EventLog,
    clock: Clock,
    runtimes: RuntimeTable,
    http: httpx.AsyncClient,
    adopt: Adopt,
) -> Adoption:
    """Adopt what fits (``adopt``: the effects make the process the service's instance,
    READY at once), reap the rest; returns the services of each.

    Every spawn is recorded (pid, process group, start time, port, the service's process
    identity, argv, devices, output files) before its health wait, so a daemon that ended
    without stopping its runtimes -- a crash, ``--keep-runtimes``, a ``--replace`` hand-over
    -- leaves rows without an exit. The next daemon looks at each one before anything
    starts (docs/operations.md, "Restarts and upgrades"). It adopts the runtime when all of
    these hold, checked on the live process, never on the row alone:

    - its service is still in the policy, with the same process identity
      (``policy.process_identity``: command, env, cwd, health, devices...);
    - it was not asleep, and no other runtime of the service was adopted already;
    - the pid is alive and has the recorded kernel start time (a reused pid has another);
    - it answers its adapter's health check now.

    An adopted runtime is READY at once, with no load; from then on it is supervised like
    any (``supervisor.AdoptedProcess``). Every other one is reaped, as before, only where pid
    *and* start time still match (``supervisor.reap_orphans``), with an event saying why it
    was not adopted.
    """
    with store.read() as session:
        left = [Left.of(row) for row in queries.live_instances(session)]
    if not left:
        return Adoption()
    taken: set[str] = set()
    refused: list[tuple[Left, str]] = []
    adopted: list[str] = []
    for record in left:
        why = await _why_not(record, runtimes, taken, http)
        if why:
            refused.append((record, why))
            continue
        rt = runtimes[record.service]
        if not _adopt(rt, record, clock, adopt):
            refused.append((record, "it exited while being adopted"))
            continue
        taken.add(record.service)
        adopted.append(record.service)
        writer.put(
            partial(
                queries.record_instance_adopted,
                instance_id=record.instance_id,
                adopted_at=clock.now(),
            )
        )
        events.record(
            EventKind.ADOPTED,
            f"adopted pid {record.pid} of {record.service} (port {record.port}), left running "
            "by a previous vramd: ready with no load",
            service=record.service,
            instance_id=record.instance_id,
            data={"pid": record.pid, "port": record.port, "devices": list(record.devices)},
        )
    if refused:
        await _reap(refused, writer, events, clock)
    return Adoption(tuple(adopted), tuple(r.service for r, _ in refused))


async def _why_not(
    record: Left, runtimes: RuntimeTable, taken: set[str], http: httpx.AsyncClient
) -> str:
    """Why ``record``'s runtime cannot be adopted; empty if it can."""
    rt = runtimes.get(record.service)
    if rt is None:
        return f"its service {record.service} is no longer in the policy"
    if record.identity is None:
        return "it was started by a vramd that recorded no process identity (before 0.3)"
    if record.identity != process_identity(rt.spec):
        return "its service's command, environment or devices changed since it started"
    if record.asleep:
        return "it was asleep (its weights in host memory); it loads afresh"
    if record.service in taken:
        return f"another runtime of {record.service} was adopted"
    alive = await asyncio.to_thread(_same_process, record)
    if alive:
        return alive
    answer = await _health(rt, record, http)
    if answer:
        return f"it does not answer its health check ({answer})"
    return ""


def _same_process(record: Left) -> str:
    return not_the_same_process(record.pid, record.proc_start_time)


def _health_url(rt: ServiceRuntime, port: int) -> str:
    return (
        f"http://127.0.0.1:{port}{expand_placeholders(health_path(rt.spec), {'PORT': str(port)})}"
    )


async def _health(rt: ServiceRuntime, record: Left, http: httpx.AsyncClient) -> str:
    """Empty if the runtime's health answers ready now; else what it said."""
    try:
        response = await http.get(
            _health_url(rt, record.port),
            headers={"Connection": "close"},
            timeout=HEALTH_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if rt.adapter.health_ok(response.status_code, response.content):
        return ""
    return f"HTTP {response.status_code}"


def _adopt(rt: ServiceRuntime, record: Left, clock: Clock, adopt: Adopt) -> bool:
    """Make ``record``'s process the service's instance; False if it is already gone."""
    follower = None
    if record.output is not None:
        files = OutputFiles(Path(record.output))
        try:
            follower = OutputFollower(files, rt.log, clock.now, from_end=True)
        except OSError as exc:
            log.warning("cannot follow the output of %s: %s", record.service, exc)
    proc = AdoptedProcess(pid=record.pid, start_time=record.proc_start_time, follower=follower)
    if _same_process(record):  # checked again now that its pidfd is held
        proc.detach()
        return False
    spec = LaunchSpec(
        argv=record.argv,
        env={},
        cwd=rt.spec.cwd,
        port=record.port,
        health_url=_health_url(rt, record.port),
        startup_timeout_s=rt.spec.startup_timeout,
        health_ok=rt.adapter.health_ok,
    )
    adopt(rt, proc, spec, record.instance_id, record.devices)
    return True


async def _reap(
    refused: list[tuple[Left, str]], writer: StoreWriter, events: EventLog, clock: Clock
) -> None:
    records = [OrphanRecord(r.pid, r.pgid, r.proc_start_time) for r, _ in refused]
    results = await asyncio.to_thread(reap_orphans, records)
    now = clock.now()

    def write(session: Session) -> None:
        for (record, why), result in zip(refused, results, strict=True):
            reaped = result.outcome is ReapOutcome.REAPED
            queries.record_instance_exit(
                session,
                instance_id=record.instance_id,
                stopped_at=now,
                exit_code=None,
                reason=f"not adopted: {why}; " + ("reaped" if reaped else "gone"),
                reaped=reaped,
            )

    writer.put(write)
    for (record, why), result in zip(refused, results, strict=True):
        reaped = result.outcome is ReapOutcome.REAPED
        events.record(
            EventKind.NOT_ADOPTED,
            f"pid {record.pid} of {record.service}, left by a previous vramd, not adopted: "
            f"{why}; " + ("stopped" if reaped else "nothing left to stop"),
            service=record.service if record.service else None,
            instance_id=record.instance_id,
            data={"pid": record.pid, "pgid": record.pgid, "why": why, "reaped": reaped},
        )
        _remove_output(record)  # nobody reads them again, whether it was stopped or gone


def _remove_output(record: Left) -> None:
    if record.output is not None:
        OutputFiles(Path(record.output)).remove()
