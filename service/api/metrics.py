"""Prometheus metrics for ``GET /metrics``: a router's series first, then vramd's own."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from service.api.exposition import family_text
from service.api.router_metrics import router_exposition
from service.contract import DeviceStatus, ServiceStatus, Status, YieldingView
from service.domain import Flag, InstanceState
from service.kernel.views import NodeLoad
from service.live.usage import Usage

log = logging.getLogger("vramd.metrics")

StatusSource = Callable[[], Status]
NodeLoadSource = Callable[[], NodeLoad]
# Usage since the daemon started, by (client, service): configured clients only, so the
# series stay bounded whatever names unkeyed callers give themselves.
ClientUsageSource = Callable[[], Mapping[tuple[str, str], Usage]]
# ``GET /api/scheduler``'s ``yielding`` view.
YieldingSource = Callable[[], YieldingView]

# A scrape renders vramd's own series itself when the snapshot is older than this many
# sampler intervals (nobody scraped lately, so nothing kept it fresh).
STALE_AFTER = 2.5
# The snapshot is renewed in the background while a scrape came this recently.
WATCHED_FOR_S = 60.0

STATES = tuple(state.value for state in InstanceState)
FLAGS = tuple(flag.value for flag in Flag)

# (metric suffix, status field, help)
DEVICE_GAUGES = (
    ("total", "total_bytes", "Device memory in total."),
    ("used", "used_bytes", "Device memory in use, by anyone."),
    ("free", "free_bytes", "Device memory free."),
    ("foreign", "foreign_bytes", "Device memory used by processes vramd does not manage."),
    ("budget", "budget_bytes", "Memory vramd may hand out on the device (after headroom)."),
    ("headroom", "headroom_bytes", "Memory kept free on the device (device.headroom)."),
    ("available", "available_bytes", "Budget not yet charged to a service; may be negative."),
)
SERVICE_GAUGES = (
    ("footprint", "footprint_bytes", "Measured device memory of the service's processes."),
    ("host", "host_bytes", "Measured host memory (PSS) of the service's processes."),
    ("expected_peak", "expected_peak_bytes", "Peak the scheduler plans for."),
    ("learned_peak", "learned_peak_bytes", "Highest footprint seen across loads."),
    ("estimate", "estimate_bytes", "The policy's memory.estimate."),
    ("cap", "cap_bytes", "The policy's memory.cap (absent when none is set)."),
)
SERVICE_COUNTERS = (
    ("loads", "Times the service was started."),
    ("evictions", "Times the service was stopped to make room for another."),
    ("restarts", "Times the service was restarted after a crash."),
)

# Spawn to ready: a tiny model in a fraction of a second, a large one in minutes.
LOAD_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
# Arrival to slot: no wait at all, a busy runtime, a cold start, a long queue.
QUEUE_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def status_families(status: Status, *, version: str, backend: str | None) -> Iterator[Metric]:
    """Gauges and counters of one status view (``GET /api/status``'s shape)."""
    info = GaugeMetricFamily(
        "vramd_info", "vramd build and device backend.", labels=["version", "backend"]
    )
    info.add_metric([version, backend or status.backend or ""], 1)
    yield info
    yield from _device_metrics(status.devices)
    yield from _service_metrics(status.services)


def _device_metrics(devices: Iterable[DeviceStatus]) -> Iterator[Metric]:
    families = [
        (field, GaugeMetricFamily(f"vramd_device_{name}_bytes", help_, labels=["device"]))
        for name, field, help_ in DEVICE_GAUGES
    ]
    for device in devices:
        labels = [str(device.index)]
        for field, family in families:
            value = getattr(device, field)
            if value is not None:
                family.add_metric(labels, value)
    for _, family in families:
        yield family


def _service_metrics(services: Iterable[ServiceStatus]) -> Iterator[Metric]:
    services = list(services)
    for name, field, help_ in SERVICE_GAUGES:
        family = GaugeMetricFamily(f"vramd_service_{name}_bytes", help_, labels=["service"])
        for svc in services:
            if getattr(svc, field) is not None:
                family.add_metric([svc.name], getattr(svc, field))
        yield family

    state = GaugeMetricFamily(
        "vramd_service_state",
        "The service's state: 1 for the current one, 0 for the others.",
        labels=["service", "state"],
    )
    flag = GaugeMetricFamily(
        "vramd_service_flag",
        "1 while the flag is raised on the service.",
        labels=["service", "flag"],
    )
    in_flight = GaugeMetricFamily(
        "vramd_service_in_flight", "Requests being served.", labels=["service"]
    )
    queued = GaugeMetricFamily(
        "vramd_service_queued", "Requests waiting for a slot.", labels=["service"]
    )
    waiting = GaugeMetricFamily(
        "vramd_service_waiting_for_memory",
        "1 while a load of the service waits for memory others hold.",
        labels=["service"],
    )
    for svc in services:
        name = svc.name
        waiting.add_metric([name], 1 if svc.waiting_for_memory else 0)
        for value in STATES:
            state.add_metric([name, value], 1 if svc.state == value else 0)
        raised = set(svc.flags)
        for value in FLAGS:
            flag.add_metric([name, value], 1 if value in raised else 0)
        in_flight.add_metric([name], svc.in_flight)
        queued.add_metric([name], svc.queued)
    yield from (state, flag, in_flight, queued, waiting)
    yield from _per_device_metrics(services)
    yield from _saved_state_metrics(services)

    for key, help_ in SERVICE_COUNTERS:
        counter = CounterMetricFamily(f"vramd_service_{key}", help_, labels=["service"])
        for svc in services:
            counter.add_metric([svc.name], getattr(svc, key))
        yield counter


def _saved_state_metrics(services: list[ServiceStatus]) -> Iterator[Metric]:
    """State across swaps, for the services that keep it (docs/policy.md)."""
    saved = GaugeMetricFamily(
        "vramd_state_saved_bytes", "Bytes of saved slot state on disk.", labels=["service"]
    )
    reused = CounterMetricFamily(
        "vramd_state_tokens_not_reprocessed",
        "Prompt tokens requests took from restored state instead of processing them again.",
        labels=["service"],
    )
    for svc in services:
        state = svc.saved_state
        if state is not None:
            saved.add_metric([svc.name], state.saved_bytes)
            reused.add_metric([svc.name], state.tokens_not_reprocessed)
    yield from (saved, reused)


def _per_device_metrics(services: list[ServiceStatus]) -> Iterator[Metric]:
    """Each service's measured and charged bytes on every device it is on (``span: N``
    gives one series per device; the totals are the ``vramd_service_*_bytes`` above)."""
    for name, field, help_ in (
        ("footprint", "device_bytes", "Measured memory of the service on one device."),
        ("charge", "charge_by_device", "Memory admission charges the service on one device."),
    ):
        family = GaugeMetricFamily(
            f"vramd_service_device_{name}_bytes", help_, labels=["service", "device"]
        )
        for svc in services:
            figures: dict[str, int] = getattr(svc, field)
            for device, value in figures.items():
                family.add_metric([svc.name, device], value)
        yield family


def yielding_families(view: YieldingView) -> Iterator[Metric]:
    """How each service yields now, and what ``yielding: auto``'s rounds have cost."""
    setting = GaugeMetricFamily(
        "vramd_service_yielding",
        "1 for the setting each service yields by now (auto: what it stands for).",
        labels=["service", "setting"],
    )
    for service, label in sorted(view.services.items()):
        setting.add_metric([service, label], 1)
    yield setting
    rounds = CounterMetricFamily("vramd_tuning_rounds", "yielding: auto rounds since start.")
    rounds.add_metric([], view.rounds)
    yield rounds
    cpu = CounterMetricFamily(
        "vramd_tuning_cpu_seconds", "CPU seconds of those rounds' replays, all together."
    )
    cpu.add_metric([], view.cpu_s)
    yield cpu


def client_families(usage: Mapping[tuple[str, str], Usage]) -> Iterator[Metric]:
    """Each configured client's use of each service since the daemon started."""
    labels = ["client", "service"]
    requests = CounterMetricFamily(
        "vramd_client_requests",
        "Requests by client and service, however they ended.",
        labels=labels,
    )
    errors = CounterMetricFamily(
        "vramd_client_errors", "Requests that did not end ok, by code.", labels=[*labels, "code"]
    )
    tokens = CounterMetricFamily(
        "vramd_client_tokens",
        "Tokens the runtimes reported (direction: in, the prompt; out, the answer).",
        labels=[*labels, "direction"],
    )
    runtime = CounterMetricFamily(
        "vramd_client_runtime_seconds", "Seconds requests held a runtime's slot.", labels=labels
    )
    images = CounterMetricFamily("vramd_client_images", "Images the runtimes made.", labels=labels)
    audio = CounterMetricFamily(
        "vramd_client_audio_seconds", "Seconds of audio transcribed or spoken.", labels=labels
    )
    for (client, service), use in sorted(usage.items()):
        key = [client, service]
        requests.add_metric(key, use.requests)
        for code, count in sorted(use.errors.items()):
            errors.add_metric([*key, code], count)
        tokens.add_metric([*key, "in"], use.tokens_in)
        tokens.add_metric([*key, "out"], use.tokens_out)
        runtime.add_metric(key, use.runtime_s)
        images.add_metric(key, use.images)
        audio.add_metric(key, use.audio_s)
    yield from (requests, errors, tokens, runtime, images, audio)


@dataclass(frozen=True, slots=True)
class Snapshot:
    body: bytes
    taken_at: float  # monotonic seconds


class Metrics:
    """What ``GET /metrics`` answers, and the calls that feed its live series.

    ``status`` gives the orchestrator's status view, ``node_load`` the figures of the
    router's series (none: those series are left out); ``refresh_s`` is the sampler's
    interval, the age the snapshot of vramd's own series is kept to while scraped.

    A scrape never asks a device or a runtime: every series is made of state the sampler and
    the kernel keep, so ``/metrics`` answers in milliseconds while a driver call hangs. Two
    parts, as fresh as their readers need (docs/api.md, "GET /metrics"):

    - The model-server protocol a cluster router scores machines by, 20 times a second
      (``vllm:*``, then ``vramd_model_*``): written at each scrape from the kernel's counts
      (``service.api.router_metrics``).
    - vramd's own series (below), for Prometheus and dashboards: a snapshot, renewed once
      per ``device.sample_interval`` while someone scrapes (``keep_fresh``, one family at a
      time so a scrape waits for one family at most), and at a scrape that finds it older
      than ``STALE_AFTER`` intervals (the first one, or after nobody asked for a while).
      Gauges and the load/eviction/restart counters come from the orchestrator's status
      view (``status_families``); what happens between samples (each request's outcome,
      queue wait and load time) is counted by live instruments that the kernel updates
      through ``Metrics.request_done`` and ``Metrics.load_done``.

    Writing all of vramd's series takes milliseconds on a twenty-service policy (~650
    samples): at a router's 20 Hz that would be a slow answer whenever the loop is busy and
    a large share of a core. The snapshot costs that once a sample interval, and the text is
    written by ``service.api.exposition``, not by prometheus-client's slower
    ``generate_latest``.

    Each ``Metrics`` has its own ``CollectorRegistry``, never prometheus-client's global
    default, so tests can build many apps in one process.

    ``/metrics`` is not behind the admin key: Prometheus scrapers rarely send one. It exposes
    service and model names, states and memory figures (nothing that changes anything, and
    neither keys nor prompts); where that is too much, keep the port off the network or put
    the scrape behind a proxy that checks its own credentials.

    vramd's own series (``device`` is the device index, ``service`` the service name)::

        vramd_info{version, backend}                                   1
        vramd_device_{total,used,free,foreign,budget,headroom,available}_bytes{device}
        vramd_service_{footprint,host,expected_peak,learned_peak,estimate,cap}_bytes{service}
        vramd_service_device_{footprint,charge}_bytes{service, device}  per device it is on
        vramd_service_state{service, state}            1 for the current state, 0 for others
        vramd_service_flag{service, flag}              1 when the flag is raised
        vramd_service_in_flight{service}, vramd_service_queued{service}
        vramd_service_{loads,evictions,restarts}_total{service}        counters
        vramd_requests_total{service, code}                            counter (live)
        vramd_load_seconds{service}                    histogram, spawn to ready (live)
        vramd_queue_wait_seconds{service}              histogram, arrival to slot (live)
        vramd_client_requests_total{client, service}   counters per configured client
        vramd_client_errors_total{client, service, code}
        vramd_client_tokens_total{client, service, direction}          direction: in, out
        vramd_client_runtime_seconds_total{client, service}
        vramd_client_images_total{client, service}, vramd_client_audio_seconds_total{...}
    """

    def __init__(
        self,
        status: StatusSource,
        *,
        version: str,
        backend: str | None = None,
        node_load: NodeLoadSource | None = None,
        client_usage: ClientUsageSource | None = None,
        yielding: YieldingSource | None = None,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # The live instruments only: the status view's families are made per rendering.
        self.registry = CollectorRegistry()
        self._status = status
        self._version = version
        self._backend = backend
        self._node_load = node_load
        self._client_usage = client_usage
        self._yielding = yielding
        self._refresh_s = refresh_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._snapshot: Snapshot | None = None
        self._scraped_at: float | None = None
        self._requests = Counter(
            "vramd_requests",
            "Requests to /v1 by service and outcome (ok, upstream_error, client_gone, "
            "runtime_failed, runtime_timeout, queue_full, queue_timeout, "
            "insufficient_capacity, window_closed, model_not_found, ...).",
            ["service", "code"],
            registry=self.registry,
        )
        self._load_seconds = Histogram(
            "vramd_load_seconds",
            "Time from spawning a runtime to its first healthy answer.",
            ["service"],
            buckets=LOAD_BUCKETS,
            registry=self.registry,
        )
        self._queue_wait = Histogram(
            "vramd_queue_wait_seconds",
            "Time a request waited for a slot (queue and cold start included).",
            ["service"],
            buckets=QUEUE_BUCKETS,
            registry=self.registry,
        )
        self._request_counters: dict[tuple[str, str], Counter] = {}
        self._queue_histograms: dict[str, Histogram] = {}

    def request_done(self, service: str, code: str, queue_s: float | None = None) -> None:
        """One request ended with ``code``; ``queue_s`` is its wait, when it had one."""
        # Called for every request: the labelled children are looked up once each, since
        # labels() checks and joins its arguments under a lock on every call.
        counter = self._request_counters.get((service, code))
        if counter is None:
            counter = self._request_counters[service, code] = self._requests.labels(
                service=service, code=code
            )
        counter.inc()
        if queue_s is not None:
            histogram = self._queue_histograms.get(service)
            if histogram is None:
                histogram = self._queue_histograms[service] = self._queue_wait.labels(
                    service=service
                )
            histogram.observe(max(0.0, queue_s))

    def load_done(self, service: str, seconds: float) -> None:
        """A runtime of ``service`` became ready ``seconds`` after it was spawned."""
        self._load_seconds.labels(service=service).observe(max(0.0, seconds))

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every series, and its content type."""
        now = self._clock()
        self._scraped_at = now
        snapshot = self._snapshot
        if snapshot is None or now - snapshot.taken_at > STALE_AFTER * self._refresh_s:
            snapshot = self._snapshot = Snapshot(
                "".join(map(family_text, self._families(self._status()))).encode(), now
            )
        head = b""
        if self._node_load is not None:
            head = router_exposition(self._node_load(), self._wall_clock()).encode()
        return head + snapshot.body, CONTENT_TYPE_LATEST

    async def keep_fresh(self) -> None:
        """Renew the snapshot every ``refresh_s`` while someone scrapes (a task, until
        cancelled), one family at a time: a scrape waits for one family, not for all."""
        while True:
            await asyncio.sleep(self._refresh_s)
            scraped = self._scraped_at
            if scraped is None or self._clock() - scraped > WATCHED_FOR_S:
                continue
            try:
                taken_at, parts = self._clock(), []
                for family in self._families(self._status()):
                    parts.append(family_text(family))
                    await asyncio.sleep(0)
                self._snapshot = Snapshot("".join(parts).encode(), taken_at)
            except Exception:  # a bug in a view: keep the last snapshot, say so, go on
                log.exception("the /metrics snapshot was not renewed")

    def _families(self, status: Status) -> Iterator[Metric]:
        """vramd's own families: the status view's, then the live instruments'."""
        yield from status_families(status, version=self._version, backend=self._backend)
        yield from self.registry.collect()
        if self._client_usage is not None:
            yield from client_families(self._client_usage())
        if self._yielding is not None:
            yield from yielding_families(self._yielding())
