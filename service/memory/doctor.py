"""Acting on memory findings: flags, cap actions, out-of-memory incidents and verdicts."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy.orm import Session

from service.adapters import find_oom
from service.clock import Clock
from service.domain import EventKind
from service.live.events import EventLog
from service.live.runtimes import RuntimeTable, ServiceRuntime
from service.memory.diagnosis import CapWatch, CreepConfig, DeviceFree, OomReport, diagnose_oom
from service.memory.sampling import LastReading
from service.memory.watch import Finding, InstanceWatch, Watches
from service.scheduler import Event, MakeRoom, RestartRequested, UnloadRequested
from service.settings import Settings
from service.store import StoreWriter, queries
from service.units import format_size

# The events an incident quotes: what happened in the minutes before it.
INCIDENT_HISTORY_S = 300.0
INCIDENT_EVENT_KINDS = frozenset(
    {
        EventKind.LOAD,
        EventKind.EVICT,
        EventKind.STATE,
        EventKind.REJECT,
        EventKind.REFUSE,
        EventKind.ADMIT,
        EventKind.FLAG,
    }
)


class Doctor:
    """See docs/operations.md ("Flags: what they mean and what to do", "Fragmentation versus
    capacity"). The sampler and the proxy report what they saw (a cap streak, a
    creeping series, an out-of-memory line or response, a load that died of OOM); the
    doctor turns each into a flag and an event, carries out the service's ``on_cap``, and
    leaves an incident record with the figures an operator needs to tell fragmentation from
    a capacity shortage or a competing workload. It acts through scheduler events only
    (``feed``), so every stop and restart still goes through admission like any other; it
    reads the runtime table and the last probe reading, never the orchestrator.
    (``memory.diagnosis`` classifies; this module acts on what it says.)
    """

    def __init__(
        self,
        *,
        writer: StoreWriter,
        events: EventLog,
        clock: Clock,
        settings: Settings,
        last: LastReading,
        runtimes: RuntimeTable,
        feed: Callable[[Event], None],
        gpu: bool,
    ) -> None:
        self._writer = writer
        self._events = events
        self._clock = clock
        self._settings = settings
        self._last = last
        self._runtimes = runtimes
        self._feed = feed
        # A GPU backend: host memory is its own series beside the device's.
        self._gpu = gpu
        self.watches = Watches()

    def start_watch(self, rt: ServiceRuntime) -> InstanceWatch:
        """A fresh watch for the instance that just became ready."""
        creep = CreepConfig(
            min_requests=self._settings.creep_min_requests,
            min_age_s=self._settings.creep_min_age_s,
            min_samples=self._settings.creep_min_samples,
        )
        watch = InstanceWatch(
            ready_at=self._clock.now(),
            requests_at_ready=rt.requests_served,
            cap=CapWatch(rt.spec.memory.cap),
            adapter=rt.adapter,
            creep=creep,
            host_series_too=self._gpu,
            log_mark=rt.log.mark(),
        )
        self.watches.start(rt.name, watch)
        return watch

    def end_watch(self, rt: ServiceRuntime) -> None:
        """The instance went or fell asleep: its memory series ends here."""
        self.watches.end(rt.name)

    # ------------------------------------------------------------------ findings

    def on_finding(self, rt: ServiceRuntime, finding: Finding) -> None:
        if finding.kind == "over-cap":
            self.flag(rt, "over-cap", finding.message)
            self._on_cap(rt)
        elif finding.kind == "creeping":
            self.flag(rt, "creeping", finding.message, series=finding.series)
        elif finding.kind == "oom":
            self.runtime_oom(rt, finding.text or finding.message, source="log")

    def flag(self, rt: ServiceRuntime, flag: str, message: str, **data: Any) -> None:
        """Raise ``flag`` on the service and record why (an event each time it is seen)."""
        new = flag not in rt.health.flags
        rt.health.flags.add(flag)
        self._events.record(
            EventKind.FLAG,
            f"{rt.name} flagged {flag}: {message}",
            service=rt.name,
            instance_id=rt.placement.instance_id,
            data={"flag": flag, "new": new, **data},
        )

    def clear_flags(self, rt: ServiceRuntime, flags: Iterable[str], why: str) -> None:
        """Clear those of ``flags`` the service has, with one ``flag-cleared`` event."""
        cleared = rt.health.flags & set(flags)
        if not cleared:
            return
        rt.health.flags -= cleared
        self._events.record(
            EventKind.FLAG_CLEARED,
            f"{rt.name}: {', '.join(sorted(cleared))} cleared by {why}",
            service=rt.name,
            data={"flags": sorted(cleared)},
        )

    def _on_cap(self, rt: ServiceRuntime) -> None:
        action = rt.spec.memory.on_cap.value
        cap = format_size(rt.spec.memory.cap)
        if action == "restart":
            self._feed(RestartRequested(rt.name, f"over its cap {cap} (on_cap: restart)"))
        elif action == "stop":
            self._events.record(
                EventKind.CAP_STOP,
                f"{rt.name} stopped: over its cap {cap} (on_cap: stop)",
                service=rt.name,
            )
            self._feed(UnloadRequested(rt.name))

    # ----------------------------------------------------------- out of memory

    def runtime_oom(self, rt: ServiceRuntime, text: str, *, source: str) -> None:
        """The runtime said out-of-memory while serving: fragmentation or capacity?"""
        device = self._device_free(rt)
        watch = self.watches.get(rt.name)
        samples = list(watch.device) if watch else []
        # What the failing request itself needed is unknown: runtimes do not report it,
        # and a body's size says little about its KV cache or image buffers.
        diagnosis = diagnose_oom(
            OomReport(self._clock.now(), text), device=DeviceFree(device), samples=samples
        )
        if diagnosis.kind == "fragmented":
            self.flag(rt, "fragmented", f"{diagnosis.reason} ({source}: {text})")
        # Incidents use one set of verdict names, for loads and requests alike.
        verdict = "fragmentation" if diagnosis.kind == "fragmented" else "capacity"
        incident = self.record_incident(
            rt, kind="request", verdict=verdict, summary=diagnosis.reason, oom_text=text
        )
        self._events.record(
            EventKind.OOM,
            f"{rt.name} reported out-of-memory ({source}): {diagnosis.kind}: {diagnosis.reason}",
            service=rt.name,
            data={"incident": incident, "verdict": verdict, "text": text},
        )

    def load_failed(
        self, rt: ServiceRuntime, error: str, *, output: str = "", retrying: bool
    ) -> None:
        """A start died. Out-of-memory gets one retry with everything evictable evicted.

        ``output`` is all the process printed: the out-of-memory line often comes well
        before the last lines that ``error`` quotes."""
        quoted = find_oom(rt.adapter, output) or find_oom(rt.adapter, error)
        if quoted is None:
            return
        if rt.health.oom_incident is not None:
            self.verdict(rt, retry_succeeded=False)
            return
        rt.health.oom_incident = self.record_incident(
            rt,
            kind="load",
            verdict=None,
            summary=f"load failed with out-of-memory: {quoted}",
            oom_text=quoted if quoted in error else f"{quoted}\n{error}",
        )
        if retrying:
            self._feed(MakeRoom(rt.name, "its load failed with out-of-memory"))
        else:
            self.verdict(rt, retry_succeeded=False)

    def verdict(self, rt: ServiceRuntime, *, retry_succeeded: bool) -> None:
        incident, rt.health.oom_incident = rt.health.oom_incident, None
        if incident is None:
            return
        verdict = "fragmentation" if retry_succeeded else "capacity"
        explanation = (
            "the retry fit once everything evictable was gone: the first failure was "
            "fragmentation or memory held by others, not a lack of capacity"
            if retry_succeeded
            else "it failed again with everything evictable gone: the device cannot hold it"
        )
        self._writer.put(
            lambda session: queries.set_incident_verdict(session, id=incident, verdict=verdict)
        )
        self._events.record(
            EventKind.VERDICT,
            f"{rt.name}: out-of-memory load diagnosed as {verdict}: {explanation}",
            service=rt.name,
            data={"incident": incident, "verdict": verdict},
        )

    # ----------------------------------------------------------------- incidents

    def record_incident(
        self,
        rt: ServiceRuntime,
        *,
        kind: str,
        verdict: str | None,
        summary: str,
        oom_text: str,
    ) -> int:
        """An incident with the figures docs/operations.md lists for one, taken now; its
        id at once (the store writer counts it), its row through the writer."""
        now = self._clock.now()
        reading = self._last.reading
        devices = [
            {
                "index": d.index,
                "total_bytes": d.total,
                "used_bytes": d.used,
                "free_bytes": d.free,
                "foreign_bytes": d.foreign,
                "managed_bytes": d.managed,
            }
            for d in (reading.devices if reading else ())
        ]
        instances = {
            name: {
                "state": other.instance.state.value,
                "device": other.placement.device,
                "devices": list(other.placement.devices),
                "device_bytes": other.measured.footprint,
                "bytes_by_device": {
                    str(d): b for d, b in sorted(other.measured.device_bytes.items())
                },
                "host_bytes": other.measured.host_bytes,
                "peak_bytes": other.measured.peak,
            }
            for name, other in self._runtimes.items()
            if other.instance.pid is not None
        }
        largest = max(rt.recent_requests, key=_body_bytes, default=None)
        recent = list(rt.recent_requests)[-10:]

        def record(session: Session, incident_id: int) -> None:
            # In the writer's thread, after every event recorded before this incident.
            history = queries.list_events(session, since_ts=now - INCIDENT_HISTORY_S, limit=200)
            data = {
                "oom_text": oom_text,
                "devices": devices,
                "instances": instances,
                "largest_recent_request": largest,
                "recent_requests": recent,
                "history": [
                    {"ts": e.ts, "kind": e.kind, "service": e.service, "message": e.message}
                    for e in history
                    if e.kind in INCIDENT_EVENT_KINDS
                ],
            }
            queries.record_incident(
                session,
                id=incident_id,
                ts=now,
                service=rt.name,
                kind=kind,
                summary=summary,
                data=data,
                verdict=verdict,
            )

        return self._writer.put_row("incidents", record)

    def _device_free(self, rt: ServiceRuntime) -> int:
        """Free memory where the instance runs; across a span, the least of its devices
        (the out-of-memory may have been on any: "free memory was there" must hold on
        each before it can be called fragmentation)."""
        reading = self._last.reading
        devices = rt.placement.devices or (rt.placement.device or 0,)
        free = [d.free for d in (reading.devices if reading else ()) if d.index in devices]
        return min(free, default=0)


def _body_bytes(shape: dict[str, object]) -> int:
    size = shape.get("body_bytes", 0)
    return size if isinstance(size, int) else 0
