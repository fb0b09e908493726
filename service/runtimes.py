"""One service's live runtime as the orchestrator holds it: instance, client, counters.

``ServiceRuntime`` pairs the supervisor's ``Instance`` (the process and its lifecycle)
with what the daemon keeps beside it: the pooled HTTP client requests go through, the
database id of the current process, the counters ``vramd ps`` shows, and the launch
arguments with their placeholders filled in (``launch_args``).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.adapters import Adapter, adapter_named, guess_adapter
from service.policy import Service, expand_placeholders
from service.supervisor import Instance, LogRing, runtime_environment
from service.watch import InstanceWatch

# One pool per instance: keep-alive connections to one loopback port. Generous limits:
# admission, not the pool, bounds concurrency.
POOL_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)


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
    device: int,
    device_total: int | None,
    set_cuda_device: bool,
) -> LaunchArgs:
    """Fill in the placeholders of DESIGN section 3 for one start of ``service``."""
    cap = service.memory.cap
    values = {
        "PORT": str(port),
        "SERVICE": name,
        "MODEL": service.models[0],
        "GPU": str(device),
        "PYTHON": sys.executable,
    }
    if cap is not None:
        values["CAP_BYTES"] = str(cap)
        values["CAP_MIB"] = str(cap // (1024 * 1024))
        if device_total:
            # Rounded down, never up: a fraction above cap / total would let the runtime's
            # own allocator plan past the cap (DESIGN section 4).
            fraction = math.floor(min(1.0, cap / device_total) * 1000) / 1000
            values["CAP_FRACTION"] = f"{fraction:.3f}"
    extra = {key: expand_placeholders(value, values) for key, value in service.env.items()}
    if set_cuda_device:
        extra.setdefault("CUDA_VISIBLE_DEVICES", str(device))
    health = expand_placeholders(health_path(service), values)
    return LaunchArgs(
        argv=[expand_placeholders(arg, values) for arg in service.command],
        env=runtime_environment(extra, base=os.environ),
        cwd=service.cwd,
        port=port,
        health_url=f"http://127.0.0.1:{port}{health}",
    )


@dataclass
class ServiceRuntime:
    """Everything live about one service, owned by the orchestrator."""

    name: str
    spec: Service
    instance: Instance
    log: LogRing
    client: httpx.AsyncClient | None = None
    base_url: str | None = None
    device: int | None = None
    instance_id: int | None = None
    last_pids: tuple[int, ...] = ()
    footprint: int = 0
    host_bytes: int = 0
    peak: int = 0
    stopping_by_request: bool = False
    flags: set[str] = field(default_factory=set)
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "requests_served": 0,
            "loads": 0,
            "evictions": 0,
            "restarts": 0,
        }
    )
    last_load_s: float | None = None
    learned_peak: int | None = None
    learned_load_s: float | None = None
    watch: InstanceWatch | None = None
    # An out-of-memory load awaiting its retry's verdict (the incident's id).
    oom_incident: int | None = None
    # The last requests' shapes (body size, max_tokens...), for incident records.
    recent_requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=50))

    @property
    def adapter(self) -> Adapter:
        return adapter_for(self.spec)

    def open_client(self, port: int) -> None:
        """A keep-alive pool for the instance that just became ready (kept over a sleep)."""
        if self.client is not None and self.base_url == f"http://127.0.0.1:{port}":
            return
        self.base_url = f"http://127.0.0.1:{port}"
        self.client = httpx.AsyncClient(
            base_url=self.base_url, limits=POOL_LIMITS, timeout=httpx.Timeout(600.0)
        )

    async def close_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.aclose()

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.instance.state.value, "pid": self.instance.pid}
