"""Each service's live runtime: its instance, client and the parts only one module
writes; and the table of them all. The launch arithmetic is the supervisor's
(``supervisor.launch``).
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.adapters import Adapter
from service.clock import Clock
from service.domain import InstanceState
from service.policy import Service
from service.supervisor import (
    Instance,
    LogRing,
    ProcessLauncher,
    RestartPolicy,
)
from service.supervisor.launch import adapter_for, fit_target_mib

# One pool per instance: keep-alive connections to one loopback port. Generous limits:
# admission, not the pool, bounds concurrency.
POOL_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)
# Runtimes are plain HTTP on loopback. httpx would otherwise load the system's CA bundle
# for every new pool (~40 ms of the event loop), on the path of each cold start's first
# request; one context, never used for a handshake, serves every pool.
_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def fit_target_for(
    rt: ServiceRuntime,
    devices: Sequence[int],
    free: Mapping[int, int],
    starting: Iterable[ServiceRuntime],
) -> tuple[int, ...]:
    """``rt``'s ``LLAMA_ARG_FIT_TARGET`` on ``devices`` (docs/policy.md, "Runtimes sized
    inside their cap"), from each device's ``free`` memory; empty if one is unknown.

    What each of the other instances ``starting`` will still take is its size (cap, else
    learned peak, else estimate) times its share of the device, less what it already
    holds there.
    """
    if not devices or not all(device in free for device in devices):
        return ()
    others = [0] * len(devices)
    for other in starting:
        if other is rt:
            continue
        for share, device in zip(
            _shares(other, len(other.placement.devices)), other.placement.devices, strict=True
        ):
            if device in devices:
                left = share * _sized(other) - other.measured.device_bytes.get(device, 0)
                others[list(devices).index(device)] += max(0, int(left))
    own = [int(share * _sized(rt)) for share in _shares(rt, len(devices))]
    return fit_target_mib([free[d] for d in devices], others, own)


def _sized(rt: ServiceRuntime) -> int:
    spec = rt.spec
    return spec.memory.cap or rt.measured.learned_peak or spec.memory.estimate


def _shares(rt: ServiceRuntime, n: int) -> tuple[float, ...]:
    shares = rt.spec.shares
    return shares if len(shares) == n else (1.0 / max(n, 1),) * n


@dataclass
class Placement:
    """Where the instance runs and what loading it has cost. Written by the kernel's
    effects only (spawn, adoption, stop, the instance's transitions)."""

    device: int | None = None
    # Every device of the instance (``device`` is the first).
    devices: tuple[int, ...] = ()
    # Between its exit and the settle barrier's verdict: what the instance held on each
    # device (the driver may still list it; that memory is ours, not foreign).
    departing: dict[int, int] = field(default_factory=dict)
    instance_id: int | None = None
    last_load_s: float | None = None
    loads: int = 0
    evictions: int = 0
    restarts: int = 0


@dataclass
class Measured:
    """What the probe measured of the instance, and what past instances showed. Written
    by the sampler only (``memory.sampling``); the effects tell it of starts and exits."""

    footprint: int = 0
    host_bytes: int = 0
    device_bytes: dict[int, int] = field(default_factory=dict)
    peak: int = 0
    last_pids: tuple[int, ...] = ()
    learned_peak: int | None = None
    learned_load_s: float | None = None


@dataclass
class Health:
    """What the doctor (``memory.doctor``) concluded: the flags raised, and an
    out-of-memory load awaiting its retry's verdict (the incident's id)."""

    flags: set[str] = field(default_factory=set)
    oom_incident: int | None = None


@dataclass
class ServiceRuntime:
    """Everything live about one service. Each part has one writer: ``placement`` the
    kernel's effects, ``measured`` the sampler, ``health`` the doctor; ``spec``,
    ``retired``, ``requests_served`` and ``recent_requests`` the orchestrator;
    ``client``/``base_url`` this record's own ``open_client`` / ``close_client``
    (tests/unit/test_architecture.py holds them to it). Counters and learned figures
    are seeded from SQLite before anything runs (``app.restore_stats``)."""

    name: str
    spec: Service
    instance: Instance
    log: LogRing
    client: httpx.AsyncClient | None = None
    base_url: str | None = None
    placement: Placement = field(default_factory=Placement)
    measured: Measured = field(default_factory=Measured)
    health: Health = field(default_factory=Health)
    # Removed from the policy: dropped from the table once its process is gone.
    retired: bool = False
    requests_served: int = 0
    # The last requests' shapes (body size, max_tokens...), for incident records.
    recent_requests: deque[dict[str, object]] = field(default_factory=lambda: deque(maxlen=50))

    @property
    def adapter(self) -> Adapter:
        return adapter_for(self.spec)

    @property
    def exit_grace_s(self) -> float:
        """How long a stop waits after SIGTERM before it kills: the service's
        ``stop_timeout``, or less where its runtime is known to exit faster or hang."""
        grace = self.adapter.exit_grace_s
        return self.spec.stop_timeout if grace is None else min(grace, self.spec.stop_timeout)

    def open_client(self, port: int) -> None:
        """A keep-alive pool for the instance that just became ready (kept over a sleep)."""
        if self.client is not None and self.base_url == f"http://127.0.0.1:{port}":
            return
        self.base_url = f"http://127.0.0.1:{port}"
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            limits=POOL_LIMITS,
            timeout=httpx.Timeout(600.0),
            verify=_NO_TLS,
        )

    async def close_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.aclose()

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.instance.state.value, "pid": self.instance.pid}


# Told of every instance transition: (runtime, old state, new state, reason).
StateObserver = Callable[[ServiceRuntime, InstanceState, InstanceState, str], None]


class RuntimeTable:
    """Every service's ``ServiceRuntime`` by name, and the only code that makes them.

    Instances restart only when their owner starts them again: a retry after backoff is
    the scheduler's decision.
    """

    def __init__(
        self,
        specs: dict[str, Service],
        *,
        launcher: ProcessLauncher,
        clock: Clock,
        http: httpx.AsyncClient,
    ) -> None:
        self._launcher = launcher
        self._clock = clock
        self._http = http  # health polls of every instance
        self._observer: StateObserver | None = None
        self._runtimes: dict[str, ServiceRuntime] = {}
        for name, spec in specs.items():
            self.add(name, spec)

    @property
    def http(self) -> httpx.AsyncClient:
        """The client health checks go through."""
        return self._http

    def observe(self, observer: StateObserver) -> None:
        self._observer = observer

    def add(self, name: str, spec: Service) -> ServiceRuntime:
        ring = LogRing()
        restart = RestartPolicy(
            max_retries=spec.restart.max_retries,
            backoff_s=spec.restart.backoff,
            max_backoff_s=max(spec.restart.max_backoff, spec.restart.backoff),
        )
        holder: list[ServiceRuntime] = []
        instance = Instance(
            name,
            launcher=self._launcher,
            clock=self._clock,
            http=self._http,
            log=ring,
            on_state=lambda inst, old, new, why: self._changed(holder[0], old, new, why),
            restart_policy=restart,
        )
        rt = ServiceRuntime(name=name, spec=spec, instance=instance, log=ring)
        holder.append(rt)
        self._runtimes[name] = rt
        return rt

    async def aclose(self) -> None:
        """Close every instance's pooled client and the health-poll client."""
        for rt in self.values():
            await rt.close_client()
        await self._http.aclose()

    def drop(self, rt: ServiceRuntime) -> None:
        """Forget ``rt`` (a removed service whose process is gone)."""
        if self._runtimes.get(rt.name) is rt:
            del self._runtimes[rt.name]

    def _changed(
        self, rt: ServiceRuntime, old: InstanceState, new: InstanceState, why: str
    ) -> None:
        if self._observer is not None:
            self._observer(rt, old, new, why)

    def __getitem__(self, name: str) -> ServiceRuntime:
        return self._runtimes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._runtimes

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._runtimes))

    def __len__(self) -> int:
        return len(self._runtimes)

    def get(self, name: str) -> ServiceRuntime | None:
        return self._runtimes.get(name)

    def items(self) -> list[tuple[str, ServiceRuntime]]:
        return list(self._runtimes.items())

    def values(self) -> list[ServiceRuntime]:
        return list(self._runtimes.values())
