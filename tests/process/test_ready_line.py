"""Readiness on the runtime's ready line: a tiny Python runtime that prints llama-server's
"model loaded" line, against a supervisor whose fallback poll delay is made long.

The runtime answers its first ``/health`` (asked once its port is open) with 503 and only
then (as told by its flags) turns ready and prints the line, so the count of health polls
says what triggered each: one poll at the start, one more when the line arrives, and no
other for a minute (the patched fallback delay). Also the quick first re-check of the
settle barrier and the fallback schedule, on a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
from support.fake_clock import FakeClock
from support.ports import free_port

from service.adapters.llamacpp import LLAMA_CPP, LLAMA_READY_LINE
from service.clock import SystemClock
from service.domain import InstanceState
from service.supervisor import (
    Instance,
    LogRing,
    RestartPolicy,
    RuntimeProcess,
    SubprocessLauncher,
    run,
    runtime_environment,
    wait_settled,
)
from service.supervisor.run import LaunchSpec, OnSpawned, ProcessRun, RunResult, health_poll_delay

READY_LINE = "0.00.099.290 I srv  llama_server: model loaded"  # what the build here prints

RUNTIME = r"""
import argparse, http.server, sys, threading
p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--then", choices=["ready-and-line", "line-only", "ready-only"], required=True)
a = p.parse_args()
ready = threading.Event()
answered = threading.Event()

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if ready.is_set() else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.wfile.flush()
        if not answered.is_set():
            answered.set()
            if a.then != "line-only":
                ready.set()
            if a.then != "ready-only":
                print("LINE", file=sys.stderr, flush=True)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Health).serve_forever()
""".replace("LINE", READY_LINE)

LONG_DELAY_S = 60.0  # the fallback poll delay while these tests run: never waited out


def until_listening(port: int) -> OnSpawned:
    """An ``on_spawned`` hook that waits for the runtime's port to accept connections,
    so the first health poll is answered (503) rather than refused."""

    async def wait(proc: RuntimeProcess) -> None:
        async with asyncio.timeout(20):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    await asyncio.sleep(0.005)
                    continue
                writer.close()
                await writer.wait_closed()
                return

    return wait


@pytest.fixture
def long_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "HEALTH_FIRST_DELAY_S", LONG_DELAY_S)
    monkeypatch.setattr(run, "HEALTH_MAX_DELAY_S", LONG_DELAY_S)


class Runs:
    """ProcessRuns of the runtime above, each killed at the end whatever the test did."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.log = LogRing()
        self.ready: list[ProcessRun] = []
        self.tasks: list[asyncio.Task[RunResult]] = []
        self.runs: list[ProcessRun] = []

    def start(self, then: str) -> ProcessRun:
        port = free_port()
        spec = LaunchSpec(
            argv=(sys.executable, "-c", RUNTIME, "--port", str(port), "--then", then),
            env=runtime_environment({}),
            cwd=None,
            port=port,
            health_url=f"http://127.0.0.1:{port}/health",
            startup_timeout_s=LONG_DELAY_S,
            on_spawned=until_listening(port),
            health_ok=LLAMA_CPP.health_ok,
            ready_line=LLAMA_READY_LINE,
        )
        proc_run = ProcessRun(
            spec,
            launcher=SubprocessLauncher(),
            clock=SystemClock(),
            http=self.http,
            log=self.log,
            on_ready=lambda: self.ready.append(proc_run),
            kill_timeout_s=2.0,
        )
        self.runs.append(proc_run)
        self.tasks.append(asyncio.create_task(proc_run.run()))
        return proc_run

    async def until(self, predicate: object, timeout_s: float = 20.0) -> None:
        assert callable(predicate)
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.005)


@pytest.fixture
async def runs() -> AsyncIterator[Runs]:
    async with httpx.AsyncClient(trust_env=False) as http:
        r = Runs(http)
        try:
            yield r
        finally:
            for proc_run in r.runs:
                proc_run.request_stop(0.5)
            for proc_run in r.runs:
                if proc_run.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc_run.proc.pgid, signal.SIGKILL)
            await asyncio.gather(*r.tasks, return_exceptions=True)


@pytest.mark.usefixtures("long_fallback")
async def test_the_ready_line_triggers_the_health_poll_that_finds_it_ready(runs: Runs) -> None:
    proc_run = runs.start("ready-and-line")
    # Well before the minute the fallback would wait: only the line can have asked.
    await runs.until(lambda: runs.ready, timeout_s=20)
    assert runs.ready == [proc_run]
    assert proc_run.health_polls == 2  # the first (503), then the one the line asked for


@pytest.mark.usefixtures("long_fallback")
async def test_the_line_alone_never_means_ready(runs: Runs) -> None:
    proc_run = runs.start("line-only")
    await runs.until(lambda: proc_run.health_polls == 2)
    await asyncio.sleep(0.3)  # room for a wrong "ready" to show
    assert runs.ready == []
    assert proc_run.health_polls == 2  # the line asked once; health said 503


@pytest.mark.usefixtures("long_fallback")
async def test_a_line_from_a_previous_process_does_not_count(runs: Runs) -> None:
    previous = await SubprocessLauncher().spawn(
        [sys.executable, "-c", f"print({READY_LINE!r}, flush=True)"],
        env=runtime_environment({}),
        cwd=None,
        log=runs.log,
    )
    assert await previous.wait() == 0
    await previous.close()
    assert runs.log.tail(1)[0].text == READY_LINE
    proc_run = runs.start("ready-only")  # turns ready after its first answer, prints nothing
    await runs.until(lambda: proc_run.health_polls == 1)
    await asyncio.sleep(0.3)
    assert runs.ready == []  # the earlier line asked for no poll; the next is a minute away
    assert proc_run.health_polls == 1


@pytest.mark.usefixtures("long_fallback")
async def test_instance_start_passes_the_ready_line_through() -> None:
    port = free_port()
    async with httpx.AsyncClient(trust_env=False) as http:
        inst = Instance(
            "svc",
            launcher=SubprocessLauncher(),
            clock=SystemClock(),
            http=http,
            log=LogRing(),
            on_state=lambda *_: None,
            restart_policy=RestartPolicy(max_retries=0, backoff_s=0, max_backoff_s=0),
        )
        try:
            async with asyncio.timeout(20):
                await inst.start(
                    [
                        sys.executable,
                        "-c",
                        RUNTIME,
                        "--port",
                        str(port),
                        "--then",
                        "ready-and-line",
                    ],
                    env=runtime_environment({}),
                    cwd=None,
                    port=port,
                    health_url=f"http://127.0.0.1:{port}/health",
                    startup_timeout_s=LONG_DELAY_S,
                    on_spawned=until_listening(port),
                    health_ok=LLAMA_CPP.health_ok,
                    ready_line=LLAMA_CPP.ready_line,
                )
            assert inst.state is InstanceState.READY
        finally:
            await inst.stop("test over", timeout_s=0.5)


def test_the_llama_ready_line_matches_what_llama_server_prints() -> None:
    assert LLAMA_READY_LINE.search(READY_LINE)
    assert LLAMA_READY_LINE.search("srv  llama_server: model loaded")  # no log prefix
    assert LLAMA_READY_LINE.search("srv          main: model loaded")  # older builds
    assert LLAMA_READY_LINE.search("0.01.234.567 I srv          main: model loaded\x1b[0m")
    assert not LLAMA_READY_LINE.search("srv    load_model: loading model 'm.gguf'")
    assert not LLAMA_READY_LINE.search("main: model loaded")  # not from the server's main


def test_log_listeners_hear_new_lines_until_stopped() -> None:
    ring = LogRing()
    ring.append("stdout", "before", ts=0)
    heard: list[str] = []
    stop = ring.listen(lambda line: heard.append(line.text))
    ring.append("stderr", "one", ts=1)
    stop()
    stop()  # twice is harmless
    ring.append("stderr", "two", ts=2)
    assert heard == ["one"]


def test_the_fallback_poll_is_quick_early_and_capped_later() -> None:
    assert health_poll_delay(0.0) == run.HEALTH_FIRST_DELAY_S <= 0.005
    assert health_poll_delay(1.0) <= 0.011  # a runtime ready in ~1 s is seen within ~10 ms
    assert health_poll_delay(600.0) == run.HEALTH_MAX_DELAY_S == 0.25
    delays = [health_poll_delay(t / 10) for t in range(0, 600)]
    assert delays == sorted(delays)


async def test_the_settle_barrier_checks_again_within_milliseconds() -> None:
    clock = FakeClock()
    answers = iter([False, True])

    async def released() -> bool:
        return next(answers)

    waiter = asyncio.create_task(wait_settled(released, clock=clock, timeout_s=5))
    await clock.advance(0.005)
    assert waiter.done() and waiter.result() is True


async def test_the_settle_barrier_slows_to_its_interval() -> None:
    clock = FakeClock()
    asked_at: list[float] = []

    async def released() -> bool:
        asked_at.append(clock.monotonic() - 1000.0)
        return False

    waiter = asyncio.create_task(wait_settled(released, clock=clock, timeout_s=1.0))
    await clock.advance(1.0)
    assert await waiter is False
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(asked_at)]
    assert gaps[:5] == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert set(gaps[5:-1]) == {0.1}
