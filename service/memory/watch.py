"""Watching one live instance: its memory series, cap streak, creep, OOM lines, metrics.

An ``InstanceWatch`` is created when an instance becomes ready and dropped when it goes:
flags describe one instance. The sampler feeds it every sample; it answers with
``Finding``s (over its cap, creeping, out-of-memory in its log) and the orchestrator
decides what each one means. The judgements themselves are the pure functions of
``service.memory.diagnosis``; this module only keeps the series and the bookkeeping.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from service.adapters import Adapter, RuntimeMetrics, find_oom
from service.memory.diagnosis import CapWatch, CreepConfig, Sample, detect_creep
from service.units import format_size

# About 15 minutes at one sample a second: enough for creep's window of 120.
SERIES_LEN = 900
CREEP_EVERY = 5  # samples between creep checks (each is a few milliseconds)
STABLE_SAMPLES = 3  # samples after ready before the footprint counts as "weights"


@dataclass(frozen=True)
class Finding:
    kind: str  # "over-cap" | "creeping" | "oom"
    message: str
    series: str = "device"  # which memory: "device" or "host"
    text: str | None = None  # the runtime's own words, for "oom"


@dataclass
class InstanceWatch:
    ready_at: float
    requests_at_ready: int
    cap: CapWatch
    adapter: Adapter
    creep: CreepConfig
    host_series_too: bool
    log_mark: int
    device: deque[Sample] = field(default_factory=lambda: deque(maxlen=SERIES_LEN))
    host: deque[Sample] = field(default_factory=lambda: deque(maxlen=SERIES_LEN))
    weights_bytes: int | None = None
    metrics: RuntimeMetrics | None = None
    # KV-cache use from the runtime's slot list, where its metrics carry no KV gauge.
    slots_kv: float | None = None
    reported: set[str] = field(default_factory=set)

    @property
    def kv_usage(self) -> float | None:
        """KV-cache use, 0..1: the runtime's own gauge, else what its slots hold."""
        gauge = self.metrics.kv_cache_usage_ratio if self.metrics else None
        return gauge if gauge is not None else self.slots_kv

    def observe(
        self, *, t: float, device_bytes: int, host_bytes: int, requests_served: int
    ) -> list[Finding]:
        """Add one sample; return what it newly shows."""
        served = max(0, requests_served - self.requests_at_ready)
        self.device.append(Sample(t, device_bytes, served))
        self.host.append(Sample(t, host_bytes, served))
        if self.weights_bytes is None and len(self.device) >= STABLE_SAMPLES:
            self.weights_bytes = self.device[-1].bytes
        findings = []
        if self.cap.observe(device_bytes):
            findings.append(
                Finding(
                    "over-cap",
                    f"footprint {format_size(device_bytes)} above its cap "
                    f"{format_size(self.cap.cap)} for {self.cap.needed} samples in a row",
                )
            )
        if len(self.device) % CREEP_EVERY == 0:
            findings += self._creep("device", self.device)
            if self.host_series_too:
                findings += self._creep("host", self.host)
        return findings

    def _creep(self, name: str, series: deque[Sample]) -> list[Finding]:
        verdict = detect_creep(list(series), ready_at=self.ready_at, config=self.creep)
        if not verdict.creeping or f"creeping:{name}" in self.reported:
            return []
        self.reported.add(f"creeping:{name}")
        return [Finding("creeping", f"{name} memory {verdict.reason}", series=name)]

    def scan_log(self, lines: list[str]) -> list[Finding]:
        """Out-of-memory reports among the runtime's new output lines."""
        findings = []
        for line in lines:
            quoted = find_oom(self.adapter, line)
            if quoted:
                findings.append(Finding("oom", "the runtime logged out-of-memory", text=quoted))
        return findings

    def growth_bytes(self) -> int | None:
        """Footprint above the first stable sample: KV cache, pools and anything leaked."""
        if self.weights_bytes is None or not self.device:
            return None
        return max(0, self.device[-1].bytes - self.weights_bytes)


class Watches:
    """The watch of each live instance, by service name: one per ready instance.

    The doctor starts one when an instance becomes ready and ends it when the instance
    goes or falls asleep (flags and series describe one instance); the sampler feeds
    them, and the views and the doctor read them.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, InstanceWatch] = {}

    def get(self, name: str) -> InstanceWatch | None:
        return self._by_name.get(name)

    def start(self, name: str, watch: InstanceWatch) -> None:
        self._by_name[name] = watch

    def end(self, name: str) -> None:
        self._by_name.pop(name, None)
