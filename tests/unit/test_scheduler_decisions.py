"""Decisions that used to live in the kernel, now in the pure core (docs/architecture.md).

Backoff retries (a pass past the backoff deadline issues the ``Start``), vLLM-style sleep
and wake, operators' loads/unloads/restarts answered by the events they cause
(``Resolve``, no polling), and shutdown. Each test feeds events on a chosen clock and
asserts on the actions -- through the same ``Pump`` the daemon and the bench use, with
an ``Effects`` that records what it is asked to do.
"""

from __future__ import annotations

from support.scheduling import World, rule

from service.domain import Residency
from service.scheduler import (
    DeviceRule,
    Grant,
    InstanceAsleep,
    InstanceBackoff,
    InstanceFailed,
    InstanceReady,
    InstanceStopped,
    LoadRequested,
    MakeRoom,
    Note,
    PolicyChanged,
    Reject,
    RequestArrived,
    RequestFinished,
    Resolve,
    RestartRequested,
    ShutdownRequested,
    Start,
    Stop,
    StopSleeper,
    Tick,
    UnloadRequested,
    WindowChanged,
)

MiB = 1024**2


def starts(calls: list[object]) -> list[str]:
    return [c.service for c in calls if isinstance(c, Start)]


def of(calls: list[object], kind: type) -> list:  # type: ignore[type-arg]
    return [c for c in calls if isinstance(c, kind)]


def answers(calls: list[object]) -> dict[str, tuple[str, str]]:
    return {c.ticket: (c.outcome, c.message) for c in calls if isinstance(c, Resolve)}


# ------------------------------------------------------------------ backoff retries


def test_a_pass_past_the_backoff_deadline_issues_the_retry() -> None:
    world = World(rule("s"))
    world.send(RequestArrived("r1", "s"))
    assert world.send(InstanceBackoff("s", "exit code 1", retry_at=5.0), at=1.0) == [
        Note("s", "backoff", "s failed to start (exit code 1); it starts again within 4s", {})
    ]
    assert starts(world.send(Tick(), at=4.9)) == []
    retry = of(world.send(Tick(), at=5.0), Start)
    assert [(a.service, a.device, a.retry) for a in retry] == [("s", 0, True)]
    assert starts(world.send(Tick(), at=6.0)) == []  # issued once
    assert world.state("s") == "starting"


def test_a_request_arriving_during_a_crash_backoff_is_served_by_the_next_instance() -> None:
    world = World(rule("s", idle_ttl_s=300.0))
    world.serve("s")
    world.send(InstanceBackoff("s", "killed by signal SIGKILL", retry_at=4.0, crashed=True), at=2)
    assert world.send(RequestArrived("r2", "s"), at=3.0) == []  # waits in the queue
    assert starts(world.send(Tick(), at=4.0)) == ["s"]
    assert of(world.send(InstanceReady("s"), at=5.0), Grant) == [Grant("r2", "s")]


def test_a_crashed_instance_is_retried_however_often_it_dies_while_wanted() -> None:
    world = World(rule("p", Residency.PINNED))
    world.send(Tick())
    world.send(InstanceReady("p"))
    for n in range(20):
        at = 10.0 * n
        world.send(InstanceBackoff("p", "killed", retry_at=at + 5, crashed=True), at=at + 1)
        assert starts(world.send(Tick(), at=at + 5)) == ["p"]
        world.send(InstanceReady("p"), at=at + 6)
    assert world.state("p") == "ready"


def test_a_crashed_instance_nothing_wants_back_is_stopped_not_retried() -> None:
    # Idle past its idle TTL when it died (it would have been unloaded): no restart,
    # its memory is released, and the next request loads it afresh.
    world = World(rule("s", idle_ttl_s=60.0))
    world.serve("s")
    calls = world.send(InstanceBackoff("s", "killed", retry_at=62.0, crashed=True), at=61.0)
    assert [(c.service, c.drain) for c in of(calls, Stop)] == [("s", False)]
    assert [n.kind for n in of(calls, Note)] == ["no-retry"]
    world.send(InstanceStopped("s"), at=61.5)
    assert starts(world.send(Tick(), at=62.0)) == []
    assert world.sched.service_view("s").charge == 0
    assert starts(world.send(RequestArrived("r2", "s"), at=70.0)) == ["s"]


def test_a_backoff_that_outlives_the_idle_ttl_gives_up_the_retry() -> None:
    world = World(rule("s", idle_ttl_s=60.0))
    world.serve("s")  # last used at 0
    world.send(InstanceBackoff("s", "killed", retry_at=65.0, crashed=True), at=50.0)
    calls = world.send(Tick(), at=65.0)
    assert starts(calls) == [] and [c.service for c in of(calls, Stop)] == ["s"]


def test_an_instance_back_after_a_crash_keeps_its_idle_clock() -> None:
    world = World(rule("s", idle_ttl_s=60.0))
    world.serve("s")  # last used at 0
    world.send(InstanceBackoff("s", "killed", retry_at=40.0, crashed=True), at=30.0)
    assert starts(world.send(Tick(), at=40.0)) == ["s"]
    world.send(InstanceReady("s"), at=41.0)
    assert of(world.send(Tick(), at=59.0), Stop) == []
    drain, _terminate = of(world.send(Tick(), at=60.0), Stop)
    assert drain.reason.startswith("idle for 1m")


def test_explain_says_a_backed_off_service_died_and_when_it_starts_again() -> None:
    world = World(rule("s", idle_ttl_s=300.0))
    world.serve("s")
    world.send(InstanceBackoff("s", "killed by signal SIGKILL", retry_at=8.0, crashed=True), at=2)
    answer = world.sched.explain("s", now=3.0)
    assert answer.verdict == "backoff"
    assert answer.message == (
        "s died after being ready (killed by signal SIGKILL); it starts again within 5s, "
        "on device 0; its memory stays reserved"
    )
    assert answer.data == {"restart_in_s": 5.0, "crashed": True}


def test_a_backoff_without_a_deadline_is_not_retried_by_the_scheduler() -> None:
    world = World(rule("s"))
    world.send(RequestArrived("r1", "s"))
    world.send(InstanceBackoff("s", "exit code 1"))
    assert starts(world.send(Tick(), at=100.0)) == []


def test_an_out_of_memory_retry_waits_for_the_instances_evicted_for_it() -> None:
    world = World(rule("big", priority=200), rule("small", estimate=300 * MiB))
    world.serve("small", "w1")
    world.sample()
    world.send(RequestArrived("r1", "big"))
    world.send(InstanceBackoff("big", "CUDA error: out of memory", retry_at=2.0))
    calls = world.send(MakeRoom("big", "its load failed with out-of-memory"))
    assert [(s.service, s.drain) for s in of(calls, Stop)] == [("small", True), ("small", False)]
    assert starts(world.send(Tick(), at=3.0)) == []  # small still stopping
    assert starts(world.send(InstanceStopped("small"), at=3.5)) == ["big"]


def test_a_stop_during_backoff_cancels_the_retry() -> None:
    world = World(rule("s"))
    world.send(RequestArrived("r1", "s"))
    world.send(InstanceBackoff("s", "exit code 1", retry_at=5.0))
    world.send(UnloadRequested("s"))
    world.send(InstanceStopped("s"))
    assert starts(world.send(Tick(), at=10.0)) == []
    assert world.state("s") == "stopped"


# ------------------------------------------------------------------ sleep and wake


def sleeper_world(**kw: object) -> World:
    return World(rule("vllm", **kw), rule("other", priority=200, estimate=700 * MiB))


def put_to_sleep(world: World) -> None:
    world.serve("vllm")
    world.sample()
    calls = world.send(RequestArrived("o1", "other"))
    stops = [(s.service, s.drain, s.sleepable) for s in of(calls, Stop)]
    assert stops == [("vllm", True, True), ("vllm", False, True)]
    assert starts(world.send(InstanceAsleep("vllm"))) == ["other"]


def test_an_asleep_service_counts_stopped_and_its_next_load_is_a_wake() -> None:
    world = sleeper_world()
    put_to_sleep(world)
    assert world.sched.service_view("vllm").charge == 0
    world.send(InstanceReady("other"))
    world.send(RequestFinished("o1"))
    world.send(UnloadRequested("other"))
    world.send(InstanceStopped("other"))
    wake = of(world.send(RequestArrived("v2", "vllm")), Start)
    assert [(a.service, a.wake) for a in wake] == [("vllm", True)]


def test_a_sleeper_is_stopped_for_good_after_its_idle_ttl() -> None:
    world = sleeper_world(idle_ttl_s=30.0)
    put_to_sleep(world)
    assert of(world.send(Tick(), at=29.0), StopSleeper) == []
    stop = of(world.send(Tick(), at=30.0), StopSleeper)
    assert stop == [StopSleeper("vllm", "asleep longer than its idle_ttl (30s)")]
    assert of(world.send(Tick(), at=31.0), StopSleeper) == []  # once
    world.send(InstanceStopped("vllm"))
    world.send(UnloadRequested("other"))
    world.send(InstanceStopped("other"))
    wake = of(world.send(RequestArrived("v2", "vllm")), Start)
    assert [(a.service, a.wake) for a in wake] == [("vllm", False)]  # gone: a fresh load


def test_a_load_waiting_for_memory_stops_the_sleepers_first() -> None:
    world = World(
        rule("vllm"),
        rule("other", priority=200, estimate=700 * MiB),
        rule("third", estimate=500 * MiB),
    )
    put_to_sleep(world)
    world.send(InstanceReady("other"))  # o1 stays in flight: other is busy
    world.sample()
    calls = world.send(RequestArrived("t1", "third"))
    assert [n.kind for n in of(calls, Note)] == ["wait"]
    assert of(calls, StopSleeper) == [StopSleeper("vllm", "third waits for memory")]


def test_an_unload_of_a_sleeper_is_answered_once_its_process_is_gone() -> None:
    world = sleeper_world()
    put_to_sleep(world)
    calls = world.send(UnloadRequested("vllm", ticket="t1"))
    assert of(calls, StopSleeper) == [StopSleeper("vllm", "unloaded by an operator")]
    assert answers(calls) == {}
    assert answers(world.send(InstanceStopped("vllm"))) == {"t1": ("stopped", "")}


def test_a_sleeper_being_stopped_is_loaded_only_once_it_is_gone() -> None:
    world = sleeper_world(idle_ttl_s=10.0)
    put_to_sleep(world)
    world.send(Tick(), at=10.0)  # StopSleeper
    world.send(InstanceReady("other"))
    world.send(RequestFinished("o1"))
    world.send(UnloadRequested("other"))
    world.send(InstanceStopped("other"))
    assert starts(world.send(RequestArrived("v2", "vllm"))) == []
    assert starts(world.send(InstanceStopped("vllm"))) == ["vllm"]


# ------------------------------------------------------------------ operators


def test_a_load_is_answered_ready_when_the_instance_is() -> None:
    world = World(rule("s"))
    calls = world.send(LoadRequested("s", ticket="t1"))
    assert starts(calls) == ["s"] and answers(calls) == {}
    assert answers(world.send(InstanceReady("s"))) == {"t1": ("ready", "")}


def test_a_load_that_waits_for_memory_is_answered_waiting_with_what_for() -> None:
    world = World(rule("hog", Residency.PINNED, estimate=800 * MiB), rule("s"))
    world.send(InstanceReady("hog"))
    world.sample()
    world.send(RequestArrived("h1", "hog"))
    outcome, message = answers(world.send(LoadRequested("s", ticket="t1")))["t1"]
    assert outcome == "refused"  # a pinned 800 MiB leaves no room for 600 MiB, ever
    assert "pinned" in message


def test_a_load_waiting_behind_a_protected_instance_is_answered_waiting() -> None:
    world = World(rule("warm", Residency.WARM, protect_s=600.0, priority=200), rule("s"))
    world.serve("warm")
    world.sample()
    outcome, message = answers(world.send(LoadRequested("s", ticket="t1")))["t1"]
    assert outcome == "waiting"
    assert "warm" in message


def test_a_load_of_a_crash_looping_service_is_answered_failed() -> None:
    world = World(rule("s"))
    world.send(LoadRequested("s", ticket="t1"))
    assert answers(world.send(InstanceFailed("s", "exit code 1"))) == {
        "t1": ("failed", "s failed to load: exit code 1")
    }


def test_a_load_of_a_window_only_service_outside_its_window_is_answered_window_closed() -> None:
    world = World(rule("batch", Residency.WINDOW_ONLY))
    world.send(WindowChanged(frozenset(), {"batch": 3600.0}))
    calls = world.send(LoadRequested("batch", ticket="t1"))
    assert starts(calls) == []
    (answer,) = of(calls, Resolve)
    assert (answer.outcome, answer.retry_after) == ("window_closed", 3600.0)


def test_a_restart_is_answered_when_the_new_instance_is_ready() -> None:
    world = World(rule("s"))
    world.serve("s")
    calls = world.send(RestartRequested("s", "requested by an operator", ticket="t1"))
    assert [(s.drain) for s in of(calls, Stop)] == [True, False]
    assert answers(calls) == {}
    assert starts(world.send(InstanceStopped("s"))) == ["s"]
    assert answers(world.send(InstanceReady("s"))) == {"t1": ("ready", "")}


def test_a_restart_of_a_stopped_service_loads_it() -> None:
    world = World(rule("s"))
    assert starts(world.send(RestartRequested("s", "operator", ticket="t1"))) == ["s"]
    assert answers(world.send(InstanceReady("s"))) == {"t1": ("ready", "")}


def test_an_unload_is_answered_stopped_once_the_process_is_gone() -> None:
    world = World(rule("s"))
    world.serve("s")
    assert answers(world.send(UnloadRequested("s", ticket="t1"))) == {}
    assert answers(world.send(InstanceStopped("s"))) == {"t1": ("stopped", "")}
    assert answers(world.send(UnloadRequested("s", ticket="t2"))) == {"t2": ("stopped", "")}


def test_operators_of_a_removed_service_get_an_answer() -> None:
    world = World(rule("s"), rule("t"))
    world.serve("s")
    world.send(UnloadRequested("s", ticket="t1"))
    rules = {"t": world.rules["t"]}
    world.send(PolicyChanged(rules, DeviceRule()))
    assert answers(world.send(InstanceStopped("s"))) == {
        "t1": ("stopped", "s was removed from the policy")
    }


# ------------------------------------------------------------------ shutdown


def test_shutdown_drains_everything_refuses_waiting_and_loads_nothing() -> None:
    world = World(rule("s", max_concurrency=1), rule("p", Residency.PINNED, estimate=100 * MiB))
    world.send(InstanceReady("p"))
    world.send(RequestArrived("r1", "s"))
    world.send(InstanceReady("s"))
    world.send(RequestArrived("r2", "s"))  # queued behind r1
    calls = world.send(ShutdownRequested())
    assert [(r.request_id, r.code) for r in of(calls, Reject)] == [("r2", "insufficient_capacity")]
    assert {(s.service, s.drain) for s in of(calls, Stop)} == {
        ("p", True),
        ("p", False),
        ("s", True),
    }
    assert [s.drain for s in of(world.send(RequestFinished("r1")), Stop)] == [False]
    world.send(InstanceStopped("p"))
    assert starts(world.send(Tick(), at=5.0)) == []  # pinned, but the daemon is stopping
    (refused,) = of(world.send(RequestArrived("r3", "s")), Reject)
    assert (refused.code, refused.message) == ("insufficient_capacity", "vramd is shutting down")
