"""What the store keeps, as the admin API answers it. A record is read from its row by
its fields' names (``Record.model_validate(row)``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class EventRecord(Record):
    """One recorded event (``GET /api/events``; ``kind``: docs/api.md's list)."""

    id: int
    ts: float
    kind: str
    service: str | None
    instance_id: int | None
    message: str
    data: dict[str, Any] | None


class Events(BaseModel):
    events: list[EventRecord]


class IncidentSummary(Record):
    id: int
    ts: float
    service: str
    kind: str  # load | request
    verdict: str
    summary: str


class Incidents(BaseModel):
    incidents: list[IncidentSummary]


class Incident(IncidentSummary):
    """One incident with its figures (``GET /api/incidents/{id}``)."""

    data: dict[str, Any]


class PolicyVersion(Record):
    version: int
    sha256: str
    source: str
    applied_at: float
    active: bool


class PolicyHistory(BaseModel):
    versions: list[PolicyVersion]


class ActivePolicy(Record):
    """``GET /api/policy``; every field None before any policy was applied."""

    version: int | None
    sha256: str | None = None
    source: str | None = None
    applied_at: float | None = None
    text: str | None


class MemorySample(Record):
    ts: float
    instance_id: int | None
    device_bytes: int | None
    host_bytes: int | None
    kv_cache_bytes: int | None
    in_flight: int | None
    requests_served: int | None
    resolution: str


class MemoryAnswer(BaseModel):
    """``GET /api/services/{name}/memory``: the service's ``ServiceMemory`` and samples."""

    service: str
    estimate_bytes: int
    learned_peak_bytes: int | None
    cap_bytes: int | None
    footprint_bytes: int
    host_bytes: int
    weights_bytes: int | None
    growth_bytes: int | None
    kv_cache_usage_ratio: float | None
    kv_cache_tokens: int | None
    runtime_requests_running: int | None
    samples: list[MemorySample]


class UsageRow(BaseModel):
    """One client's use of one service (docs/api.md, ``GET /api/usage``)."""

    client: str
    service: str
    errors_by_code: dict[str, int]
    requests: int
    tokens_in: int
    tokens_out: int
    runtime_s: float
    images: int
    audio_s: float
    errors: int


class UsageAnswer(BaseModel):
    since: float
    usage: list[UsageRow]


class ModelEntry(BaseModel):
    """One model name in ``GET /v1/models``: OpenAI's fields, and vramd's own."""

    object: Literal["model"] = "model"
    created: int
    id: str
    service: str
    kind: str
    state: str
    owned_by: Literal["vramd"] = "vramd"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class LogLine(BaseModel):
    ts: float
    stream: str
    text: str


class Logs(BaseModel):
    service: str
    lines: list[LogLine]
