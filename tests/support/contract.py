"""Whole admin-API answers from the few fields a test cares about (``service.contract``)."""

from __future__ import annotations

from typing import Any

from service.contract import DeviceStatus, ServiceMemory, ServiceStatus, Status

MiB = 1024 * 1024

SERVICE: dict[str, Any] = {
    "name": "svc",
    "kind": "chat",
    "models": [],
    "residency": "on-demand",
    "priority": 100,
    "state": "stopped",
    "pid": None,
    "adopted": False,
    "port": None,
    "device": None,
    "devices": [],
    "span": 1,
    "device_bytes": {},
    "charge_by_device": {},
    "footprint_bytes": 0,
    "host_bytes": 0,
    "peak_bytes": 0,
    "estimate_bytes": 100 * MiB,
    "learned_peak_bytes": None,
    "expected_peak_bytes": 100 * MiB,
    "charge_bytes": 0,
    "cap_bytes": None,
    "in_flight": 0,
    "queued": 0,
    "queued_by_client": {},
    "waiting_for_memory": False,
    "waiting_for": None,
    "wait_holders": [],
    "evicting": [],
    "idle_for_s": None,
    "protect_s": None,
    "protected_for_s": None,
    "requests_served": 0,
    "loads": 0,
    "evictions": 0,
    "restarts": 0,
    "last_load_s": None,
    "learned_load_s": None,
    "backoff_until": None,
    "backoff": None,
    "flags": [],
    "routes": {},
    "last_error": None,
    "saved_state": None,
}
DEVICE: dict[str, Any] = {
    "index": 0,
    "name": "device",
    "total_bytes": 0,
    "visible_total_bytes": 0,
    "used_bytes": 0,
    "free_bytes": 0,
    "managed_bytes": 0,
    "foreign_bytes": 0,
    "headroom_bytes": 0,
    "budget_bytes": None,
    "available_bytes": None,
    "charges": {},
}


def service_status(**fields: Any) -> ServiceStatus:
    whole = {**SERVICE, **fields}
    memory = {key: whole.get(key) for key in ServiceMemory.model_fields}
    return ServiceStatus.model_validate({**whole, "memory": fields.get("memory", memory)})


def status_of(view: dict[str, Any]) -> Status:
    """A ``Status`` from a dict that names only some fields of each device and service."""
    return Status(
        backend=view.get("backend"),
        degraded=view.get("degraded"),
        devices=[DeviceStatus.model_validate({**DEVICE, **d}) for d in view.get("devices", [])],
        services=[service_status(**s) for s in view.get("services", [])],
    )
