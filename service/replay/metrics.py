"""What a run records and the figures it reports (the keys of ``--json``).

Every request ends in exactly one outcome: ``served``, ``refused`` (with the error code a
client would see) or ``failed`` (``oom``: the load it waited for ran out of memory, or a
crash-looping service refused it for that reason; ``killed``: its runtime was stopped
under it). A request still open when the run ends is reported as ``unfinished``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from service.domain import Residency
from service.replay.setup import Setup
from service.replay.trace import TraceRequest
from service.scheduler.yielding import SLO_FACTOR
from service.units import GIB

REQUEST_KEYS = (
    "requests",
    "served",
    "refused",
    "refused_total",
    "failed_oom",
    "killed",
    "unfinished",
    "latency_s",
    "queue_s",
    "served_past_timeout",
    "served_within_timeout",
    "share_within_timeout",
    "slo_attainment",
    "weighted_slo",
)
RUN_KEYS = (
    *REQUEST_KEYS,
    "cold_starts",
    "cold_requests",
    "gb_loaded",
    "oom_loads",
    "oom_loads_after_ready",
    "evictions",
    "mem_avg_fraction",
    "by_priority",
    "by_priority_unpinned",
    "by_service",
)


@dataclass(slots=True)
class RequestRecord:
    req: TraceRequest
    service: str | None
    priority: int | None
    outcome: str = "pending"
    code: str | None = None
    granted_at: float | None = None
    finished_at: float | None = None
    cold: bool = False

    @property
    def latency(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.req.t

    @property
    def queued(self) -> float | None:
        return None if self.granted_at is None else self.granted_at - self.req.t


class Recorder:
    """The outcome of every request and the counters of one run; ``events`` is the
    decision log (load, evict, reject) that ``--live`` compares with a real daemon's."""

    def __init__(self, setup: Setup, trace: Sequence[TraceRequest]) -> None:
        self.setup = setup
        self.records: dict[str, RequestRecord] = {}
        for req in trace:
            svc = setup.service_of(req.model)
            prio = setup.services[svc].priority if svc is not None else None
            self.records[req.id] = RequestRecord(req, svc, prio)
        self.unresolved = len(self.records)
        self.loads = 0
        self.loads_by_service: dict[str, int] = {}
        self.oom_loads = 0
        self.oom_by_service: dict[str, int] = {}
        self.oom_loads_after_ready = 0
        self.ready_once: set[str] = set()
        self.bytes_loaded = 0
        self.evictions = 0
        self.events: list[dict[str, Any]] = []

    # ----------------------------------------------------------- requests

    def granted(self, rid: str, now: float, *, ready_since: float) -> None:
        """A runtime that has been ready since ``ready_since`` took the request."""
        rec = self.records[rid]
        rec.granted_at = now
        rec.cold = ready_since > rec.req.t

    def served(self, rid: str, now: float) -> None:
        rec = self._resolve(rid, "served", None)
        rec.finished_at = now

    def refused(self, rid: str, code: str, now: float) -> None:
        self._resolve(rid, "refused", code)
        self.event(now, "reject", self.records[rid].service, code=code)

    def failed(self, rid: str, reason: str, now: float) -> None:
        self._resolve(rid, "failed", reason)

    def _resolve(self, rid: str, outcome: str, code: str | None) -> RequestRecord:
        rec = self.records[rid]
        assert rec.outcome == "pending", f"{rid} resolved twice ({rec.outcome}, {outcome})"
        rec.outcome, rec.code = outcome, code
        self.unresolved -= 1
        return rec

    # ----------------------------------------------------------- runtimes

    def load(self, service: str, now: float, **data: Any) -> None:
        self.loads += 1
        self.loads_by_service[service] = self.loads_by_service.get(service, 0) + 1
        self.bytes_loaded += self.setup.services[service].bench.true_peak
        self.event(now, "load", service, **data)

    def ready(self, service: str) -> None:
        """A load of ``service`` finished: from now on its true peak has been seen."""
        self.ready_once.add(service)

    def oom(self, service: str, now: float) -> None:
        self.oom_loads += 1
        self.oom_by_service[service] = self.oom_by_service.get(service, 0) + 1
        if service in self.ready_once:
            self.oom_loads_after_ready += 1
        self.event(now, "oom", service)

    def evicted(self, victims: Iterable[str], now: float, *, for_service: str | None) -> None:
        names = sorted(victims)
        self.evictions += len(names)
        self.event(now, "evict", for_service, victims=names)

    def event(self, now: float, kind: str, service: str | None, **data: Any) -> None:
        self.events.append({"t": round(now, 6), "kind": kind, "service": service, "data": data})


def percentile(values: Iterable[float], pct: float) -> float:
    """The ``pct``-th percentile (0-100) of ``values``, interpolated linearly between the
    two closest ranks (numpy's default): the one meaning every vramd figure uses."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile {pct} is outside 0-100")
    pos = (len(ordered) - 1) * pct / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 and p99, or None each where there are no values."""
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": percentile(values, 50), "p99": percentile(values, 99)}


def _past_timeout(r: RequestRecord, setup: Setup) -> bool:
    return (
        r.service is not None
        and r.queued is not None
        and r.queued > setup.rules[r.service].queue_timeout_s + 1e-9
    )


def _request_figures(records: Sequence[RequestRecord], setup: Setup) -> dict[str, Any]:
    served = [r for r in records if r.outcome == "served"]
    latencies = [r.latency for r in served if r.latency is not None]
    queued = [r.queued for r in served if r.queued is not None]
    refused = Counter(r.code or "?" for r in records if r.outcome == "refused")
    late = sum(1 for r in served if _past_timeout(r, setup))
    met = 0
    weight = met_weight = 0.0
    for r in records:
        weight += r.priority or 0
    for r in served:
        load_s = setup.services[r.service].bench.load_s if r.service else 0.0
        if r.latency is not None and r.latency <= SLO_FACTOR * r.req.duration_s + load_s + 1e-9:
            met += 1
            met_weight += r.priority or 0
    return {
        "requests": len(records),
        "served": len(served),
        "refused": dict(sorted(refused.items())),
        "refused_total": sum(refused.values()),
        "failed_oom": sum(1 for r in records if r.outcome == "failed" and r.code == "oom"),
        "killed": sum(1 for r in records if r.outcome == "failed" and r.code == "killed"),
        "unfinished": sum(1 for r in records if r.outcome == "pending"),
        "latency_s": _quantiles(latencies),
        "queue_s": _quantiles(queued),
        "served_past_timeout": late,
        "served_within_timeout": len(served) - late,
        "share_within_timeout": (len(served) - late) / len(records) if records else None,
        "slo_attainment": met / len(records) if records else None,
        "weighted_slo": met_weight / weight if weight > 0 else None,
    }


def summarize(rec: Recorder, *, byte_seconds: float, horizon: float) -> dict[str, Any]:
    """The figures of one run (``RUN_KEYS``), JSON-ready.

    Per run (and per priority class and per service, for the request figures):

    - ``latency_s``: arrival to last byte, p50/p99 over served requests;
      ``queue_s``: arrival to the moment a runtime slot took it.
    - ``served_past_timeout``: served requests that had waited longer than their service's
      ``queue.timeout`` for a slot: a vramd client would have had a 503 ``queue_timeout``
      instead (the baselines do not time out their queues).
    - ``served_within_timeout``: the others, served after waiting no longer than their
      service's ``queue.timeout`` (the same 1 ns tolerance): the headline figure, the one
      that counts a baseline's request as served only where vramd would have served it;
      ``share_within_timeout``: that over ``requests`` (None for none).
    - ``slo_attainment``: the fraction of *all* requests served within
      ``5 x duration_s + load_s`` of their service (its load time counted once);
      refused and failed requests miss it. ``weighted_slo``: the same, each request
      weighted by its service's priority (what the scheduler maximizes, and what
      ``yielding: auto`` compares).
    - ``cold_starts``: runtime loads started (retries after a failure included);
      ``cold_requests``: served requests that waited for a load (the runtime that served
      them became ready after they arrived);
      ``gb_loaded``: GiB of true peaks those loads brought in.
    - ``oom_loads``: loads that ran out of memory on the device;
      ``oom_loads_after_ready``: those of a service that had already been ready once in the
      run, so its true peak had been measured (vramd's ``no-oom`` target allows an
      out-of-memory load only while a peak is still being learned).
    - ``mem_avg_fraction``: memory really held, averaged over the trace (0 to its last
      arrival), as a fraction of ``plan_bytes`` over every device (what vramd hands out).

    ``by_priority`` and ``by_service`` hold the request figures per priority class and per
    service (``by_service`` adds ``cold_starts`` and ``oom_loads``); ``by_priority_unpinned``
    holds them per priority over the services that are not pinned (the ``top-p99`` target's
    set: a percentile of a union cannot be rebuilt from per-service percentiles).
    """
    records = list(rec.records.values())
    out = _request_figures(records, rec.setup)
    out["cold_starts"] = rec.loads
    out["cold_requests"] = sum(1 for r in records if r.cold and r.outcome == "served")
    out["gb_loaded"] = round(rec.bytes_loaded / GIB, 3)
    out["oom_loads"] = rec.oom_loads
    out["oom_loads_after_ready"] = rec.oom_loads_after_ready
    out["evictions"] = rec.evictions
    denominator = horizon * rec.setup.plan_bytes * rec.setup.devices
    out["mem_avg_fraction"] = byte_seconds / denominator if denominator > 0 else None
    classes: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.priority is not None:
            classes.setdefault(r.priority, []).append(r)
    out["by_priority"] = {
        str(p): _request_figures(classes[p], rec.setup) for p in sorted(classes, reverse=True)
    }
    unpinned: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.priority is None or r.service is None:
            continue
        if rec.setup.services[r.service].residency is not Residency.PINNED:
            unpinned.setdefault(r.priority, []).append(r)
    out["by_priority_unpinned"] = {
        str(p): _request_figures(unpinned[p], rec.setup) for p in sorted(unpinned, reverse=True)
    }
    services: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.service is not None:
            services.setdefault(r.service, []).append(r)
    out["by_service"] = {}
    for name in rec.setup.services:
        figures = _request_figures(services.get(name, []), rec.setup)
        figures["cold_starts"] = rec.loads_by_service.get(name, 0)
        figures["oom_loads"] = rec.oom_by_service.get(name, 0)
        out["by_service"][name] = figures
    return out
