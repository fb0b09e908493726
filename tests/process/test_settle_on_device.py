"""The settle barrier waits for the device's free memory, not only for the pid to go.

A real orchestrator, the real NVML probe over simulated GPUs (``service.simgpu``) and a
real demo runtime holding device memory. The driver here does what some do: it drops a
dead process from its list before it gives the memory back (``DriverKeepsMemory``).
A barrier that looked at the process list alone would report the instance stopped at
once; this one waits until the free figure has come back, or says how much is missing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from support.orchestrator import OrchestratorHarness, RunningDaemon, demo_service, policy_text
from support.simgpu import simulated_gpus

from service.devices import NvmlProbe
from service.domain import ProbeReading
from service.simgpu import ENV

MiB = 2**20
HELD = 600 * MiB


class DriverKeepsMemory:
    """The NVML probe, with a driver that keeps ``kept`` bytes of GPU 0 used after the
    watched pids have left its process list, until ``give_back``."""

    backend = "nvml"

    def __init__(self, probe: NvmlProbe) -> None:
        self.probe = probe
        self.kept = 0
        self.watch: set[int] = set()

    def give_back(self) -> None:
        self.kept = 0

    def read(self, instances: Mapping[str, int]) -> ProbeReading:
        reading = self.probe.read(instances)
        if not self.kept or self.probe.holding(self.watch):
            return reading
        devices = tuple(
            replace(d, used=d.used + self.kept, free=d.free - self.kept) if d.index == 0 else d
            for d in reading.devices
        )
        return replace(reading, devices=devices)

    def holding(self, pids: Collection[int]) -> set[int]:
        return self.probe.holding(pids)

    def placement_env(self, devices: Sequence[int]) -> dict[str, str]:
        return self.probe.placement_env(devices)

    def close(self) -> None:
        self.probe.close()


@pytest.fixture
async def driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[DriverKeepsMemory]:
    gpus = simulated_gpus(tmp_path, "2GiB", release_lag=0.1)
    monkeypatch.setenv(ENV, str(gpus.path))
    from service.simgpu import nvml

    yield DriverKeepsMemory(NvmlProbe(nvml))


def policy() -> str:
    service = demo_service(memory_mib=10, estimate_mib=700)
    service["command"] = [*service["command"], "--gpu-memory", f"{HELD // MiB}MiB"]
    return policy_text({"a": service}, budget="1800MiB").replace("backend: host", "backend: nvml")


async def load_and_measure(
    harness: OrchestratorHarness, driver: DriverKeepsMemory
) -> RunningDaemon:
    daemon = await harness.start(policy())
    orc = daemon.orchestrator
    lease = await orc.acquire("a", request_id="r1")
    orc.release(lease, outcome="ok")
    deadline = time.monotonic() + 20
    while daemon.view("a")["footprint_bytes"] < HELD:  # a sample saw it on the GPU
        assert time.monotonic() < deadline, daemon.view("a")
        await asyncio.sleep(0.05)
    driver.watch = {daemon.view("a")["pid"]}
    driver.kept = HELD
    return daemon


async def test_a_stop_is_reported_only_once_the_free_memory_is_back(
    tmp_path: Path, driver: DriverKeepsMemory
) -> None:
    harness = OrchestratorHarness(tmp_path, probe=driver, settle_timeout=20)
    try:
        daemon = await load_and_measure(harness, driver)
        loop = asyncio.get_running_loop()
        given_back_at: list[float] = []

        def give_back() -> None:
            given_back_at.append(time.monotonic())
            driver.give_back()

        loop.call_later(1.5, give_back)
        await daemon.orchestrator.unload("a")
        stopped_at = time.monotonic()
        assert daemon.view("a")["state"] == "stopped"
        assert given_back_at and stopped_at >= given_back_at[0]
        assert not daemon.events(kind="settle-timeout")
    finally:
        await harness.close()


async def test_memory_that_never_comes_back_is_named_when_the_barrier_gives_up(
    tmp_path: Path, driver: DriverKeepsMemory
) -> None:
    harness = OrchestratorHarness(tmp_path, probe=driver, settle_timeout=1.0)
    try:
        daemon = await load_and_measure(harness, driver)
        await daemon.orchestrator.unload("a")
        [event] = daemon.events(kind="settle-timeout")
        assert "free memory not back" in event["message"]
        assert "device 0: " in event["message"]
        missing = event["data"]["missing_bytes"]["0"]
        assert missing == pytest.approx(HELD, rel=0.1)
    finally:
        await harness.close()
