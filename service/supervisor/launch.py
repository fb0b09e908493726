"""Launching one instance of a service: its command, environment and health URL with
the placeholders filled in (docs/policy.md, "Placeholders"), on the devices admission
chose and inside its cap (``${CAP_FRACTION}``, llama.cpp's ``--fit`` margin).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from service.adapters import Adapter, adapter_named, guess_adapter
from service.policy import Service, expand_placeholders
from service.supervisor.environment import runtime_environment


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
