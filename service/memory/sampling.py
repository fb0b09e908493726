"""Memory sampling: the probe's figures flowing back into the ledger and the database."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, Protocol

import httpx
from sqlalchemy.orm import Session

from service.clock import Clock
from service.devices import DeviceProbe
from service.domain import RESIDENT_STATES, InstanceState, ProbeReading
from service.errors import StoreError
from service.live.runtimes import RuntimeTable, ServiceRuntime
from service.memory.watch import Finding, Watches
from service.scheduler import (
    Event,
    Learned,
    LearnedChanged,
    LedgerView,
    MemorySampled,
    ServiceView,
    raised_peak,
)
from service.store import Store, StoreWriter, queries

log = logging.getLogger("vramd.sampling")
SLEEPING = InstanceState.SLEEPING

DOWNSAMPLE_EVERY_S = 60.0
# The learned peak is the highest footprint of the service's *recent* instances.
RECENT_INSTANCES = 5


async def _slots_kv(client: httpx.AsyncClient, path: str, rt: ServiceRuntime) -> float | None:
    response = await client.get(path, timeout=1.0)
    if response.status_code != 200:
        return None
    try:
        return rt.adapter.kv_from_slots(response.json())
    except ValueError:
        return None


def recent_peak(recent: Iterable[int | None], rt: ServiceRuntime) -> int | None:
    """The highest of the peaks of the service's last instances (``recent``), capped."""
    peaks = [peak for peak in recent if peak]
    if not peaks:
        return rt.measured.learned_peak
    cap = rt.spec.memory.cap
    return min(max(peaks), cap) if cap is not None else max(peaks)


def with_departing(reading: ProbeReading, departing: Iterable[Mapping[int, int]]) -> ProbeReading:
    """``reading`` with the memory of instances that exited but have not settled counted
    as managed, not foreign.

    Between a runtime's exit and the driver's release of its memory, NVML still counts
    the memory as used while no live process of ours holds it. Read as foreign, it would
    shrink every device's budget for the length of one sample, while the scheduler still
    charges the departing instance too: a load arriving then could be refused for good
    (it "can never fit") over memory that is on its way back.
    """
    extra: dict[int, int] = {}
    for held in departing:
        for device, size in held.items():
            extra[device] = extra.get(device, 0) + size
    if not extra:
        return reading
    devices = tuple(
        replace(d, managed=min(d.used, d.managed + extra.get(d.index, 0))) for d in reading.devices
    )
    return replace(reading, devices=devices)


class SchedulerView(Protocol):
    """What the sampler reads from the scheduler (``Scheduler`` has both)."""

    def service_view(self, name: str, now: float | None = None) -> ServiceView: ...

    def ledger_view(self, device: int) -> LedgerView | None: ...


@dataclass
class LastReading:
    """The latest probe reading, and when it was taken (monotonic)."""

    reading: ProbeReading | None = None
    at: float | None = None


class Sampler:
    """Every ``device.sample_interval`` the sampler reads the probe (in a worker thread: it
    walks the process table and may call the driver, and must not stall requests), hands
    the figures to the scheduler as a ``MemorySampled`` event, keeps each runtime's latest
    footprint and peak, raises a service's learned peak when an instance goes above it, and
    writes the samples to SQLite (downsampled there once a minute). Every write goes through
    the store writer, so a locked database delays the rows, never the loop.

    Its ports are narrow (docs/architecture.md): ``feed`` for the events it raises, a read-only
    view of the scheduler (a service's expected peak and load, a device's budget), the
    runtime table, and ``on_finding`` for what a runtime's memory watch notices (the
    doctor acts on those). The latest reading goes to a ``LastReading`` that the doctor,
    the status view and the liveness check read.
    """

    def __init__(
        self,
        *,
        feed: Callable[[Event], None],
        view: SchedulerView,
        runtimes: RuntimeTable,
        watches: Watches,
        on_finding: Callable[[ServiceRuntime, Finding], None],
        last: LastReading,
        probe: DeviceProbe,
        store: Store,
        writer: StoreWriter,
        clock: Clock,
        interval_s: float,
    ) -> None:
        self._feed = feed
        self._view = view
        self._runtimes = runtimes
        self._watches = watches
        self._on_finding = on_finding
        self._last = last
        self._probe = probe
        self._writer = writer
        self._clock = clock
        self.interval_s = interval_s
        # The peaks of each service's last RECENT_INSTANCES instances, newest first: the
        # learned peak follows them, read here rather than from SQLite on every exit.
        with store.read() as session:
            seed = queries.recent_peaks(session, per_service=RECENT_INSTANCES)
        self._recent_peaks = {
            name: deque(peaks, maxlen=RECENT_INSTANCES) for name, peaks in seed.items()
        }
        self._last_downsample = clock.monotonic()

    @property
    def last_reading(self) -> ProbeReading | None:
        return self._last.reading

    async def run(self) -> None:
        """Sample every interval for as long as the daemon runs. A reading that fails (a
        driver call, a /proc file of a process exiting under it) is logged and the next
        interval samples again: admission must not go on with memory figures that stopped
        changing because one reading failed."""
        failures = 0
        while True:
            await self._clock.sleep(self.interval_s)
            try:
                await self.sample_once()
            except StoreError as exc:
                log.error("samples not stored: %s", exc)
            except Exception:
                failures += 1
                if failures == 1:  # once per streak: a broken driver fails every interval
                    log.exception("memory sample failed; sampling again every %ss", self.interval_s)
                continue
            if failures:
                log.warning("memory sampling recovered after %d failed samples", failures)
                failures = 0

    def roots(self) -> dict[str, int]:
        """Every live instance's root pid by service: what a reading measures."""
        return {
            name: rt.instance.pid
            for name, rt in self._runtimes.items()
            # Sleepers too: what they keep on the device is ours, not foreign.
            if rt.instance.pid is not None
            and (rt.instance.state in RESIDENT_STATES or rt.instance.state is SLEEPING)
        }

    async def sample_once(self) -> None:
        runtimes = self._runtimes
        roots = self.roots()
        reading, _ = await asyncio.gather(
            asyncio.to_thread(self._probe.read, roots), self.scrape_metrics()
        )
        # Departed: not measured through a live tree any more (no double count).
        departed = [rt.placement.departing for name, rt in runtimes.items() if name not in roots]
        reading = with_departing(reading, departed)
        self._last.reading = reading
        self._last.at = self._clock.monotonic()
        footprints: dict[str, int] = {}
        per_device: dict[str, dict[int, int]] = {}
        for name, memory in reading.instances.items():
            rt = runtimes.get(name)
            if rt is None or name not in roots:
                continue
            rt.measured.footprint = memory.device_bytes
            rt.measured.host_bytes = memory.host_bytes
            rt.measured.device_bytes = dict(memory.per_device)
            if len(rt.placement.devices) > 1:
                per_device[name] = rt.measured.device_bytes
            if memory.pids:
                rt.measured.last_pids = memory.pids
            rt.measured.peak = max(rt.measured.peak, memory.device_bytes)
            footprints[name] = memory.device_bytes
            self._learn_peak(rt)
            self._watch(rt, memory.device_bytes, memory.host_bytes)
        self._feed(MemorySampled(reading.devices, footprints, per_device))
        self._store_samples(reading, footprints)
        if self._clock.monotonic() - self._last_downsample >= DOWNSAMPLE_EVERY_S:
            self._last_downsample = self._clock.monotonic()
            self._downsample()
            self.flush_counters()

    def _watch(self, rt: ServiceRuntime, device_bytes: int, host_bytes: int) -> None:
        watch = self._watches.get(rt.name)
        if watch is None:
            return
        findings = watch.observe(
            t=self._clock.now(),
            device_bytes=device_bytes,
            host_bytes=host_bytes,
            requests_served=rt.requests_served,
        )
        lines = rt.log.tail(rt.log.max_lines, since=watch.log_mark)
        watch.log_mark = rt.log.mark()
        findings += watch.scan_log([line.text for line in lines])
        for finding in findings:
            self._on_finding(rt, finding)

    async def scrape_metrics(self) -> None:
        """Runtime metrics of ready services that set ``metrics:``, and KV-cache use from
        the slot list of runtimes that publish no KV gauge but list their slots."""
        targets = [
            rt
            for rt in self._runtimes.values()
            if (rt.spec.metrics or rt.adapter.slots_path)
            and rt.client is not None
            and self._watches.get(rt.name)
        ]
        await asyncio.gather(*(self._scrape(rt) for rt in targets))

    async def _scrape(self, rt: ServiceRuntime) -> None:
        client, watch, path = rt.client, self._watches.get(rt.name), rt.spec.metrics
        if client is None or watch is None:
            return
        # A busy runtime may be slow to answer: the next sample tries again.
        with suppress(httpx.HTTPError):
            if path is not None:
                response = await client.get(path, timeout=1.0)
                if response.status_code == 200:
                    watch.metrics = rt.adapter.parse_metrics(response.text)
            slots = rt.adapter.slots_path
            if slots is not None and (
                watch.metrics is None or watch.metrics.kv_cache_usage_ratio is None
            ):
                watch.slots_kv = await _slots_kv(client, slots, rt)

    def _learn_peak(self, rt: ServiceRuntime) -> None:
        learned = self._view.service_view(rt.name)
        current = learned.expected_peak
        memory = rt.spec.memory
        peak = raised_peak(
            rt.measured.peak, estimate=memory.estimate, cap=memory.cap, expected=current
        )
        if peak is None:
            return
        rt.measured.learned_peak = peak
        name, now = rt.name, self._clock.now()
        self._writer.put(
            lambda session: queries.update_stats(
                session, service=name, learned_peak_bytes=peak, updated_at=now
            )
        )
        self._feed(LearnedChanged(rt.name, Learned(peak, rt.measured.learned_load_s)))

    def _store_samples(self, reading: ProbeReading, footprints: dict[str, int]) -> None:
        now = self._clock.now()
        device_rows = []
        for device in reading.devices:
            ledger = self._view.ledger_view(device.index)
            device_rows.append(
                {
                    "ts": now,
                    "device": device.index,
                    "total_bytes": device.total,
                    "used_bytes": device.used,
                    "free_bytes": device.free,
                    "foreign_bytes": device.foreign,
                    "budget_bytes": ledger.budget if ledger else 0,
                }
            )
        instance_rows = []
        for name in footprints:
            rt = self._runtimes[name]
            view = self._view.service_view(name)
            instance_rows.append(
                {
                    "ts": now,
                    "service": name,
                    "instance_id": rt.placement.instance_id or 0,
                    "device_bytes": rt.measured.footprint,
                    "host_bytes": rt.measured.host_bytes,
                    "kv_cache_bytes": None,
                    "in_flight": view.in_flight,
                    "requests_served": rt.requests_served,
                }
            )

        def write(session: Session) -> None:
            queries.add_device_samples(session, rows=device_rows)
            if instance_rows:
                queries.add_instance_samples(session, rows=instance_rows)

        self._writer.put(write)

    def _downsample(self) -> None:
        now = self._clock.now()
        self._writer.put(lambda session: queries.downsample(session, now=now))

    # ------------------------------------------------------ records of instance life

    # The memory figures of the live record (footprint, host_bytes, device_bytes, peak,
    # last_pids) are the sampler's: the kernel tells it of the moments that reset them.

    def instance_starting(self, rt: ServiceRuntime) -> None:
        """A new instance (not a retry of the same start): its peak starts afresh."""
        rt.measured.peak = 0

    def process_spawned(self, rt: ServiceRuntime, pid: int) -> None:
        """Until the first sample finds its tree, the instance is its leader."""
        rt.measured.last_pids = (pid,)

    def instance_released(self, rt: ServiceRuntime) -> None:
        """Its memory is back (the settle barrier's verdict): it holds nothing now."""
        rt.measured.footprint = rt.measured.host_bytes = 0
        rt.measured.device_bytes = {}

    def record_ready(self, rt: ServiceRuntime) -> None:
        load_s = rt.instance.load_s
        if load_s is not None:
            # A moving average: one slow cold start does not define the service.
            old = rt.measured.learned_load_s
            rt.measured.learned_load_s = load_s if old is None else 0.7 * old + 0.3 * load_s
        name, instance_id, learned_load_s = (
            rt.name,
            rt.placement.instance_id,
            rt.measured.learned_load_s,
        )
        ready_at = self._clock.now()

        def write(session: Session) -> None:
            if instance_id is not None:
                queries.record_instance_ready(session, instance_id=instance_id, ready_at=ready_at)
            if load_s is not None:
                queries.update_stats(session, service=name, learned_load_s=learned_load_s)

        self._writer.put(write)
        if load_s is not None:
            self._feed(
                LearnedChanged(
                    rt.name, Learned(rt.measured.learned_peak, rt.measured.learned_load_s)
                )
            )

    def record_exit(self, rt: ServiceRuntime, reason: str) -> None:
        instance_id = rt.placement.instance_id
        if instance_id is None:
            return
        name, peak = rt.name, rt.measured.peak or None
        stopped_at, exit_code = self._clock.now(), rt.instance.exit_code
        self._writer.put(
            lambda session: queries.record_instance_exit(
                session,
                instance_id=instance_id,
                stopped_at=stopped_at,
                exit_code=exit_code,
                reason=reason,
                peak_bytes=peak,
            )
        )
        recent = self._recent_peaks.setdefault(name, deque(maxlen=RECENT_INSTANCES))
        recent.appendleft(peak)
        learned = recent_peak(recent, rt)
        if learned == rt.measured.learned_peak:
            return
        rt.measured.learned_peak = learned
        self._writer.put(
            lambda session: queries.update_stats(session, service=name, learned_peak_bytes=learned)
        )
        # The learned peak follows recent instances, so one old spike is forgotten.
        self._feed(LearnedChanged(rt.name, Learned(learned, rt.measured.learned_load_s)))

    def flush_counters(self) -> None:
        """Persist the in-memory counters and flags (kept off the request path)."""
        now = self._clock.now()
        rows: dict[str, dict[str, Any]] = {}
        for rt in self._runtimes.values():
            placement = rt.placement
            fields: dict[str, Any] = {
                "requests_served": rt.requests_served,
                "loads": placement.loads,
                "evictions": placement.evictions,
                "restarts": placement.restarts,
            }
            fields["flags"] = sorted(rt.health.flags)
            fields["last_error"] = rt.instance.last_error
            fields["updated_at"] = now
            rows[rt.name] = fields

        def write(session: Session) -> None:
            for name, fields in rows.items():
                queries.update_stats(session, service=name, **fields)

        self._writer.put(write)
