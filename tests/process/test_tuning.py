"""``yielding: auto`` (docs/policy.md, "Yielding, self-tuned"): it switches when the
traffic changes and holds when it does not (on the simulator's virtual clock, the
tuner's own rounds), and the daemon's round -- a real low-priority child process --
chooses what the simulator chooses on the same arrivals, feeds the choice to the
scheduler and writes a ``tuning`` event.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.fake_clock import FakeClock

from service.domain import Yielding
from service.kernel.tuning import AutoTuning
from service.live.events import EventLog
from service.policy import load_policy
from service.replay import tuner
from service.replay.benchdata import parse_bench_data
from service.replay.harness import run_system, simulate
from service.replay.setup import Setup, build_setup
from service.replay.trace import TraceRequest
from service.replay.vramd import Vramd, fixed_system
from service.replay.worker import figures_from_json
from service.scheduler import Tuning
from service.store import Store, StoreWriter, open_store, queries

# Two services that cannot share the card: a warm assistant and an on-demand batch model.
POLICY = """
version: 1
device: {budget: 10GiB, headroom: 0}
services:
  hi: {kind: chat, models: [hi], command: [x], memory: {estimate: 8GiB},
       residency: warm, priority: 300, max_concurrency: 2}
  lo: {kind: chat, models: [lo], command: [x], memory: {estimate: 8GiB},
       residency: on-demand, priority: 100, max_concurrency: 2}
"""
BENCH = "hi: {load_s: 20, true_peak: 8GiB}\nlo: {load_s: 10, true_peak: 8GiB}\n"
# (mean gap of hi, mean gap of lo, lo's service time). Quiet assistant, busy batch model:
# yielding at once serves the batch in time. Busy assistant, rare long batch jobs:
# yielding at once makes the assistant's requests wait for the batch and a reload.
QUIET_HI = (240.0, 20.0, 2.0)
BUSY_HI = (8.0, 120.0, 20.0)


def setup() -> Setup:
    return build_setup(load_policy(POLICY), parse_bench_data(BENCH))


def trace(
    *phases: tuple[float, float, tuple[float, float, float]], seed: int = 1
) -> list[TraceRequest]:
    rng = random.Random(seed)
    raw: list[tuple[float, str, float]] = []
    for start, end, (hi_gap, lo_gap, lo_s) in phases:
        for model, gap, service_s in (("hi", hi_gap, 2.0), ("lo", lo_gap, lo_s)):
            t = start + rng.expovariate(1 / gap)
            while t < end:
                raw.append((t, model, service_s))
                t += rng.expovariate(1 / gap)
    raw.sort()
    return [TraceRequest(f"r{i}", t, model, d) for i, (t, model, d) in enumerate(raw)]


def choices(requests: list[TraceRequest]) -> list[tuple[float, str, bool]]:
    """Each round of the simulated daemon's tuner: (time, choice after it, changed)."""
    events = run_system(Vramd, setup(), requests).events
    return [
        (e["t"], e["data"]["current"], e["data"]["changed"])
        for e in events
        if e["kind"] == "tuning"
    ]


def weighted(system: type[Vramd], requests: list[TraceRequest]) -> float:
    return float(run_system(system, setup(), requests).summary["weighted_slo"])


def test_the_two_traffic_shapes_want_different_settings() -> None:
    """The premise of the next test, from whole-trace replays of the fixed settings."""
    quiet, busy = trace((0, 3600, QUIET_HI)), trace((0, 3600, BUSY_HI))
    eager, at_deadline = (
        fixed_system(Tuning(Yielding.EAGER)),
        fixed_system(Tuning(Yielding.AT_DEADLINE)),
    )
    assert weighted(eager, quiet) > weighted(at_deadline, quiet) + 0.1
    assert weighted(at_deadline, busy) > weighted(eager, busy) + 0.02


def test_auto_switches_when_the_traffic_changes_and_holds_when_it_does_not() -> None:
    """From the untuned start (balanced) to eager at the first round, and away from eager
    once the assistant gets busy; never back and forth."""
    rounds = choices(trace((0, 2400, QUIET_HI), (2400, 7200, BUSY_HI)))
    assert [r[1] for r in rounds if r[0] < 2400] == ["eager", "eager"]  # at 600 s and 1500 s
    changes = [(t, current) for t, current, changed in rounds if changed]
    assert len(changes) == 2, rounds  # no flapping after either switch
    assert changes[0] == (pytest.approx(tuner.FIRST_AFTER_S, abs=1), "eager")
    at, current = changes[1]
    assert at > 2400 and current != "eager"
    assert all(c == current for t, c, _ in rounds if t >= at)


def test_steady_traffic_keeps_its_first_choice_for_hours() -> None:
    rounds = choices(trace((0, 2 * 3600, QUIET_HI), seed=7))
    changed = [r for r in rounds if r[2]]
    assert len(rounds) >= 7 and [r[1] for r in changed] == ["eager"]
    assert changed[0][0] == pytest.approx(tuner.FIRST_AFTER_S, abs=1)


# ------------------------------------------------------------------ the daemon's round


def test_the_worker_lowers_its_priority_and_answers_with_the_simulators_figures() -> None:
    system = simulate(fixed_system(Tuning()), setup(), trace((0, 900, BUSY_HI)))
    traffic = system.pump.traffic
    job = tuner.job_of(
        system.setup.policy,
        traffic.since(0.0),
        system.scheduler.learned(),
        traffic.device_totals,
        Tuning(),
    )
    assert isinstance(job, tuner.Job)
    worker = subprocess.Popen(
        [sys.executable, "-m", "service.replay.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(worker.pid).nice() != 19:  # before it reads its job
            assert time.monotonic() < deadline, "the worker never lowered its priority"
            time.sleep(0.02)
        out, _ = worker.communicate(pickle.dumps(job), timeout=120)
    finally:
        worker.kill()
    answer = json.loads(out)
    assert figures_from_json(answer["figures"]) == tuner.evaluate(job)
    assert answer["cpu_s"] > 0


@contextlib.contextmanager
def daemon_tuning(tmp_path: Path, system: Vramd) -> Iterator[tuple[AutoTuning, Store, StoreWriter]]:
    """The daemon's tuning over a simulated run's pump, its clock at the run's end, its
    events written to a real store."""
    clock = FakeClock(monotonic=system.clock.now)
    store = open_store(tmp_path / "vramd.db")
    writer = StoreWriter(store)
    writer.start()
    try:
        tuning = AutoTuning(
            pump=system.pump, events=EventLog(writer, clock), clock=clock,
            policy=lambda: system.setup.policy,
        )  # fmt: skip
        yield tuning, store, writer
    finally:
        writer.close()
        store.close()


async def test_the_daemons_round_feeds_its_choice_and_writes_a_tuning_event(tmp_path: Path) -> None:
    """Arrivals recorded by a pump (here the simulator's, after half an hour of a quiet
    assistant and a busy batch model), handed to the daemon's tuning: the real worker replays
    them, the choice is what the simulator's own tuner chooses, and it reaches the
    scheduler and the event log."""
    system = simulate(fixed_system(Tuning()), setup(), trace((0, 1800, QUIET_HI)))
    with daemon_tuning(tmp_path, system) as (tuning, store, writer):
        view = (await tuning.tune()).model_dump()
        job = tuner.job_of(
            system.setup.policy, system.pump.traffic.since(system.clock.now - tuner.WINDOW_S),
            system.scheduler.learned(), system.pump.traffic.device_totals, Tuning(),
        )  # fmt: skip
        assert isinstance(job, tuner.Job)
        expected = tuner.choose(tuner.evaluate(job), Tuning()).tuning
        assert expected != Tuning()
        assert (view["current"], view["top_never"]) == (expected.yielding.value, expected.top_never)
        assert view["rounds"] == 1 and view["cpu_s"] > 0 and view["figures"]
        assert view["why"].startswith(f"chose {expected.label}: eager ")
        assert expected.yielding is Yielding.EAGER
        assert system.scheduler.tuning == expected
        assert await writer.flushed(timeout=10)
        with store.session() as session:
            (event,) = queries.list_events(session, kind="tuning")
        assert event.data["current"] == expected.yielding.value
        labels = [f["candidate"] for f in event.data["figures"]]
        assert labels[:4] == ["eager", "balanced", "reluctant", "at-deadline"]


@pytest.mark.parametrize("requests", [0, 5])
async def test_too_little_traffic_runs_no_round_and_changes_nothing(
    tmp_path: Path, requests: int
) -> None:
    system = simulate(fixed_system(Tuning()), setup(), trace((0, 5 * 240.0, QUIET_HI))[:requests])
    with daemon_tuning(tmp_path, system) as (tuning, _, _):
        view = (await tuning.tune()).model_dump()
        assert view["rounds"] == 0 and view["current"] == "balanced"
        assert view["why"] == f"not tuned yet: {requests} requests in the last hour, fewer than 30"
