"""The supervisor against real processes: tiny Python runtimes that misbehave on purpose.

Each runtime is ``sys.executable -c RUNTIME`` with flags (ready after a delay, never
ready, ignore SIGTERM, fork a grandchild, crash once after becoming ready). Every process
group a test starts is killed in the fixture's teardown, whatever the test did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from support.ports import free_port
from support.waiting import wait_until

from service.clock import SystemClock
from service.domain import InstanceState
from service.supervisor import (
    Instance,
    LogRing,
    OrphanRecord,
    ReapOutcome,
    RestartPolicy,
    RuntimeProcess,
    StartFailed,
    SubprocessLauncher,
    reap_orphans,
    runtime_environment,
)

S = InstanceState

RUNTIME = r"""
import argparse, http.server, os, signal, subprocess, sys, threading, time
p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--ready-after", type=float, default=0.0)
p.add_argument("--never-ready", action="store_true")
p.add_argument("--ignore-sigterm", action="store_true")
p.add_argument("--grandchild", action="store_true")
p.add_argument("--die-after-ready", type=float)
p.add_argument("--die-once")
a = p.parse_args()
if a.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if a.grandchild:
    # Inherits our stdout pipe and ignores SIGTERM: only a group SIGKILL ends it.
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print(f"grandchild {child.pid}", flush=True)
start = time.monotonic()
dying = threading.Event()

def die():
    print("GGML_ASSERT: fatal error in ggml-cuda.cu", file=sys.stderr, flush=True)
    os._exit(3)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = not a.never_ready and time.monotonic() - start >= a.ready_after
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()
        if ready and a.die_after_ready is not None and not dying.is_set():
            if not (a.die_once and os.path.exists(a.die_once)):
                if a.die_once:
                    open(a.die_once, "w").close()
                dying.set()
                threading.Timer(a.die_after_ready, die).start()

    def log_message(self, *args):
        pass

print("listening", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Health).serve_forever()
"""

CUDA_OOM = (
    "import sys; print('loading model', flush=True); "
    "print('CUDA error: out of memory', file=sys.stderr, flush=True); sys.exit(1)"
)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in the group."""
    pids = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
    return pids


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Harness:
    http: httpx.AsyncClient
    instances: list[Instance] = field(default_factory=list)
    pgids: list[int] = field(default_factory=list)
    events: list[tuple[str, S, S, str]] = field(default_factory=list)

    def instance(self, key: str = "svc", *, policy: RestartPolicy | None = None) -> Instance:
        inst = Instance(
            key,
            launcher=SubprocessLauncher(),
            clock=SystemClock(),
            http=self.http,
            log=LogRing(),
            on_state=lambda i, old, new, why: self.events.append((i.key, old, new, why)),
            restart_policy=policy or RestartPolicy(max_retries=0, backoff_s=0, max_backoff_s=0),
        )
        self.instances.append(inst)
        return inst

    async def record(self, proc: RuntimeProcess) -> None:
        self.pgids.append(proc.pgid)

    async def start(self, inst: Instance, *flags: str, timeout: float = 10.0) -> int:
        port = free_port()
        await inst.start(
            [sys.executable, "-c", RUNTIME, "--port", str(port), *flags],
            env=runtime_environment({}),
            cwd=None,
            port=port,
            health_url=f"http://127.0.0.1:{port}/health",
            startup_timeout_s=timeout,
            on_spawned=self.record,
        )
        return port

    def states(self, key: str = "svc") -> list[S]:
        return [new for k, _, new, _ in self.events if k == key]


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async with httpx.AsyncClient(trust_env=False) as http:
        h = Harness(http)
        try:
            yield h
        finally:
            for inst in h.instances:
                await inst.stop("test over", timeout_s=0.1)
            for pgid in h.pgids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)


async def test_start_waits_for_health_and_stop_ends_the_group(harness: Harness) -> None:
    inst = harness.instance()
    seen_state_when_recorded: list[S] = []

    async def on_spawned(proc: RuntimeProcess) -> None:
        seen_state_when_recorded.append(inst.state)
        await harness.record(proc)

    port = free_port()
    await inst.start(
        [sys.executable, "-c", RUNTIME, "--port", str(port), "--ready-after", "0.3"],
        env=runtime_environment({}),
        cwd=None,
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        startup_timeout_s=10,
        on_spawned=on_spawned,
    )
    assert inst.state is S.READY
    assert seen_state_when_recorded == [S.STARTING]
    assert inst.pid == harness.pgids[0]
    assert inst.load_s is not None and inst.load_s >= 0.25
    assert inst.port == port
    assert group_members(inst.pid)

    pgid = inst.pid
    code = await inst.stop("unload", timeout_s=5)
    assert code == -signal.SIGTERM
    assert inst.state is S.STOPPED and inst.pid is None
    assert harness.states() == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]
    assert group_members(pgid) == []
    assert inst.last_error is None  # a stop is not a crash


async def test_startup_timeout_kills_the_group(harness: Harness) -> None:
    inst = harness.instance()
    with pytest.raises(StartFailed) as failed:
        await harness.start(inst, "--never-ready", timeout=1.0)
    port = inst.port
    assert inst.last_error == f"not ready after 1s (health http://127.0.0.1:{port}/health: 503)"
    assert failed.value.message == inst.last_error
    assert inst.state is S.FAILED  # max_retries=0
    assert group_members(harness.pgids[0]) == []
    assert inst.exit_code == -signal.SIGKILL


async def test_early_exit_reports_the_stderr_tail(harness: Harness) -> None:
    inst = harness.instance()
    with pytest.raises(StartFailed, match="CUDA error: out of memory"):
        await inst.start(
            [sys.executable, "-c", CUDA_OOM],
            env=runtime_environment({}),
            cwd=None,
            port=1,
            health_url="http://127.0.0.1:1/health",
            startup_timeout_s=10,
        )
    assert inst.last_error == "exited with code 1: CUDA error: out of memory"
    assert inst.exit_code == 1
    assert [line.text for line in inst.log.tail(10)] == [
        "loading model",
        "CUDA error: out of memory",
    ]


async def test_sigterm_ignored_means_sigkill_after_the_timeout(harness: Harness) -> None:
    inst = harness.instance()
    await harness.start(inst, "--ignore-sigterm")
    pgid = inst.pid
    assert pgid is not None
    t0 = time.monotonic()
    code = await inst.stop("unload", timeout_s=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert code == -signal.SIGKILL
    assert inst.state is S.STOPPED
    assert group_members(pgid) == []


async def test_stop_reaches_a_grandchild_that_ignores_sigterm(harness: Harness) -> None:
    inst = harness.instance()
    await harness.start(inst, "--grandchild")
    await wait_until(lambda: any("grandchild" in line.text for line in inst.log.tail(5)))
    grandchild = int(next(ln.text for ln in inst.log.tail(5) if "grandchild" in ln.text).split()[1])
    assert alive(grandchild)
    pgid = inst.pid
    assert pgid is not None
    assert await inst.stop("unload", timeout_s=5) == -signal.SIGTERM
    await wait_until(lambda: not alive(grandchild), timeout=2)
    assert group_members(pgid) == []


async def test_crash_is_seen_even_while_a_grandchild_holds_the_pipes(harness: Harness) -> None:
    # asyncio's Process.wait() would block until the grandchild closed stdout.
    inst = harness.instance(policy=RestartPolicy(max_retries=1, backoff_s=30, max_backoff_s=30))
    await harness.start(inst, "--grandchild")
    await wait_until(lambda: any("grandchild" in line.text for line in inst.log.tail(5)))
    pgid = inst.pid
    assert pgid is not None
    os.kill(pgid, signal.SIGKILL)  # the leader only: the grandchild survives it
    await wait_until(lambda: inst.state is S.BACKOFF, timeout=5)
    assert inst.last_error == "killed by signal SIGKILL"
    assert inst.exit_code == -signal.SIGKILL
    await wait_until(lambda: group_members(pgid) == [], timeout=2)
    assert inst.backoff_until is not None
    assert await inst.stop("unload", timeout_s=1) == -signal.SIGKILL
    assert inst.state is S.STOPPED


async def test_crash_while_ready_backs_off_and_restarts(harness: Harness, tmp_path: Path) -> None:
    policy = RestartPolicy(max_retries=3, backoff_s=0.05, max_backoff_s=1)
    inst = harness.instance(policy=policy)
    marker = tmp_path / "died"
    flags = ("--die-after-ready", "0.2", "--die-once", str(marker))
    await harness.start(inst, *flags)
    first_pid = inst.pid
    await wait_until(lambda: inst.state is S.BACKOFF)
    assert inst.exit_code == 3
    assert inst.last_error == "exited with code 3: GGML_ASSERT: fatal error in ggml-cuda.cu"
    await harness.start(inst, *flags)  # the owner's retry (the daemon's scheduler)
    assert inst.restarts == 1 and inst.state is S.READY
    assert harness.states() == [S.STARTING, S.READY, S.BACKOFF, S.STARTING, S.READY]
    assert inst.attempt == 1
    assert inst.pid is not None and inst.pid != first_pid
    assert len(harness.pgids) == 2  # the restart recorded its process too
    assert first_pid is not None and group_members(first_pid) == []


async def test_a_start_that_keeps_failing_gives_up_as_failed(harness: Harness) -> None:
    inst = harness.instance(policy=RestartPolicy(max_retries=2, backoff_s=0.01, max_backoff_s=1))
    for _ in range(3):  # the first start, then the owner's retries once each backoff is over
        with pytest.raises(StartFailed):
            await inst.start(
                [sys.executable, "-c", CUDA_OOM],
                env=runtime_environment({}),
                cwd=None,
                port=1,
                health_url="http://127.0.0.1:1/health",
                startup_timeout_s=10,
            )
        if inst.state is S.BACKOFF and inst.backoff_due is not None:
            await asyncio.sleep(max(0.0, inst.backoff_due - time.monotonic()))
    assert inst.state is S.FAILED
    assert harness.states() == [
        S.STARTING,
        S.BACKOFF,
        S.STARTING,
        S.BACKOFF,
        S.STARTING,
        S.FAILED,
    ]
    assert "gave up after 3 failed starts in a row" in harness.events[-1][3]
    assert inst.attempt == 3 and inst.restarts == 2


async def test_command_not_found_is_a_clean_failure(harness: Harness) -> None:
    inst = harness.instance()
    with pytest.raises(StartFailed) as failed:
        await inst.start(
            ["vramd-no-such-runtime", "--port", "1"],
            env=runtime_environment({}),
            cwd=None,
            port=1,
            health_url="http://127.0.0.1:1/health",
            startup_timeout_s=10,
        )
    assert failed.value.message == "cannot start 'vramd-no-such-runtime': command not found"
    assert inst.state is S.FAILED and inst.exit_code is None  # there was no process


async def test_stop_while_starting_cancels_the_start(harness: Harness) -> None:
    inst = harness.instance()
    start = asyncio.create_task(harness.start(inst, "--never-ready"))
    await wait_until(lambda: bool(harness.pgids))
    await inst.stop("unload while loading", timeout_s=2)
    with pytest.raises(StartFailed, match="stopped: unload while loading"):
        await start
    assert inst.state is S.STOPPED
    assert group_members(harness.pgids[0]) == []


async def test_runtime_gets_only_the_minimal_environment(harness: Harness) -> None:
    base = {"PATH": os.environ["PATH"], "VRAMD_ADMIN_KEY": "s3cret", "OPENAI_API_KEY": "sk-x"}
    env = runtime_environment({"CUDA_VISIBLE_DEVICES": "0"}, base=base)
    proc = await SubprocessLauncher().spawn(
        [sys.executable, "-c", "import os; print(sorted(os.environ))"],
        env=env,
        cwd=None,
        log=(log := LogRing()),
    )
    assert await proc.wait() == 0
    await proc.close()
    printed = log.tail(1)[0].text
    assert "VRAMD_ADMIN_KEY" not in printed and "OPENAI_API_KEY" not in printed
    assert "'CUDA_VISIBLE_DEVICES'" in printed and "'PATH'" in printed


# -- the startup reaper ---------------------------------------------------------------


@pytest.fixture
def detached() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def spawn(code: str = "import time; time.sleep(600)") -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        started.append(proc)
        return proc

    try:
        yield spawn
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def record_of(proc: subprocess.Popen[bytes], *, skew: float = 0.0) -> OrphanRecord:
    return OrphanRecord(
        pid=proc.pid, pgid=proc.pid, proc_start_time=psutil.Process(proc.pid).create_time() + skew
    )


def test_reaper_kills_a_recorded_orphan(detached: Callable[..., subprocess.Popen[bytes]]) -> None:
    orphan = detached()
    [result] = reap_orphans([record_of(orphan)])
    assert result.outcome is ReapOutcome.REAPED
    assert result.pids == (orphan.pid,)
    assert not alive(orphan.pid)


def test_reaper_leaves_a_recycled_pid_alone(
    detached: Callable[..., subprocess.Popen[bytes]],
) -> None:
    stranger = detached()
    [result] = reap_orphans([record_of(stranger, skew=-30.0)])
    assert result.outcome is ReapOutcome.GONE
    assert "another process" in result.detail
    assert alive(stranger.pid)


def test_reaper_kills_group_members_whose_leader_is_gone(
    detached: Callable[..., subprocess.Popen[bytes]],
) -> None:
    leader = detached(
        "import subprocess, sys; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print(c.pid, flush=True)"
    )
    record = record_of(leader)
    leader.wait()
    children = [p for p in group_members(leader.pid) if p != leader.pid]
    assert len(children) == 1
    [result] = reap_orphans([record])
    assert result.outcome is ReapOutcome.REAPED
    assert result.pids == tuple(children)
    assert group_members(leader.pid) == []


def test_reaper_reports_a_vanished_record_as_gone(
    detached: Callable[..., subprocess.Popen[bytes]],
) -> None:
    done = detached("pass")
    record = record_of(done)  # readable even once it exits: it stays a zombie until waited
    done.wait()
    [result] = reap_orphans([record])
    assert result.outcome is ReapOutcome.GONE
