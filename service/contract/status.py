"""``GET /api/status`` and ``/api/services``: the devices and every service, live."""

from __future__ import annotations

from pydantic import BaseModel


class WaitHolder(BaseModel):
    """A service holding memory a waiting load needs: why, and when it yields."""

    service: str
    device: int
    why: str
    bytes: int
    residency: str | None  # None: memory no service of ours holds
    priority: int | None
    in_flight: int
    queued: int
    idle_for_s: float | None
    yields_in_s: float | None
    by: str | None
    text: str


class Backoff(BaseModel):
    """While a restart is pending: why, how often, and when the next start is due."""

    cause: str  # died | start-failed
    next_start_at: float
    deaths_in_10_min: int
    failed_starts: int


class ServiceMemory(BaseModel):
    """Estimate, learned peak and cap side by side, and the footprint's parts."""

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


class SavedState(BaseModel):
    """A service's state kept across swaps (docs/policy.md, "State across swaps")."""

    disk_bytes: int
    saved_bytes: int
    saved_slots: int
    saved_tokens: int
    saves: int
    restores: int
    tokens_restored: int
    tokens_not_reprocessed: int
    last_save_ms: float | None
    last_restore_ms: float | None
    ineffective: str | None


class ServiceStatus(BaseModel):
    """One service: every field docs/api.md lists under ``GET /api/services``."""

    name: str
    kind: str
    models: list[str]
    residency: str
    priority: int
    state: str
    pid: int | None
    adopted: bool
    port: int | None
    device: int | None
    devices: list[int]
    span: int
    device_bytes: dict[str, int]
    charge_by_device: dict[str, int]
    footprint_bytes: int
    host_bytes: int
    peak_bytes: int
    estimate_bytes: int
    learned_peak_bytes: int | None
    expected_peak_bytes: int
    charge_bytes: int
    cap_bytes: int | None
    in_flight: int
    queued: int
    queued_by_client: dict[str, int]
    waiting_for_memory: bool
    waiting_for: str | None
    wait_holders: list[WaitHolder]
    evicting: list[str]
    idle_for_s: float | None
    protect_s: float | None
    protected_for_s: float | None
    requests_served: int
    loads: int
    evictions: int
    restarts: int
    last_load_s: float | None
    learned_load_s: float | None
    backoff_until: float | None
    backoff: Backoff | None
    flags: list[str]
    routes: dict[str, str]
    last_error: str | None
    memory: ServiceMemory
    saved_state: SavedState | None


class DeviceStatus(BaseModel):
    """One device: its own figures, and the budget vramd keeps on it."""

    index: int
    name: str
    total_bytes: int
    visible_total_bytes: int
    used_bytes: int
    free_bytes: int
    managed_bytes: int
    foreign_bytes: int
    headroom_bytes: int
    budget_bytes: int | None
    available_bytes: int | None
    charges: dict[str, int]


class Status(BaseModel):
    backend: str | None
    degraded: bool | None
    devices: list[DeviceStatus]
    services: list[ServiceStatus]


class StatusAnswer(BaseModel):
    """``GET /api/status``: the daemon's version, then its ``Status``."""

    version: str
    backend: str | None
    degraded: bool | None
    devices: list[DeviceStatus]
    services: list[ServiceStatus]

    @classmethod
    def of(cls, version: str, status: Status) -> StatusAnswer:
        return cls(version=version, **dict(status))
