"""The supervisor without processes or sleeps: state table, backoff arithmetic, log ring,
environment, and the Instance lifecycle driven by a fake launcher and a fake clock."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from support.fake_clock import FakeClock, settle
from support.fake_launcher import FakeLauncher

from service.domain import TRANSITIONS, InstanceState, check_transition
from service.errors import IllegalTransition
from service.supervisor import (
    Instance,
    LineSplitter,
    LogRing,
    RestartPolicy,
    RestartTracker,
    RuntimeProcess,
    StartFailed,
    describe_exit,
    runtime_environment,
    wait_settled,
)
from service.supervisor.environment import INHERITED
from service.supervisor.logs import TRUNCATION_MARK

S = InstanceState
PAIRS = list(itertools.product(S, S))

# -- the transition table ---------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_check_transition_follows_the_table(old: S, new: S) -> None:
    if new in TRANSITIONS[old]:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransition):
            check_transition(old, new)


# -- backoff ----------------------------------------------------------------------------


def test_failed_starts_double_the_backoff_up_to_the_cap_then_give_up() -> None:
    tracker = RestartTracker(RestartPolicy(max_retries=6, backoff_s=2, max_backoff_s=30))
    decisions = [tracker.on_failure(float(t), was_ready=False) for t in range(7)]
    assert [d.delay_s for d in decisions[:6]] == [2, 4, 8, 16, 30, 30]
    assert all(d.retry for d in decisions[:6])
    assert [d.failed_starts for d in decisions] == [1, 2, 3, 4, 5, 6, 7]
    assert decisions[6].retry is False
    assert decisions[6].describe(6) == "gave up after 7 failed starts in a row"


def test_zero_retries_gives_up_on_the_first_failed_start() -> None:
    tracker = RestartTracker(RestartPolicy(max_retries=0, backoff_s=1, max_backoff_s=1))
    assert tracker.on_failure(0.0, was_ready=False).retry is False


def test_a_ready_instance_that_keeps_dying_is_never_given_up_on() -> None:
    # Ready for 10 s, then killed, fifty times over: each death is retried, the backoff
    # doubles to its cap (never 60 s ready, so never reset), and from the third death
    # within ten minutes the instance is crash-looping.
    tracker = RestartTracker(RestartPolicy(max_retries=3, backoff_s=1, max_backoff_s=8))
    now, decisions = 0.0, []
    for _ in range(50):
        tracker.on_ready(now)
        now += 10.0
        decision = tracker.on_failure(now, was_ready=True)
        decisions.append(decision)
        now += decision.delay_s + 1.0  # the backoff, then a one-second load
    assert all(d.retry and d.was_ready for d in decisions)
    assert [d.delay_s for d in decisions[:6]] == [1, 2, 4, 8, 8, 8]
    assert [d.looping for d in decisions[:4]] == [False, False, True, True]
    assert all(d.looping for d in decisions[2:])
    # Deaths older than ten minutes are forgotten: 10 s ready + 8 s backoff + 1 s load.
    assert decisions[-1].deaths == len([t for t in range(0, 601, 19)])


def test_deaths_apart_by_more_than_ten_minutes_are_not_a_loop() -> None:
    tracker = RestartTracker(RestartPolicy(max_retries=2, backoff_s=1, max_backoff_s=8))
    for death in (0.0, 601.0, 1202.0):
        tracker.on_ready(death - 30.0)
        decision = tracker.on_failure(death, was_ready=True)
        assert (decision.deaths, decision.looping) == (1, False)


def test_crash_looping_ends_after_a_stable_run() -> None:
    tracker = RestartTracker(
        RestartPolicy(max_retries=2, backoff_s=1, max_backoff_s=8, stable_after_s=60)
    )
    tracker.on_ready(0.0)
    tracker.on_failure(5.0, was_ready=True)
    tracker.on_ready(7.0)
    assert tracker.on_failure(9.0, was_ready=True).looping
    tracker.on_ready(11.0)
    assert tracker.looping(70.0) is True
    assert tracker.looping(71.0) is False  # 60 s ready
    # A death after that is a first failure for the backoff, but still the third death
    # within ten minutes: it loops again.
    decision = tracker.on_failure(80.0, was_ready=True)
    assert (decision.delay_s, decision.deaths, decision.looping) == (1, 3, True)


def test_becoming_ready_ends_a_run_of_failed_starts() -> None:
    tracker = RestartTracker(RestartPolicy(max_retries=2, backoff_s=1, max_backoff_s=10))
    tracker.on_failure(0.0, was_ready=False)
    tracker.on_failure(1.0, was_ready=False)
    tracker.on_ready(5.0)
    tracker.on_failure(10.0, was_ready=True)
    decision = tracker.on_failure(15.0, was_ready=False)
    # The backoff keeps doubling (no stable run yet), but this is the first failed start
    # since the instance last came up: it is retried.
    assert (decision.retry, decision.failed_starts, decision.delay_s) == (True, 1, 8)


def test_a_stable_run_forgives_past_failures() -> None:
    tracker = RestartTracker(
        RestartPolicy(max_retries=2, backoff_s=1, max_backoff_s=10, stable_after_s=60)
    )
    tracker.on_failure(0.0, was_ready=False)
    tracker.on_failure(1.0, was_ready=False)
    tracker.on_ready(10.0)
    assert tracker.on_stable_check(69.0) is False
    assert tracker.failures == 2
    assert tracker.on_stable_check(70.0) is True
    assert tracker.failures == 0


def test_a_crash_after_a_long_run_counts_as_a_first_failure() -> None:
    tracker = RestartTracker(
        RestartPolicy(max_retries=2, backoff_s=1, max_backoff_s=10, stable_after_s=60)
    )
    tracker.on_failure(0.0, was_ready=False)
    tracker.on_failure(1.0, was_ready=False)
    tracker.on_ready(10.0)
    decision = tracker.on_failure(500.0, was_ready=True)  # nobody called on_stable_check
    assert (decision.retry, decision.delay_s, decision.attempt) == (True, 1, 1)


def test_reset_starts_afresh() -> None:
    tracker = RestartTracker(RestartPolicy(max_retries=1, backoff_s=1, max_backoff_s=4))
    tracker.on_failure(0.0, was_ready=False)
    assert tracker.on_failure(1.0, was_ready=False).retry is False
    tracker.reset()
    decision = tracker.on_failure(2.0, was_ready=False)
    assert (decision.retry, decision.delay_s, decision.failed_starts) == (True, 1, 1)


def test_huge_attempt_numbers_do_not_overflow() -> None:
    tracker = RestartTracker(RestartPolicy(max_retries=10_000, backoff_s=2, max_backoff_s=120))
    assert tracker.delay_for(5000) == 120


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retries": -1, "backoff_s": 1, "max_backoff_s": 1},
        {"max_retries": 1, "backoff_s": 5, "max_backoff_s": 1},
        {"max_retries": 1, "backoff_s": 1, "max_backoff_s": 1, "stable_after_s": -1},
    ],
)
def test_restart_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


# -- the log ring -----------------------------------------------------------------------


def test_log_ring_keeps_only_the_last_lines() -> None:
    ring = LogRing(max_lines=3)
    for i in range(5):
        ring.append("stdout", f"line {i}", ts=float(i))
    assert len(ring) == 3
    assert [line.text for line in ring.tail(10)] == ["line 2", "line 3", "line 4"]
    assert [line.text for line in ring.tail(2)] == ["line 3", "line 4"]
    assert ring.tail(0) == []
    assert ring.mark() == 5


def test_log_ring_cuts_long_lines_on_a_character_boundary() -> None:
    ring = LogRing(max_line_bytes=64)
    ring.append("stderr", "é" * 100, ts=0.0)  # 200 bytes of two-byte characters
    text = ring.tail(1)[0].text
    assert text.endswith(TRUNCATION_MARK)
    assert len(text.encode()) <= 64
    assert set(text.removesuffix(TRUNCATION_MARK)) == {"é"}


def test_stderr_tail_skips_stdout_blank_lines_and_older_processes() -> None:
    ring = LogRing()
    ring.append("stderr", "old process died", ts=0.0)
    mark = ring.mark()
    ring.append("stderr", "loading", ts=1.0)
    ring.append("stdout", "listening", ts=2.0)
    ring.append("stderr", "  ", ts=3.0)
    ring.append("stderr", "CUDA error: out of memory", ts=4.0)
    assert ring.stderr_tail(5, since=mark) == "loading\nCUDA error: out of memory"
    assert ring.stderr_tail(1) == "CUDA error: out of memory"
    assert ring.tail(9, since=mark)[0].text == "loading"


def test_line_splitter_joins_chunks_and_cuts_runaway_lines() -> None:
    ring = LogRing(max_line_bytes=64)
    splitter = LineSplitter("stdout", ring, now=lambda: 7.0)
    splitter.feed(b"hel")
    splitter.feed(b"lo\r\nwor")
    splitter.feed(b"ld\n" + b"x" * 50)
    splitter.feed(b"x" * 50)  # past the limit without a newline: cut once
    splitter.feed(b"x" * 500 + b"\nafter \xff\n")
    splitter.feed(b"partial")
    splitter.flush()
    texts = [line.text for line in ring.tail(10)]
    assert texts[:2] == ["hello", "world"]
    assert texts[2].startswith("x" * 40) and texts[2].endswith(TRUNCATION_MARK)
    assert texts[3:] == ["after \ufffd", "partial"]
    assert {line.ts for line in ring.tail(10)} == {7.0}


# -- the environment --------------------------------------------------------------------


def test_environment_passes_only_the_allow_list_and_extra_wins() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/v",
        "HF_HOME": "/models/hf",
        "VRAMD_ADMIN_KEY": "s3cret",
        "OPENAI_API_KEY": "sk-nope",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    env = runtime_environment({"HF_HOME": "/other", "CUDA_VISIBLE_DEVICES": "1"}, base=base)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/v",
        "HF_HOME": "/other",
        "CUDA_VISIBLE_DEVICES": "1",
    }


def test_every_inherited_variable_says_why() -> None:
    assert all(reason.strip() for reason in INHERITED.values())
    assert not any(name.startswith("VRAMD_") for name in INHERITED)


# -- describe_exit and the settle barrier ----------------------------------------------


def test_describe_exit() -> None:
    assert describe_exit(1, "CUDA error: out of memory") == (
        "exited with code 1: CUDA error: out of memory"
    )
    assert describe_exit(-signal.SIGSEGV, "") == "killed by signal SIGSEGV"
    assert describe_exit(-200, "") == "killed by signal 200"


async def test_settle_barrier_waits_until_released() -> None:
    clock = FakeClock()
    answers = iter([False, False, True])
    calls = 0

    async def released() -> bool:
        nonlocal calls
        calls += 1
        return next(answers)

    waiter = asyncio.create_task(wait_settled(released, clock=clock, timeout_s=5, interval_s=1))
    await settle()
    assert calls == 1
    await clock.advance(1)
    await clock.advance(1)
    assert await waiter is True
    assert calls == 3


async def test_settle_barrier_gives_up_after_the_timeout() -> None:
    clock = FakeClock()

    async def never() -> bool:
        return False

    waiter = asyncio.create_task(wait_settled(never, clock=clock, timeout_s=2.5, interval_s=1))
    await settle()
    await clock.advance(2)
    assert not waiter.done()
    await clock.advance(0.5)
    assert await waiter is False


# -- Instance with a fake launcher and a fake clock -------------------------------------


@dataclass
class Supervision:
    """A supervised instance's surroundings: a fake clock and launcher, a health endpoint."""

    clock: FakeClock
    launcher: FakeLauncher
    http: httpx.AsyncClient
    health: list[int]  # status codes the health endpoint answers, last one repeats
    events: list[tuple[S, S, str]] = field(default_factory=list)

    def instance(self, policy: RestartPolicy | None = None, **kwargs: object) -> Instance:
        return Instance(
            "chat",
            launcher=self.launcher,
            clock=self.clock,
            http=self.http,
            log=LogRing(),
            on_state=lambda _i, old, new, why: self.events.append((old, new, why)),
            restart_policy=policy or RestartPolicy(max_retries=2, backoff_s=2, max_backoff_s=60),
            **kwargs,  # type: ignore[arg-type]
        )

    def states(self) -> list[S]:
        return [new for _, new, _ in self.events]

    async def restart_when_due(self, inst: Instance) -> asyncio.Task[None]:
        """What the owner (the daemon's scheduler) does: start it again once its backoff
        is over. Returns the start, which ends when the retry is ready or fails."""
        assert inst.state is S.BACKOFF and inst.backoff_until is not None
        await self.clock.advance(inst.backoff_until - self.clock.now())
        assert inst.state is S.BACKOFF  # no timer of its own
        retry = asyncio.create_task(start(inst))
        await settle()
        return retry


async def start(inst: Instance, timeout: float = 5.0) -> None:
    await inst.start(
        ["llama-server"],
        env={},
        cwd=None,
        port=8001,
        health_url="http://127.0.0.1:8001/health",
        startup_timeout_s=timeout,
    )


@pytest.fixture
async def world() -> AsyncIterator[Supervision]:
    health = [200]

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(health.pop(0) if len(health) > 1 else health[0])

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        yield Supervision(FakeClock(), FakeLauncher(), http, health)


async def test_ready_once_health_answers_2xx(world: Supervision) -> None:
    world.health[:] = [503, 503, 200]
    inst = world.instance()
    spawned_at = world.clock.now()
    task = asyncio.create_task(start(inst))
    await settle()
    assert inst.state is S.STARTING and inst.pid == 1000
    await world.clock.advance(1)
    await task
    assert inst.state is S.READY
    assert world.states() == [S.STARTING, S.READY]
    # Polls at 0, 3 and 6 ms: the wait is 1% of the load so far, but at least 3 ms.
    assert inst.load_s == pytest.approx(0.006)
    assert inst.ready_at == pytest.approx(spawned_at + 0.006)


async def test_startup_timeout_kills_and_explains(world: Supervision) -> None:
    world.health[:] = [503]
    inst = world.instance(RestartPolicy(max_retries=0, backoff_s=0, max_backoff_s=0))
    task = asyncio.create_task(start(inst, timeout=5))
    await world.clock.advance(4.9)
    assert not task.done()
    await world.clock.advance(0.2)
    with pytest.raises(StartFailed):
        await task
    assert inst.last_error == "not ready after 5s (health http://127.0.0.1:8001/health: 503)"
    assert world.launcher.spawned[0].signals[0] == signal.SIGKILL
    assert world.launcher.spawned[0].closed
    assert inst.state is S.FAILED
    assert inst.exit_code == -signal.SIGKILL


async def test_crash_backs_off_visibly_then_restarts(world: Supervision) -> None:
    inst = world.instance()
    await start(inst)
    world.launcher.spawned[0].exit(139)
    await settle()
    assert inst.state is S.BACKOFF
    assert inst.backoff_until == world.clock.now() + 2
    assert (inst.exit_code, inst.last_error) == (139, "exited with code 139")
    await (await world.restart_when_due(inst))
    assert inst.state is S.READY
    assert inst.restarts == 1 and inst.attempt == 1 and inst.pid == 1001
    assert world.states() == [S.STARTING, S.READY, S.BACKOFF, S.STARTING, S.READY]


async def test_a_ready_instance_killed_again_and_again_is_restarted_and_flagged_never_failed(
    world: Supervision,
) -> None:
    inst = world.instance(RestartPolicy(max_retries=2, backoff_s=2, max_backoff_s=8))
    await start(inst)
    looping = []
    for delay in (2, 4, 8, 8, 8, 8):
        world.launcher.spawned[-1].exit(-signal.SIGKILL)
        await settle()
        assert inst.state is S.BACKOFF
        assert inst.backoff_until == world.clock.now() + delay
        looping.append(inst.crash_looping)
        await (await world.restart_when_due(inst))
        assert inst.state is S.READY
    assert looping == [False, True, True, True, True, True]
    assert inst.restarts == 6 and len(world.launcher.spawned) == 7
    assert S.FAILED not in world.states()
    assert world.events[-3][2] == (
        "killed by signal SIGKILL; died after being ready (6 times in 10 min), restart in 8s"
    )


async def test_crash_looping_clears_after_a_minute_ready(world: Supervision) -> None:
    inst = world.instance(RestartPolicy(max_retries=1, backoff_s=2, max_backoff_s=8))
    await start(inst)
    world.launcher.spawned[-1].exit(1)
    await settle()
    await (await world.restart_when_due(inst))
    assert inst.state is S.READY and inst.crash_looping
    await world.clock.advance(59.9)
    assert inst.crash_looping
    await world.clock.advance(0.1)
    assert not inst.crash_looping


async def test_starts_that_never_become_ready_end_failed(world: Supervision) -> None:
    world.launcher.ring_lines = ["CUDA error: out of memory"]
    world.health[:] = [503]
    inst = world.instance(RestartPolicy(max_retries=2, backoff_s=2, max_backoff_s=60))
    starts = [asyncio.create_task(start(inst))]
    await settle()
    for delay in (2, 4):
        world.launcher.spawned[-1].exit(1)
        await settle()
        assert inst.state is S.BACKOFF
        assert inst.backoff_until == world.clock.now() + delay
        starts.append(await world.restart_when_due(inst))
        assert inst.state is S.STARTING
    world.launcher.spawned[-1].exit(1)
    await settle()
    assert inst.state is S.FAILED
    assert inst.last_error == "exited with code 1: CUDA error: out of memory"
    assert world.events[-1][2].endswith("gave up after 3 failed starts in a row")
    for each in starts:  # every try's caller hears that it failed
        with pytest.raises(StartFailed):
            await each


async def test_a_stop_in_backoff_ends_stopped_and_nothing_restarts(world: Supervision) -> None:
    inst = world.instance()
    await start(inst)
    world.launcher.spawned[0].exit(1)
    await settle()
    assert await inst.stop("unload", timeout_s=5) == 1
    assert inst.state is S.STOPPED and inst.backoff_until is None
    await world.clock.advance(100)
    assert inst.state is S.STOPPED and len(world.launcher.spawned) == 1


async def test_stop_sends_sigkill_only_after_the_grace(world: Supervision) -> None:
    world.launcher.ignore_sigterm = True
    inst = world.instance()
    await start(inst)
    stopping = asyncio.create_task(inst.stop("unload", timeout_s=3))
    await settle()
    proc = world.launcher.spawned[0]
    assert inst.state is S.STOPPING and proc.signals == [signal.SIGTERM]
    await world.clock.advance(3)
    assert await stopping == -signal.SIGKILL
    assert proc.signals[:2] == [signal.SIGTERM, signal.SIGKILL]
    assert world.states()[-2:] == [S.STOPPING, S.STOPPED]
    assert inst.last_error is None  # a stop is not a crash


async def test_stop_is_idempotent_and_concurrent_stops_share_one_kill(world: Supervision) -> None:
    inst = world.instance()
    assert await inst.stop("nothing running", timeout_s=1) is None
    assert world.events == []
    await start(inst)
    first, second = await asyncio.gather(inst.stop("a", timeout_s=1), inst.stop("b", timeout_s=1))
    assert first == second == -signal.SIGTERM
    assert world.states() == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]


async def test_stop_while_starting_fails_the_start(world: Supervision) -> None:
    world.health[:] = [503]
    inst = world.instance()
    task = asyncio.create_task(start(inst))
    await settle()
    await inst.stop("unload", timeout_s=1)
    with pytest.raises(StartFailed, match="stopped: unload"):
        await task
    assert world.states() == [S.STARTING, S.STOPPING, S.STOPPED]


async def test_command_not_found_fails_without_retrying(world: Supervision) -> None:
    world.launcher.missing = True
    inst = world.instance()
    with pytest.raises(StartFailed, match="command not found"):
        await start(inst)
    assert inst.state is S.FAILED and inst.exit_code is None  # there was no process
    await inst.stop("unload", timeout_s=1)
    assert inst.state is S.STOPPED


async def test_start_after_failed_resets_the_count(world: Supervision) -> None:
    world.health[:] = [503]
    inst = world.instance(RestartPolicy(max_retries=0, backoff_s=1, max_backoff_s=1))
    first = asyncio.create_task(start(inst))
    await settle()
    world.launcher.spawned[0].exit(1)
    with pytest.raises(StartFailed):
        await first
    assert inst.state is S.FAILED and inst.attempt == 1
    world.health[:] = [200]
    await start(inst)  # an operator asked for a load
    assert inst.state is S.READY and inst.attempt == 0


async def test_illegal_requests_are_refused(world: Supervision) -> None:
    inst = world.instance()
    with pytest.raises(IllegalTransition):
        inst.begin_draining("not even running")
    await start(inst)
    with pytest.raises(IllegalTransition):
        await start(inst)
    assert len(world.launcher.spawned) == 1


async def test_crash_while_draining_just_stops(world: Supervision) -> None:
    inst = world.instance()
    await start(inst)
    inst.begin_draining("evicted for embed")
    world.launcher.spawned[0].exit(1)
    await settle()
    assert inst.state is S.STOPPED
    assert world.states() == [S.STARTING, S.READY, S.DRAINING, S.STOPPED]
    assert (inst.exit_code, inst.last_error) == (1, "exited with code 1")


async def test_a_death_just_before_a_stop_is_said_not_passed_off_as_a_clean_stop(
    world: Supervision,
) -> None:
    inst = world.instance()
    await start(inst)
    world.launcher.spawned[0].exit(-signal.SIGKILL)  # the OOM killer, a moment before
    await inst.stop("evicted for embed", timeout_s=5)
    assert inst.state is S.STOPPED
    reason = "evicted for embed (killed by signal SIGKILL before the stop took effect)"
    assert world.events[-1] == (S.STOPPING, S.STOPPED, reason)
    assert inst.last_error == "killed by signal SIGKILL before the stop took effect"


async def test_an_instance_waits_in_backoff_for_its_owner(world: Supervision) -> None:
    inst = world.instance()
    await start(inst)
    world.launcher.spawned[0].exit(1)
    await settle()
    assert inst.state is S.BACKOFF
    assert inst.backoff_due == world.clock.monotonic() + 2
    await world.clock.advance(100)
    assert inst.state is S.BACKOFF and len(world.launcher.spawned) == 1  # no timer of its own
    await start(inst)  # the owner decides the retry
    assert inst.state is S.READY and inst.restarts == 1 and inst.attempt == 1
    assert world.events[-2] == (S.BACKOFF, S.STARTING, "restart after backoff (attempt 1)")


async def test_on_spawned_failure_kills_the_process(world: Supervision) -> None:
    async def broken(proc: RuntimeProcess) -> None:
        raise RuntimeError("database is locked")

    inst = world.instance(RestartPolicy(max_retries=0, backoff_s=1, max_backoff_s=1))
    with pytest.raises(StartFailed, match="could not record the started process"):
        await inst.start(
            ["llama-server"],
            env={},
            cwd=None,
            port=1,
            health_url="http://127.0.0.1:1/health",
            startup_timeout_s=5,
            on_spawned=broken,
        )
    assert world.launcher.spawned[0].signals[0] == signal.SIGKILL
    assert inst.state is S.FAILED


async def test_an_observer_that_raises_does_not_break_supervision(world: Supervision) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("observer bug")

    inst = Instance(
        "chat",
        launcher=world.launcher,
        clock=world.clock,
        http=world.http,
        log=LogRing(),
        on_state=boom,
    )
    await start(inst)
    assert inst.state is S.READY
    await inst.stop("unload", timeout_s=1)
    assert inst.state is S.STOPPED


async def test_a_process_that_survives_sigkill_leaves_the_instance_failed(
    world: Supervision,
) -> None:
    world.launcher.unkillable = True
    inst = world.instance(kill_timeout_s=5)
    await start(inst)
    stopping = asyncio.create_task(inst.stop("unload", timeout_s=1))
    await world.clock.advance(1)  # grace over: SIGKILL
    assert not stopping.done()
    await world.clock.advance(5)  # and still there
    assert await stopping is None
    assert inst.state is S.FAILED
    assert inst.last_error == "pid 1000 did not exit after SIGKILL"
    assert inst.pid == 1000  # still visible: it holds whatever it holds


async def test_a_caller_giving_up_does_not_cancel_the_load(world: Supervision) -> None:
    world.health[:] = [503, 503, 200]
    inst = world.instance()
    impatient = asyncio.create_task(start(inst))
    await settle()
    impatient.cancel()
    await world.clock.advance(1)
    assert impatient.cancelled()
    assert inst.state is S.READY


async def test_a_stable_run_resets_the_attempt_count(world: Supervision) -> None:
    policy = RestartPolicy(max_retries=1, backoff_s=2, max_backoff_s=2, stable_after_s=60)
    inst = world.instance(policy)
    await start(inst)
    world.launcher.spawned[-1].exit(1)
    await settle()
    await (await world.restart_when_due(inst))
    assert inst.state is S.READY and inst.attempt == 1
    await world.clock.advance(61)
    world.launcher.spawned[-1].exit(1)
    await settle()
    assert inst.state is S.BACKOFF and inst.attempt == 1  # not FAILED: it had held
