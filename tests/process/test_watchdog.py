"""The daemon's own liveness: a blocked event loop is noticed, recorded and reported."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from pathlib import Path

import pytest
from support.orchestrator import OrchestratorHarness, demo_service, policy_text

from service.domain import ProbeReading
from service.health.watchdog import Liveness, Stall, Watchdog
from service.supervisor import LogRing, RuntimeProcess, SubprocessLauncher


async def test_a_blocked_loop_is_noticed_from_outside_and_reported_after() -> None:
    stalls: list[Stall] = []
    recovered: list[Stall] = []
    dog = Watchdog(stall_after_s=0.3, on_stall=stalls.append, on_recover=recovered.append)
    dog.start()
    try:
        await asyncio.sleep(0.3)
        time.sleep(1.0)  # the fault: a decision blocking the event loop
        await asyncio.sleep(0.4)
    finally:
        await dog.stop()
    assert len(stalls) == 1
    assert "time.sleep(1.0)" in stalls[0].where  # where the loop was stuck
    assert len(recovered) == 1 and recovered[0].duration >= 0.9
    assert dog.last_stall is recovered[0]
    assert dog.stalled_for is None


@pytest.mark.timing  # a busy machine can stall a healthy loop past 0.3 s: run alone
async def test_a_healthy_loop_raises_nothing() -> None:
    stalls: list[Stall] = []
    dog = Watchdog(stall_after_s=0.3, on_stall=stalls.append, on_recover=stalls.append)
    dog.start()
    await asyncio.sleep(1.0)
    await dog.stop()
    assert stalls == []


def test_liveness_names_what_is_late() -> None:
    ages = {"ticks": 0.5, "samples": 40.0}
    live = Liveness(
        {
            "ticks": (lambda: ages["ticks"], 5.0),
            "samples": (lambda: ages["samples"], 15.0),
            "never yet": (lambda: None, 1.0),
        }
    )
    report = live.report()
    assert report["ok"] is False
    assert report["problems"] == ["samples made no progress for 40.0s (limit 15s)"]
    ages["samples"] = 1.0
    assert live.report()["ok"] is True


class BlockingLauncher:
    """A launcher that blocks the event loop before spawning: a stuck decision."""

    def __init__(self, block_s: float) -> None:
        self.block_s = block_s
        self.real = SubprocessLauncher()

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, log: LogRing
    ) -> RuntimeProcess:
        time.sleep(self.block_s)
        return await self.real.spawn(argv, env=env, cwd=cwd, log=log)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[OrchestratorHarness]:
    harness = OrchestratorHarness(tmp_path, launcher=BlockingLauncher(1.5), watchdog_stall_s=0.5)
    try:
        yield harness
    finally:
        await harness.close()


async def test_stuck_orchestrator_leaves_an_event_and_health_shows_it(
    harness: OrchestratorHarness,
) -> None:
    daemon = await harness.start(
        policy_text({"chat": demo_service(memory_mib=20, residency="pinned")})
    )
    orc = daemon.orchestrator
    deadline = time.monotonic() + 20
    while not daemon.events(kind="watchdog-recovered") and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stalls = daemon.events(kind="watchdog")
    assert stalls, "the watchdog thread wrote the stall while the loop was blocked"
    assert "BlockingLauncher" in stalls[0]["message"] or "spawn" in stalls[0]["message"]
    health = orc.health()
    assert health["last_stall"]["blocked_s"] >= 1.0
    assert health["ok"] is True  # the loop runs again; the stall is history


class HangingProbe:
    """The host probe, until ``hang`` is set: then every read blocks (a stuck driver)."""

    def __init__(self) -> None:
        from service.devices import create_probe

        self.real = create_probe("host")
        self.backend = "host"
        self.hang = threading.Event()
        self.release = threading.Event()

    def read(self, instances: Mapping[str, int]) -> ProbeReading:
        if self.hang.is_set():
            self.release.wait(30)
        return self.real.read(instances)

    def holding(self, pids: Collection[int]) -> set[int]:
        return self.real.holding(pids)

    def placement_env(self, devices: Sequence[int]) -> dict[str, str]:
        return self.real.placement_env(devices)

    def close(self) -> None:
        self.release.set()
        self.real.close()


async def test_a_probe_stuck_in_the_driver_fails_health(tmp_path: Path) -> None:
    probe = HangingProbe()
    harness = OrchestratorHarness(tmp_path, probe=probe, liveness_grace_s=1.0)
    try:
        daemon = await harness.start(policy_text({}, sample_interval=0.1))
        await asyncio.sleep(0.5)
        assert daemon.orchestrator.health()["ok"] is True
        probe.hang.set()
        deadline = time.monotonic() + 10
        while daemon.orchestrator.health()["ok"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        health = daemon.orchestrator.health()
        assert health["ok"] is False
        assert any("memory samples made no progress" in p for p in health["problems"])
        probe.hang.clear()
        probe.release.set()
        deadline = time.monotonic() + 10
        while not daemon.orchestrator.health()["ok"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert daemon.orchestrator.health()["ok"] is True
    finally:
        probe.release.set()
        await harness.close()
        probe.close()
