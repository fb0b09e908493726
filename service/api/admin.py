"""The admin API (``/api``) and ``/healthz``: thin routes that ask the orchestrator.

Routes that read the store do it in a read-only session (``store.read()``), which never
waits for SQLite's write lock. The daemon's own records reach SQLite through the store
writer; a route that reads them (events, samples, incidents) first waits, a bounded
while, for the writer to commit what it holds, so a client reads its own writes: an
action's events are there as soon as the action has answered.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from service import __version__
from service.api.auth import require_admin_key
from service.api.deps import OrchestratorDep, StoreDep, WriterDep
from service.api.errors import error_response
from service.api.openai import read_body
from service.contract import (
    ActivePolicy,
    ApplyAnswer,
    EventRecord,
    Events,
    Explanation,
    Incident,
    Incidents,
    IncidentSummary,
    Logs,
    MemoryAnswer,
    MemorySample,
    PolicyHistory,
    PolicyVersion,
    SchedulerAnswer,
    ServiceStatus,
    StatusAnswer,
    UsageAnswer,
    UsageRow,
    Window,
    WindowList,
)
from service.errors import ErrorCode, InvalidRequest, PolicyError
from service.policy import MAX_WINDOW_S, NAME_PATTERN
from service.store import StoreWriter, queries
from service.units import parse_duration

# /healthz stays open (load balancers, systemd, Docker health checks); /api needs the
# admin key when the policy sets admin_keys.
health_router = APIRouter()
MAX_POLICY_BYTES = 1024**2  # a policy is a few kilobytes; this only stops abuse
MAX_ID = 2**63 - 1  # SQLite's largest integer: a larger id is a 400, not a 500
router = APIRouter(dependencies=[Depends(require_admin_key)])
# How long a read waits for the writer to commit the daemon's records; past it (the
# database is locked by another process) it answers with what is committed.
READ_YOUR_WRITES_S = 2.0


async def committed(writer: StoreWriter) -> None:
    """Let the store writer commit what was recorded before this request (bounded)."""
    await writer.flushed(READ_YOUR_WRITES_S)


@health_router.get("/healthz")
async def healthz(orchestrator: OrchestratorDep) -> JSONResponse:
    """200 while the daemon is serving; 503 when its own liveness check fails."""
    health = orchestrator.health()
    status = 200 if health["ok"] else 503
    return JSONResponse({"status": "ok" if health["ok"] else "unhealthy", **health}, status)


@router.get("/api/status")
async def status(orchestrator: OrchestratorDep) -> StatusAnswer:
    return StatusAnswer.of(__version__, orchestrator.status())


@router.get("/api/scheduler")
async def scheduler(orchestrator: OrchestratorDep) -> SchedulerAnswer:
    """What ``yielding: auto`` stands for now, since when and why (docs/api.md)."""
    return SchedulerAnswer(yielding=orchestrator.tuning.view())


@router.post("/api/scheduler/tune")
async def tune(orchestrator: OrchestratorDep) -> SchedulerAnswer:
    """A tuning round now, whatever the schedule; answers once it has concluded."""
    return SchedulerAnswer(yielding=await orchestrator.tuning.tune())


@router.get("/api/services")
async def services(orchestrator: OrchestratorDep) -> list[ServiceStatus]:
    return orchestrator.services_view()


@router.get("/api/services/{name}")
async def service(name: str, orchestrator: OrchestratorDep) -> ServiceStatus:
    return orchestrator.service_view(name)


@router.post("/api/services/{name}/load")
async def load(name: str, orchestrator: OrchestratorDep) -> ServiceStatus:
    return await orchestrator.load(name)


@router.post("/api/services/{name}/unload")
async def unload(name: str, orchestrator: OrchestratorDep) -> ServiceStatus:
    return await orchestrator.unload(name)


@router.post("/api/services/{name}/restart")
async def restart(name: str, orchestrator: OrchestratorDep) -> ServiceStatus:
    return await orchestrator.restart(name)


@router.get("/api/services/{name}/admission")
async def admission(name: str, orchestrator: OrchestratorDep) -> Explanation:
    """What loading the service now would do; changes nothing."""
    return orchestrator.admission(name)


@router.get("/api/services/{name}/logs")
async def logs(
    name: str,
    orchestrator: OrchestratorDep,
    tail: Annotated[int, Query(ge=1, le=10000)] = 200,
) -> Logs:
    return Logs(service=name, lines=orchestrator.logs(name, tail))


@router.post("/api/policy", response_model=ApplyAnswer)
async def apply_policy(
    request: Request,
    orchestrator: OrchestratorDep,
    dry_run: bool = False,
) -> ApplyAnswer | JSONResponse:
    """Apply a policy (YAML body): 422 with every error and nothing changed if invalid."""
    body = await read_body(request, MAX_POLICY_BYTES, "the policy size limit")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return error_response(ErrorCode.INVALID_REQUEST, "the policy body must be UTF-8 YAML")
    try:
        return await orchestrator.apply_policy(text, source="api", dry_run=dry_run)
    except PolicyError as exc:
        return policy_error_response(exc)


@router.get("/api/policy/history")
async def policy_history(store: StoreDep) -> PolicyHistory:
    with store.read() as session:
        return PolicyHistory(
            versions=[PolicyVersion.model_validate(row) for row in queries.policy_history(session)]
        )


@router.post("/api/policy/rollback/{version}", response_model=ApplyAnswer)
async def rollback(
    version: Annotated[int, Path(ge=1, le=MAX_ID)], store: StoreDep, orchestrator: OrchestratorDep
) -> ApplyAnswer | JSONResponse:
    """Apply an earlier version's text again (as a new version)."""
    with store.read() as session:
        row = queries.get_policy_version(session, version=version)
        text = row.text if row is not None else None
    if text is None:
        return error_response(ErrorCode.NOT_FOUND, f"no policy version {version}")
    try:
        return await orchestrator.apply_policy(text, source=f"rollback to version {version}")
    except PolicyError as exc:  # a version stored by an older vramd may not validate now
        return policy_error_response(exc)


def policy_error_response(exc: PolicyError) -> JSONResponse:
    count, code = len(exc.issues), ErrorCode.INVALID_POLICY
    return JSONResponse(
        {
            "error": {
                "message": f"invalid policy ({count} error{'s' if count != 1 else ''}); "
                "nothing was changed",
                "type": code.error_type,
                "code": code,
            },
            "errors": [issue.as_dict() for issue in exc.issues],
        },
        status_code=code.status,
    )


@router.get("/api/maintenance")
async def maintenance(orchestrator: OrchestratorDep) -> WindowList:
    return orchestrator.windows.view()


@router.post("/api/maintenance/{name}/run")
async def run_window(name: str, orchestrator: OrchestratorDep) -> Window:
    return orchestrator.windows.run(name)


class NewWindow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    start: datetime | Literal["now"] = "now"
    duration: str | float
    restart: Literal["flagged", "all", "none"] | list[str] = "flagged"
    allow: list[str] = []


@router.post("/api/maintenance", status_code=201)
async def add_window(body: NewWindow, orchestrator: OrchestratorDep) -> Window:
    """Schedule a one-off window (stored in SQLite; survives restarts)."""
    try:
        duration = parse_duration(body.duration)
    except ValueError as exc:
        raise InvalidRequest(f"duration: {exc}") from None
    if not 0 < duration <= MAX_WINDOW_S:
        raise InvalidRequest("duration: must be more than 0 and at most 31 days")
    now = time.time()
    if body.start == "now":
        start_at = now
    else:
        start = body.start if body.start.tzinfo else body.start.replace(tzinfo=UTC)
        start_at = start.timestamp()
    if not now - 86400 <= start_at <= now + 10 * 365 * 86400:
        raise InvalidRequest("start: must be within the next ten years (or at most a day ago)")
    return await orchestrator.windows.add(
        name=body.name,
        start_at=start_at,
        duration_s=duration,
        restart=body.restart,
        allow=body.allow,
    )


@router.delete("/api/maintenance/{name}", status_code=204)
async def delete_window(name: str, orchestrator: OrchestratorDep) -> Response:
    await orchestrator.windows.delete(name)
    return Response(status_code=204)


@router.get("/api/policy", response_model=ActivePolicy)
async def policy(
    store: StoreDep,
    format: Annotated[str, Query(pattern="^(json|yaml)$")] = "json",
) -> ActivePolicy | Response:
    """The active policy: its version, hash, source and full YAML text."""
    with store.read() as session:
        active = queries.active_policy_version(session)
        if active is None:
            return JSONResponse({"version": None, "text": None})
        record = ActivePolicy.model_validate(active)
    if format == "yaml":
        return PlainTextResponse(str(record.text), media_type="application/yaml")
    return record


@router.get("/api/events")
async def events(
    store: StoreDep,
    since: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="return events after this event id")
    ] = None,
    since_ts: Annotated[float | None, Query(ge=0, le=1e11, description="epoch seconds")] = None,
    service: str | None = None,
    kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    *,
    writer: WriterDep,
) -> Events:
    """Persisted events, oldest first; page forward with ``since`` = the last id seen."""
    await committed(writer)
    with store.read() as session:
        rows = queries.list_events(
            session, since_id=since, since_ts=since_ts, service=service, kind=kind, limit=limit
        )
        return Events(events=[EventRecord.model_validate(row) for row in rows])


@router.get("/api/usage")
async def usage(
    orchestrator: OrchestratorDep,
    store: StoreDep,
    writer: WriterDep,
    since: Annotated[
        str, Query(max_length=32, description="how far back: a duration such as 24h or 7d")
    ] = "24h",
    client: Annotated[str | None, Query(max_length=64)] = None,
) -> UsageAnswer:
    """Each client's use of each service in the whole hours of the last ``since``."""
    try:
        back = parse_duration(since)
    except ValueError as exc:
        raise InvalidRequest(f"since: {exc}") from None
    orchestrator.accounts.usage.store(writer)  # what is still in memory, stored first
    await committed(writer)
    start = max(0.0, time.time() - back)
    with store.read() as session:
        rows = queries.usage_since(session, since=start, client=client)
    return UsageAnswer(since=start, usage=[UsageRow.model_validate(row) for row in rows])


@router.get("/api/events/stream")
async def events_stream(request: Request, orchestrator: OrchestratorDep) -> StreamingResponse:
    """Server-sent events: each new event as ``data: {json}``, a comment every 15 s."""
    queue = orchestrator.events.subscribe()

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield b": vramd events\n\n"
            while not await request.is_disconnected():
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=15)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                yield f"id: {event.id}\ndata: {json.dumps(event.model_dump())}\n\n".encode()
        finally:
            orchestrator.events.unsubscribe(queue)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


@router.get("/api/services/{name}/memory")
async def memory(
    name: str,
    store: StoreDep,
    orchestrator: OrchestratorDep,
    since: Annotated[float | None, Query(ge=0, le=1e11, description="epoch seconds")] = None,
    limit: Annotated[int, Query(ge=1, le=20000)] = 3600,
    *,
    writer: WriterDep,
) -> MemoryAnswer:
    """The service's memory samples (1 s for the last hour, 1 min for a week)."""
    orchestrator.runtime(name)  # 404 for an unknown service
    await committed(writer)
    with store.read() as session:
        rows = queries.instance_samples(session, service=name, since_ts=since, limit=limit)
        samples = [MemorySample.model_validate(row) for row in rows]
    memory = dict(orchestrator.memory_view(name))
    return MemoryAnswer(service=name, **memory, samples=samples)


@router.get("/api/incidents")
async def incidents(
    store: StoreDep, writer: WriterDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> Incidents:
    await committed(writer)
    with store.read() as session:
        return Incidents(
            incidents=[
                IncidentSummary.model_validate(row)
                for row in queries.list_incidents(session, limit=limit)
            ]
        )


@router.get("/api/incidents/{incident_id}")
async def incident(
    incident_id: Annotated[int, Path(ge=1, le=MAX_ID)], store: StoreDep, writer: WriterDep
) -> Incident:
    await committed(writer)
    with store.read() as session:
        row = queries.get_incident(session, id=incident_id)
        if row is None:
            raise HTTPException(404, f"no incident {incident_id}")
        return Incident.model_validate(row)
