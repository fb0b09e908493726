"""The admin API (``/api``) and ``/healthz``: thin routes that ask the orchestrator."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from service import __version__
from service.api.deps import DaemonDep, OrchestratorDep, StoreDep
from service.store import queries

router = APIRouter()


@router.get("/healthz")
async def healthz(daemon: DaemonDep) -> JSONResponse:
    """200 while the daemon is serving; 503 when its own liveness check fails."""
    health = daemon.orchestrator.health()
    status = 200 if health["ok"] else 503
    return JSONResponse({"status": "ok" if health["ok"] else "unhealthy", **health}, status)


@router.get("/api/status")
async def status(orchestrator: OrchestratorDep) -> dict[str, Any]:
    return {"version": __version__, **orchestrator.status()}


@router.get("/api/services")
async def services(orchestrator: OrchestratorDep) -> list[dict[str, Any]]:
    return orchestrator.services_view()


@router.get("/api/services/{name}")
async def service(name: str, orchestrator: OrchestratorDep) -> dict[str, Any]:
    return orchestrator.service_view(name)


@router.post("/api/services/{name}/load")
async def load(name: str, orchestrator: OrchestratorDep) -> dict[str, Any]:
    return await orchestrator.load(name)


@router.post("/api/services/{name}/unload")
async def unload(name: str, orchestrator: OrchestratorDep) -> dict[str, Any]:
    return await orchestrator.unload(name)


@router.post("/api/services/{name}/restart")
async def restart(name: str, orchestrator: OrchestratorDep) -> dict[str, Any]:
    return await orchestrator.restart(name)


@router.get("/api/services/{name}/logs")
async def logs(
    name: str,
    orchestrator: OrchestratorDep,
    tail: Annotated[int, Query(ge=1, le=10000)] = 200,
) -> dict[str, Any]:
    return {"service": name, "lines": orchestrator.logs(name, tail)}


@router.get("/api/policy", response_model=None)
async def policy(
    store: StoreDep,
    format: Annotated[str, Query(pattern="^(json|yaml)$")] = "json",
) -> dict[str, Any] | Response:
    """The active policy: its version, hash, source and full YAML text."""
    with store.session() as session:
        active = queries.active_policy_version(session)
        if active is None:
            return JSONResponse({"version": None, "text": None})
        record = {
            "version": active.version,
            "sha256": active.sha256,
            "source": active.source,
            "applied_at": active.applied_at,
            "text": active.text,
        }
    if format == "yaml":
        return PlainTextResponse(str(record["text"]), media_type="application/yaml")
    return record


@router.get("/api/events")
async def events(
    store: StoreDep,
    since: Annotated[int | None, Query(description="return events after this event id")] = None,
    since_ts: Annotated[float | None, Query(description="epoch seconds")] = None,
    service: str | None = None,
    kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> dict[str, Any]:
    """Persisted events, oldest first; page forward with ``since`` = the last id seen."""
    with store.session() as session:
        rows = queries.list_events(
            session, since_id=since, since_ts=since_ts, service=service, kind=kind, limit=limit
        )
        return {
            "events": [
                {
                    "id": row.id,
                    "ts": row.ts,
                    "kind": row.kind,
                    "service": row.service,
                    "instance_id": row.instance_id,
                    "message": row.message,
                    "data": row.data,
                }
                for row in rows
            ]
        }
