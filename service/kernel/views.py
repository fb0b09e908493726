"""JSON views of live state for the admin API, ``vramd ps`` and the dashboard.

Pure functions of what the orchestrator hands them, so the shape of ``GET
/api/services`` (docs/api.md) is defined in one place; and ``NodeLoad``, the few figures
a cluster router reads from ``/metrics`` many times a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from service.contract import (
    Backoff,
    DeviceStatus,
    SavedState,
    ServiceMemory,
    ServiceStatus,
    Status,
)
from service.domain import ProbeReading
from service.scheduler import LedgerView, Scheduler, ServiceView

if TYPE_CHECKING:
    from service.live.runtimes import RuntimeTable, ServiceRuntime
    from service.memory.watch import InstanceWatch, Watches
    from service.supervisor import Instance
    from service.swapstate import StateKeeper


def service_view(
    rt: ServiceRuntime,
    view: ServiceView,
    watch: InstanceWatch | None,
    keeper: StateKeeper,
) -> ServiceStatus:
    """Every field docs/api.md lists for a service under ``GET /api/services``."""
    inst = rt.instance
    spec = rt.spec
    return ServiceStatus.model_validate(
        {
            "name": rt.name,
            "kind": spec.kind.value,
            "models": list(spec.models),
            "residency": spec.residency.value,
            "priority": spec.priority,
            # The instance's own state is the truth about the process; the scheduler's
            # adds nothing it does not know, except "waiting for memory" below.
            "state": inst.state.value,
            "pid": inst.pid,
            # Started by a previous daemon and adopted by this one (no load).
            "adopted": inst.adopted,
            "port": inst.port,
            "device": rt.placement.device if inst.pid is not None else view.device,
            # span: N: every device, and per device what is measured and charged there.
            "devices": list(rt.placement.devices if inst.pid is not None else view.devices),
            "span": spec.span,
            "device_bytes": _per_device(rt.measured.device_bytes if inst.pid is not None else {}),
            "charge_by_device": _per_device(view.charges),
            "footprint_bytes": rt.measured.footprint,
            "host_bytes": rt.measured.host_bytes,
            "peak_bytes": rt.measured.peak,
            "estimate_bytes": spec.memory.estimate,
            "learned_peak_bytes": rt.measured.learned_peak,
            "expected_peak_bytes": view.expected_peak,
            "charge_bytes": view.charge,
            "cap_bytes": spec.memory.cap,
            "in_flight": view.in_flight,
            "queued": view.queued,
            "queued_by_client": dict(sorted(view.queued_by_client.items())),
            "waiting_for_memory": view.waiting_for_memory,
            # What a waiting load waits for, in words and per holder (docs/operations.md,
            # "How vramd decides", step 4).
            "waiting_for": view.waiting_for,
            "wait_holders": list(view.wait_holders),
            "evicting": list(view.evicting),
            "idle_for_s": view.idle_for,
            "protect_s": None if spec.protect == "never" else spec.protect,
            "protected_for_s": view.protected_for,
            "requests_served": rt.requests_served,
            "loads": rt.placement.loads,
            "evictions": rt.placement.evictions,
            "restarts": rt.placement.restarts,
            "last_load_s": rt.placement.last_load_s,
            "learned_load_s": rt.measured.learned_load_s,
            "backoff_until": inst.backoff_until,
            "backoff": _backoff(inst),
            "flags": sorted(rt.health.flags),
            "routes": dict(spec.route_table()),
            "last_error": inst.last_error or view.error,
            "memory": memory_view(rt, watch),
            "saved_state": state_view(rt, keeper),
        }
    )


def state_view(rt: ServiceRuntime, keeper: StateKeeper) -> SavedState | None:
    """A service's saved state (docs/api.md, ``state``); None without ``state:``."""
    if rt.spec.state is None:
        return None
    return SavedState(disk_bytes=rt.spec.state.disk, **asdict(keeper.figures(rt.name)))


def _backoff(inst: Instance) -> Backoff | None:
    """While a restart is pending: why (a death after ready, or a failed start), how
    often, and when the next start is due (docs/reliability.md, "Restarts")."""
    failure = inst.last_failure
    if inst.backoff_until is None or failure is None:
        return None
    return Backoff(
        cause="died" if failure.was_ready else "start-failed",
        next_start_at=inst.backoff_until,
        deaths_in_10_min=failure.deaths,
        failed_starts=failure.failed_starts,
    )


def _per_device(figures: dict[int, int]) -> dict[str, int]:
    """Device index -> bytes with JSON's string keys, in index order."""
    return {str(device): figures[device] for device in sorted(figures)}


def status_view(
    *,
    reading: ProbeReading | None,
    ledgers: Sequence[LedgerView | None],
    headroom: int,
    services: list[ServiceStatus],
) -> Status:
    by_index = {ledger.device: ledger for ledger in ledgers if ledger is not None}
    devices = []
    for device in reading.devices if reading else ():
        ledger = by_index.get(device.index)
        devices.append(
            DeviceStatus(
                index=device.index,
                name=device.name,
                total_bytes=device.total,
                visible_total_bytes=device.runtime_total,
                used_bytes=device.used,
                free_bytes=device.free,
                managed_bytes=device.managed,
                foreign_bytes=device.foreign,
                headroom_bytes=headroom,
                budget_bytes=ledger.budget if ledger else None,
                available_bytes=ledger.available if ledger else None,
                charges=dict(ledger.charges) if ledger else {},
            )
        )
    return Status(
        backend=reading.backend if reading else None,
        degraded=reading.degraded if reading else None,
        devices=devices,
        services=services,
    )


def memory_view(rt: ServiceRuntime, watch: InstanceWatch | None) -> ServiceMemory:
    """Estimate, learned peak and cap side by side, and the footprint's parts."""
    metrics = watch.metrics if watch else None
    return ServiceMemory(
        estimate_bytes=rt.spec.memory.estimate,
        learned_peak_bytes=rt.measured.learned_peak,
        cap_bytes=rt.spec.memory.cap,
        footprint_bytes=rt.measured.footprint,
        host_bytes=rt.measured.host_bytes,
        weights_bytes=watch.weights_bytes if watch else None,
        growth_bytes=watch.growth_bytes() if watch else None,
        kv_cache_usage_ratio=watch.kv_usage if watch else None,
        kv_cache_tokens=metrics.kv_cache_tokens if metrics else None,
        runtime_requests_running=metrics.requests_running if metrics else None,
    )


@dataclass(frozen=True, slots=True)
class ServiceLoad:
    """One service as a cluster router sees it (docs/api.md, "GET /metrics")."""

    models: tuple[str, ...]
    state: str
    in_flight: int
    queued: int
    waiting_for_memory: bool
    kv_usage: float | None  # 0..1, where the runtime reports it


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """This machine's load and residency: what ``vllm:*`` series are made of."""

    services: tuple[ServiceLoad, ...]
    budget_bytes: int  # over every device vramd may use
    charged_bytes: int  # of that, charged to services


def service_load(
    rt: ServiceRuntime, load: tuple[int, int, bool], watch: InstanceWatch | None
) -> ServiceLoad:
    """``load``: the scheduler's in-flight and queued counts, and whether it waits."""
    in_flight, queued, waiting = load
    return ServiceLoad(
        models=tuple(rt.spec.models),
        state=rt.instance.state.value,
        in_flight=in_flight,
        queued=queued,
        waiting_for_memory=waiting,
        kv_usage=watch.kv_usage if watch else None,
    )


def node_load(runtimes: RuntimeTable, scheduler: Scheduler, watches: Watches) -> NodeLoad:
    """Every service's load, and the budget charged over every device."""
    services = tuple(
        service_load(rt, scheduler.load_of(name), watches.get(name))
        for name, rt in runtimes.items()
    )
    budget = charged = 0
    for device in scheduler.devices():
        ledger = scheduler.ledger_view(device)
        if ledger is not None:
            budget += ledger.budget
            charged += sum(ledger.charges.values())
    return NodeLoad(services, budget_bytes=budget, charged_bytes=charged)
