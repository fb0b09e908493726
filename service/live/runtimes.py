"""Each service's live runtime: instance, client, counters; and the table of them all.

``ServiceRuntime`` pairs the supervisor's ``Instance`` (the process and its lifecycle)
with what the daemon keeps beside it: the pooled HTTP client requests go through, the
database id of the current process, the counters ``vramd ps`` shows, and the launch
arguments with their placeholders filled in (``launch_args``).
"""

from __future__ import annotations

import os
import socket
import ssl
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.adapters import Adapter, adapter_named, guess_adapter
from service.clock import Clock
from service.domain import InstanceState
from service.policy import Service, expand_placeholders
from service.supervisor import (
    Instance,
    LogRing,
    ProcessLauncher,
    RestartPolicy,
    runtime_environment,
)

# One pool per instance: keep-alive connections to one loopback port. Generous limits:
# admission, not the pool, bounds concurrency.
POOL_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)
# Runtimes are plain HTTP on loopback. httpx would otherwise load the system's CA bundle
# for every new pool (~40 ms of the event loop), on the path of each cold start's first
# request; one context, never used for a handshake, serves every pool.
_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def adapter_for(service: Service) -> Adapter:
    """The policy's ``adapter:`` if set, else the one its command looks like."""
    return adapter_named(service.adapter) if service.adapter else guess_adapter(service.command)


def health_path(service: Service) -> str:
    """The policy's health path; if it was left at the default, a known runtime's own.

    llama-cpp-python and sd.cpp have no ``/health``; every other runtime (and the
    contract's default for unknown ones) uses ``/health``.
    """
    adapter = adapter_for(service)
    if "health" in service.model_fields_set or adapter.name == "openai":
        return service.health
    return adapter.health_path


def free_loopback_port() -> int:
    """A port the OS says is free on 127.0.0.1 now (the runtime binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class LaunchArgs:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    port: int
    health_url: str


def launch_args(
    name: str,
    service: Service,
    *,
    port: int,
    devices: Sequence[int],
    runtime_totals: Sequence[int] = (),
    placement: Mapping[str, str] | None = None,
    state_dir: str | None = None,
    fit_target_mib: Sequence[int] = (),
) -> LaunchArgs:
    """Fill in the placeholders (docs/policy.md, "Placeholders") for one start of ``service``.

    ``devices`` are the ones admission chose (one, or ``span`` of them, lowest first),
    ``runtime_totals`` the total a runtime sees on each (for ``${CAP_FRACTION}``), and
    ``placement`` the probe's environment that shows the runtime exactly those devices;
    each of its variables is set unless the service's ``env`` sets it. ``state_dir`` is
    ``${STATE_DIR}``; ``fit_target_mib`` the margin llama.cpp's ``--fit`` must leave free
    on each device (``LLAMA_ARG_FIT_TARGET``, unless the service's ``env`` sets it).
    """
    cap = service.memory.cap
    values = {
        "PORT": str(port),
        "SERVICE": name,
        "MODEL": service.models[0],
        "GPU": ",".join(str(device) for device in devices),
        "PYTHON": sys.executable,
    }
    if state_dir is not None:
        values["STATE_DIR"] = state_dir
    if cap is not None:
        values["CAP_BYTES"] = str(cap)
        values["CAP_MIB"] = str(cap // (1024 * 1024))
        if runtime_totals and all(runtime_totals):
            shares = service.shares
            if len(shares) != len(runtime_totals):  # placed before a span change applied
                shares = (1.0 / len(runtime_totals),) * len(runtime_totals)
            values["CAP_FRACTION"] = cap_fraction(cap, shares, runtime_totals)
    extra = {key: expand_placeholders(value, values) for key, value in service.env.items()}
    # A service that picks its devices itself (any of the visibility variables) is not
    # filtered a second time: HIP honours CUDA_VISIBLE_DEVICES, and ROCR's mask applies
    # before HIP's, so vramd's variable beside the service's own would hide its device.
    chooses_own = any(key in VISIBILITY_VARIABLES for key in extra)
    for key, value in (placement or {}).items():
        if not (chooses_own and key in VISIBILITY_VARIABLES):
            extra.setdefault(key, value)
    if fit_target_mib:
        extra.setdefault(FIT_TARGET, ",".join(str(mib) for mib in fit_target_mib))
    health = expand_placeholders(health_path(service), values)
    return LaunchArgs(
        argv=[expand_placeholders(arg, values) for arg in service.command],
        env=runtime_environment(extra, base=os.environ),
        cwd=service.cwd,
        port=port,
        health_url=f"http://127.0.0.1:{port}{health}",
    )


# llama.cpp's --fit leaves this many MiB free on each device (docs/policy.md, "Runtimes
# sized inside their cap").
FIT_TARGET = "LLAMA_ARG_FIT_TARGET"


def fit_target_mib(
    free: Sequence[int], others_starting: Sequence[int], own: Sequence[int]
) -> tuple[int, ...]:
    """Per device: free memory, less what other starting instances will still take there,
    less this instance's share of its cap; in MiB, never below 0."""
    mib = 1024 * 1024
    return tuple(
        max(0, (f - o - s) // mib) for f, o, s in zip(free, others_starting, own, strict=True)
    )


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


def uses_state_dir(service: Service) -> bool:
    """Whether ``${STATE_DIR}`` appears in the service's command or env."""
    return any("${STATE_DIR}" in text for text in [*service.command, *service.env.values()])


VISIBILITY_VARIABLES = frozenset(
    {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"}
)


def cap_fraction(cap: int, shares: Sequence[float], totals: Sequence[int]) -> str:
    """``${CAP_FRACTION}``: the cap's share of each device's total, the smallest of them.

    A runtime that sizes itself by a fraction (vLLM's ``--gpu-memory-utilization``) takes
    that fraction of every device it runs on, of the total *it* sees (the driver's
    reserve included). Truncated in integers to four decimals, never rounded up: a float
    floor can land one step above the exact quotient, and a fraction above the cap would
    let the runtime's own allocator plan past it (docs/policy.md, "Placeholders").
    """
    steps = min(
        int(cap * share) * FRACTION_STEPS // total
        for share, total in zip(shares, totals, strict=True)
    )
    steps = min(steps, FRACTION_STEPS)
    return f"{steps // FRACTION_STEPS}.{steps % FRACTION_STEPS:04d}"


FRACTION_STEPS = 10_000


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
