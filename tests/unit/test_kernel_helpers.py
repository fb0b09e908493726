"""The kernel's helpers on their narrow ports (docs/architecture.md): sampler, doctor,
windows and sleep mode, each built from a recording ``feed``, a fake clock, a fake probe,
a runtime table over a fake launcher and a real SQLite file -- no orchestrator, no
processes, no sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from support.fake_clock import FakeClock, settle
from support.fake_launcher import FakeLauncher

from service.domain import DeviceSnapshot, InstanceMemory, InstanceState, ProbeReading
from service.kernel.effects import KernelEffects
from service.kernel.sleeping import SleepMode
from service.kernel.tickets import Tickets
from service.live.events import EventLog
from service.live.leases import Waiters
from service.live.runtimes import RuntimeTable, ServiceRuntime
from service.live.usage import Accounts, UsageBook
from service.maintenance.windows import Windows
from service.memory.doctor import Doctor
from service.memory.sampling import LastReading, Sampler
from service.memory.watch import Finding, Watches
from service.policy import Policy, load_policy
from service.scheduler import (
    Event,
    InstanceBackoff,
    InstanceFailed,
    LearnedChanged,
    LedgerView,
    MakeRoom,
    MemorySampled,
    RestartRequested,
    ServiceView,
    UnloadRequested,
    WindowChanged,
)
from service.settings import Settings
from service.store import Store, StoreWriter, open_store, queries
from service.swapstate import StateKeeper

MiB = 1024**2
S = InstanceState

POLICY = """
version: 1
device: {backend: host, budget: 1GiB, headroom: 0B, sample_interval: 1s}
services:
  chat:
    kind: chat
    models: [chat]
    command: [llama-server, --port, "${PORT}"]
    memory: {estimate: 100MiB, cap: 200MiB, on_cap: restart}
  stopper:
    kind: chat
    models: [stopper]
    command: [llama-server, --port, "${PORT}"]
    memory: {estimate: 100MiB, cap: 200MiB, on_cap: stop}
  batch:
    kind: embedding
    models: [batch]
    command: [tei, --port, "${PORT}"]
    memory: {estimate: 100MiB}
    residency: window-only
  vllm:
    kind: chat
    models: [vllm]
    command: [vllm, serve, --port, "${PORT}"]
    adapter: vllm
    sleep: true
    memory: {estimate: 100MiB}
maintenance:
  windows:
    - {name: nightly, cron: "0 3 * * *", duration: 1h, restart: [chat], allow: [batch]}
"""


class FakeProbe:
    """A device probe whose figures the test sets."""

    backend = "host"

    def __init__(self) -> None:
        self.device_bytes: dict[str, int] = {}
        self.held: set[int] = set()

    def read(self, instances: Mapping[str, int]) -> ProbeReading:
        memory = {
            key: InstanceMemory(self.device_bytes.get(key, 0), 10 * MiB, (pid,))
            for key, pid in instances.items()
        }
        used = sum(m.device_bytes for m in memory.values())
        device = DeviceSnapshot(0, 1024 * MiB, used, 1024 * MiB - used, used, name="fake")
        return ProbeReading("host", (device,), memory)

    def holding(self, pids: Collection[int]) -> set[int]:
        return self.held & set(pids)

    def placement_env(self, devices: Sequence[int]) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass


@dataclass
class SchedulerFigures:
    """The read-only scheduler view the sampler gets: expected peaks and budgets."""

    expected: dict[str, int] = field(default_factory=dict)

    def service_view(self, name: str, now: float | None = None) -> ServiceView:
        return ServiceView(
            name=name,
            state="ready",
            device=0,
            in_flight=0,
            queued=0,
            charge=0,
            expected_peak=self.expected.get(name, 100 * MiB),
            measured=0,
            last_used=None,
            idle_for=None,
            waiting_for_memory=False,
            restart_pending=False,
            error=None,
        )

    def ledger_view(self, device: int) -> LedgerView | None:
        return None


@dataclass
class Kit:
    policy: Policy
    clock: FakeClock
    store: Store
    writer: StoreWriter
    events: EventLog
    runtimes: RuntimeTable
    launcher: FakeLauncher
    probe: FakeProbe
    fed: list[Event]
    last: LastReading

    async def ready(self, name: str) -> ServiceRuntime:
        """Start ``name``'s instance through the fake launcher and wait until ready."""
        rt = self.runtimes[name]
        await rt.instance.start(
            ["x"], env={}, cwd=None, port=9000, health_url="http://x/health", startup_timeout_s=5
        )
        return rt

    def doctor(self, tmp_path: Path) -> Doctor:
        return Doctor(
            writer=self.writer,
            events=self.events,
            clock=self.clock,
            settings=Settings(config=tmp_path / "vramd.yaml"),
            last=self.last,
            runtimes=self.runtimes,
            feed=self.fed.append,
            gpu=False,
        )


@pytest.fixture
async def kit(tmp_path: Path) -> AsyncIterator[Kit]:
    clock = FakeClock()
    store = open_store(tmp_path / "vramd.db")
    writer = StoreWriter(store)
    writer.start()
    policy = load_policy(POLICY)
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    launcher = FakeLauncher()
    runtimes = RuntimeTable(dict(policy.services), launcher=launcher, clock=clock, http=http)
    yield Kit(
        policy,
        clock,
        store,
        writer,
        EventLog(writer, clock),
        runtimes,
        launcher,
        FakeProbe(),
        [],
        LastReading(),
    )
    for rt in runtimes.values():
        await rt.instance.stop("test over", timeout_s=1)
    await runtimes.aclose()
    writer.close()
    store.close()


def sampler(
    kit: Kit,
    view: SchedulerFigures,
    found: list[tuple[str, Finding]],
    watches: Watches | None = None,
) -> Sampler:
    return Sampler(
        feed=kit.fed.append,
        view=view,
        runtimes=kit.runtimes,
        watches=watches or Watches(),
        on_finding=lambda rt, finding: found.append((rt.name, finding)),
        last=kit.last,
        probe=kit.probe,
        store=kit.store,
        writer=kit.writer,
        clock=kit.clock,
        interval_s=1.0,
    )


# ------------------------------------------------------------------ sampler


async def test_a_sample_feeds_the_resident_footprints_and_keeps_the_peak(kit: Kit) -> None:
    rt = await kit.ready("chat")
    kit.probe.device_bytes["chat"] = 90 * MiB
    await sampler(kit, SchedulerFigures(), []).sample_once()
    (event,) = kit.fed
    assert isinstance(event, MemorySampled)
    assert dict(event.footprints) == {"chat": 90 * MiB}  # only running instances
    assert (rt.measured.footprint, rt.measured.peak) == (90 * MiB, 90 * MiB)
    assert kit.last.reading is not None and kit.last.at == kit.clock.monotonic()
    assert kit.writer.flush(5.0)
    with kit.store.read() as session:
        assert len(queries.instance_samples(session, service="chat", limit=10)) == 1


async def test_a_footprint_above_the_expected_peak_is_learned(kit: Kit) -> None:
    await kit.ready("chat")
    kit.probe.device_bytes["chat"] = 150 * MiB
    await sampler(kit, SchedulerFigures({"chat": 100 * MiB}), []).sample_once()
    learned = [e for e in kit.fed if isinstance(e, LearnedChanged)]
    assert [(e.service, e.learned.peak_bytes) for e in learned] == [("chat", 150 * MiB)]


async def test_the_sampler_samples_every_interval_on_its_clock(kit: Kit) -> None:
    def samples() -> int:
        return sum(isinstance(e, MemorySampled) for e in kit.fed)

    task = asyncio.create_task(sampler(kit, SchedulerFigures(), []).run())
    await settle()
    assert samples() == 0
    for taken in (1, 2):
        await kit.clock.advance(1.0)
        # The probe is read in a worker thread: wait for it, not for the clock.
        async with asyncio.timeout(5):
            while samples() < taken:
                await asyncio.sleep(0.005)
    assert samples() == 2
    task.cancel()


async def test_a_failed_reading_is_logged_and_the_sampler_samples_again(
    kit: Kit, caplog: pytest.LogCaptureFixture
) -> None:
    """A reading that raises (here an OSError, as a /proc read under an exiting process
    can) must not end sampling: admission would go on with memory figures frozen."""

    def samples() -> int:
        return sum(isinstance(e, MemorySampled) for e in kit.fed)

    read = kit.probe.read
    failures = iter([OSError(9, "Bad file descriptor")] * 2)

    def flaky(instances: Mapping[str, int]) -> ProbeReading:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return read(instances)

    kit.probe.read = flaky  # type: ignore[method-assign]
    task = asyncio.create_task(sampler(kit, SchedulerFigures(), []).run())
    for _ in range(3):
        await kit.clock.advance(1.0)
        await settle()
    async with asyncio.timeout(5):
        while samples() < 1:
            await kit.clock.advance(1.0)
            await asyncio.sleep(0.005)
    assert not task.done()
    task.cancel()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("vramd")]
    assert sum("memory sample failed" in m for m in messages) == 1  # once per streak
    assert any("recovered after 2 failed samples" in m for m in messages)


async def test_a_cap_streak_is_handed_to_on_finding(kit: Kit, tmp_path: Path) -> None:
    rt = await kit.ready("chat")
    doctor = kit.doctor(tmp_path)
    watch = doctor.start_watch(rt)
    found: list[tuple[str, Finding]] = []
    kit.probe.device_bytes["chat"] = 250 * MiB  # cap 200 MiB
    sample = sampler(kit, SchedulerFigures({"chat": 300 * MiB}), found, doctor.watches)
    for _ in range(watch.cap.needed):
        await sample.sample_once()
    assert [(name, f.kind) for name, f in found] == [("chat", "over-cap")]


# ------------------------------------------------------------------ doctor


async def test_over_cap_with_on_cap_restart_asks_for_a_drained_restart(
    kit: Kit, tmp_path: Path
) -> None:
    rt = await kit.ready("chat")
    kit.doctor(tmp_path).on_finding(rt, Finding("over-cap", "footprint above its cap"))
    assert "over-cap" in rt.health.flags
    assert kit.fed == [RestartRequested("chat", "over its cap 200MiB (on_cap: restart)")]


async def test_over_cap_with_on_cap_stop_unloads(kit: Kit, tmp_path: Path) -> None:
    rt = await kit.ready("stopper")
    kit.doctor(tmp_path).on_finding(rt, Finding("over-cap", "footprint above its cap"))
    assert kit.fed == [UnloadRequested("stopper")]


async def test_an_out_of_memory_load_makes_room_and_leaves_an_incident(
    kit: Kit, tmp_path: Path
) -> None:
    rt = kit.runtimes["chat"]
    doctor = kit.doctor(tmp_path)
    doctor.load_failed(rt, "exited with code 1: CUDA error: out of memory", retrying=True)
    assert kit.fed == [MakeRoom("chat", "its load failed with out-of-memory")]
    assert rt.health.oom_incident is not None
    doctor.verdict(rt, retry_succeeded=True)
    assert kit.writer.flush(5.0)
    with kit.store.read() as session:
        (incident,) = queries.list_incidents(session, limit=10)
    assert (incident.kind, incident.verdict) == ("load", "fragmentation")


async def test_an_out_of_memory_line_before_the_quoted_tail_still_makes_an_incident(
    kit: Kit, tmp_path: Path
) -> None:
    # llama-server out of host memory (tests/fixtures/adapters/llamacpp_oom_host.log): the
    # allocation failure comes first, the last lines only say the model did not load.
    rt = kit.runtimes["chat"]
    output = (
        "E ggml_aligned_malloc: insufficient memory (attempted to allocate 4096.00 MB)\n"
        "E alloc_tensor_range: failed to allocate CPU buffer of size 4294967296\n"
        "E srv  llama_server: exiting due to model loading error"
    )
    error = "exited with code 1: E srv  llama_server: exiting due to model loading error"
    kit.doctor(tmp_path).load_failed(rt, error, output=output, retrying=True)
    assert kit.fed == [MakeRoom("chat", "its load failed with out-of-memory")]
    assert rt.health.oom_incident is not None


async def test_a_load_failure_that_is_not_out_of_memory_asks_for_nothing(
    kit: Kit, tmp_path: Path
) -> None:
    rt = kit.runtimes["chat"]
    kit.doctor(tmp_path).load_failed(rt, "exited with code 1: bad flag", retrying=True)
    assert kit.fed == [] and rt.health.oom_incident is None


# ------------------------------------------------------------------ windows


async def test_opening_a_window_restarts_its_running_targets_and_allows_its_services(
    kit: Kit,
) -> None:
    await kit.ready("chat")
    windows = Windows(
        policy=kit.policy,
        feed=kit.fed.append,
        runtimes=kit.runtimes,
        store=kit.store,
        writer=kit.writer,
        events=kit.events,
        clock=kit.clock,
    )
    windows.start()
    try:
        (closed,) = kit.fed
        assert isinstance(closed, WindowChanged) and closed.allowed == frozenset()
        kit.fed.clear()
        windows.run("nightly")
        restart, opened = kit.fed
        assert restart == RestartRequested("chat", "maintenance window nightly")
        assert isinstance(opened, WindowChanged) and opened.allowed == frozenset({"batch"})
        assert windows.window("nightly").open is True
    finally:
        windows.shutdown()


# ------------------------------------------------------------------ sleep mode


async def test_sleep_and_wake_go_through_the_runtimes_own_endpoints(kit: Kit) -> None:
    rt = await kit.ready("vllm")
    calls: list[str] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(200)

    rt.client = httpx.AsyncClient(base_url="http://vllm", transport=httpx.MockTransport(vllm))
    sleep = SleepMode(events=kit.events, probe=kit.probe, clock=kit.clock, settle_timeout_s=5)
    assert await sleep.try_sleep(rt, "evicted for chat")
    assert rt.instance.state is S.SLEEPING
    assert await sleep.wake(rt, "a request for vllm")
    assert rt.instance.state is S.READY
    assert calls == ["/sleep", "/wake_up"]
    await rt.close_client()


async def test_a_runtime_that_refuses_to_sleep_is_left_to_be_stopped(kit: Kit) -> None:
    rt = await kit.ready("vllm")
    rt.client = httpx.AsyncClient(
        base_url="http://vllm", transport=httpx.MockTransport(lambda r: httpx.Response(500))
    )
    sleep = SleepMode(events=kit.events, probe=kit.probe, clock=kit.clock, settle_timeout_s=5)
    assert not await sleep.try_sleep(rt, "evicted for chat")
    assert rt.instance.state is S.READY
    await rt.close_client()


# ------------------------------------------------------------------ restarts


class NoCounters:
    def request_done(self, service: str, code: str, queue_s: float | None = None) -> None:
        pass

    def load_done(self, service: str, seconds: float) -> None:
        pass


def effects(kit: Kit, tmp_path: Path) -> KernelEffects:
    doctor = kit.doctor(tmp_path)
    keeper = StateKeeper(
        tmp_path / "state",
        runtimes=kit.runtimes,
        events=kit.events,
        clock=kit.clock,
        flag=doctor.flag,
        clear_flags=doctor.clear_flags,
    )
    return KernelEffects(
        feed=kit.fed.append,
        runtimes=kit.runtimes,
        waiters=Waiters(),
        tickets=Tickets(),
        sleep=SleepMode(events=kit.events, probe=kit.probe, clock=kit.clock, settle_timeout_s=1),
        doctor=doctor,
        sampler=sampler(kit, SchedulerFigures(), []),
        events=kit.events,
        accounts=Accounts(NoCounters(), UsageBook(kit.clock.now)),
        writer=kit.writer,
        probe=kit.probe,
        clock=kit.clock,
        settle_timeout_s=1.0,
        keeper=keeper,
    )


def flag_events(kit: Kit) -> list[tuple[str, str]]:
    assert kit.writer.flush(5.0)
    with kit.store.read() as session:
        rows = queries.list_events(session, service="chat", limit=100)
        return [(e.kind, e.message) for e in rows if e.kind.startswith("flag")]


async def test_a_runtime_killed_after_ready_is_flagged_crash_looping_then_cleared(
    kit: Kit, tmp_path: Path
) -> None:
    # chat: max_retries 5 (the default). Five deaths after ready within ten minutes
    # flag it; every death is a backoff the scheduler may retry, never a failure; a
    # minute ready clears the flag.
    kernel = effects(kit, tmp_path)
    rt = await kit.ready("chat")
    for death in range(1, 7):
        kit.launcher.spawned[-1].exit(-9)
        await settle()
        backoff = [e for e in kit.fed if isinstance(e, InstanceBackoff)][-1]
        assert backoff.crashed and rt.instance.state is S.BACKOFF
        assert ("crash-looping" in rt.health.flags) is (death >= 5)
        await kit.clock.advance(rt.instance.backoff_due - kit.clock.monotonic())
        await kit.ready("chat")  # the owner's retry
    assert not [e for e in kit.fed if isinstance(e, InstanceFailed)]
    await kit.clock.advance(59.0)
    assert "crash-looping" in rt.health.flags
    await kit.clock.advance(1.0)
    assert "crash-looping" not in rt.health.flags
    kinds = [kind for kind, _ in flag_events(kit)]
    assert kinds.count("flag") == 2 and kinds.count("flag-cleared") == 1
    assert "died 5 times within 10 min after being ready" in flag_events(kit)[0][1]
    await kernel.tasks.cancel_all()
    assert not kernel.tasks.failed
