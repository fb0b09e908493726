"""One process of an instance, from spawn until it is reaped."""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from service.clock import Clock
from service.supervisor.logs import LogLine, LogRing
from service.supervisor.process import ProcessLauncher, RuntimeProcess, SpawnError, describe_exit

logger = logging.getLogger("vramd.supervisor")

OnSpawned = Callable[[RuntimeProcess], Awaitable[None]]
# Whether one answer of the health path means ready: (status code, body) -> bool. The
# runtime's adapter knows (llama-server answers 200 {"status": "loading model"} early).
HealthOk = Callable[[int, bytes], bool]


def any_success(status_code: int, body: bytes) -> bool:
    """Ready on any 2xx: what a runtime vramd knows nothing about is taken to mean."""
    return 200 <= status_code < 300


# Health polling starts fast (a small runtime is up in tens of milliseconds) and slows
# down, so a model that takes minutes to load is not hammered: the wait between polls is
# a share of the time spent loading so far, between the first delay and the cap. What
# polling adds to a load is then at most ~1% of it (3 ms at first, 10 ms after 1 s,
# 250 ms once past 25 s), at ~100 polls in the first 0.3 s and 4 a second at the cap.
HEALTH_FIRST_DELAY_S = 0.003
HEALTH_DELAY_SHARE = 0.01
HEALTH_MAX_DELAY_S = 0.25
HEALTH_REQUEST_TIMEOUT_S = 2.0
# Health polls leave no idle keep-alive connection to the runtime: llama-server (cpp-httplib)
# takes ~100 ms longer to exit on SIGTERM while a client holds one open, and a swap waits
# for that exit. A fresh loopback connection per poll costs a fraction of a millisecond.
_CLOSE = {"Connection": "close"}
STDERR_LINES_IN_ERROR = 5


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start (and restart) the same runtime again."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    port: int
    health_url: str
    startup_timeout_s: float
    on_spawned: OnSpawned | None = None
    health_ok: HealthOk = any_success
    # A line the runtime prints once it can serve (the adapter's ``ready_line``): when
    # this process prints it, health is polled at once instead of at the next delay.
    ready_line: re.Pattern[str] | None = None
    # The runtime prints ``ready_line`` only once its health answers ready (the adapter's
    # ``ready_line_final``): the line alone is then enough, with no poll to confirm it.
    ready_line_final: bool = False


def health_poll_delay(elapsed_s: float) -> float:
    """The wait before the next health poll, ``elapsed_s`` into a start."""
    return min(HEALTH_MAX_DELAY_S, max(HEALTH_FIRST_DELAY_S, elapsed_s * HEALTH_DELAY_SHARE))


class RunEnd(enum.Enum):
    STOPPED = "stopped"  # a stop was requested and carried out
    EXITED = "exited"  # the process ended on its own, before or after ready
    NOT_READY = "not-ready"  # the startup timeout passed; the group was killed
    ABORTED = "aborted"  # on_spawned failed; the group was killed
    NO_PROCESS = "no-process"  # the spawn itself failed
    DETACHED = "detached"  # let go of, still running, for the next daemon to adopt


@dataclass(frozen=True, slots=True)
class RunResult:
    end: RunEnd
    returncode: int | None  # None: no process, or one that survived SIGKILL
    error: str  # why it ended, for last_error; "" after a clean stop

    @property
    def survived_kill(self) -> bool:
        return self.end not in (RunEnd.NO_PROCESS, RunEnd.DETACHED) and self.returncode is None


class ProcessRun:
    """A ``ProcessRun`` is the only code that signals or waits for its process, so two
    coroutines never race to kill or reap the same pid. It spawns, lets the owner record the
    process (``on_spawned``), polls health until an answer means ready (``health_ok``, the
    runtime's adapter's) while watching for an early exit and the startup deadline, then
    watches for the exit, and carries out a stop request (SIGTERM
    to the group, grace, SIGKILL, reap, SIGKILL again for members that outlived the leader).
    Every wait is a race with the process's exit, so nothing waits for a dead process.

    Health is polled at once when the runtime prints its ready line (``ready_line``, the
    adapter's: llama-server's "model loaded"), so a swap does not wait out a poll delay; the
    line only triggers the poll, an answer from health still decides. Without one, or until
    it comes, polls start a few milliseconds apart and spread out as the load goes on
    (``health_poll_delay``).

    It decides no lifecycle state: it calls ``on_ready`` when health answers and returns a
    ``RunResult`` saying how the process ended; the ``Instance`` turns that into STOPPED,
    BACKOFF or FAILED.
    """

    def __init__(
        self,
        spec: LaunchSpec,
        *,
        launcher: ProcessLauncher,
        clock: Clock,
        http: httpx.AsyncClient,
        log: LogRing,
        on_ready: Callable[[], None],
        kill_timeout_s: float,
        adopted: RuntimeProcess | None = None,
    ) -> None:
        """``adopted``: a process a previous daemon started and that already answers;
        the run watches it from its first moment as ready, with no spawn and no load."""
        self.spec = spec
        self.proc: RuntimeProcess | None = adopted  # until reaped
        self._adopted = adopted
        self.started_at: float | None = None
        self.load_s: float | None = None
        self._launcher = launcher
        self._clock = clock
        self._http = http
        self._log = log
        self.log_mark = log.mark()  # lines before this belong to earlier processes
        self._on_ready = on_ready
        self._kill_timeout_s = kill_timeout_s
        self._stop = asyncio.Event()
        self._detach = False
        self._stop_timeout_s = 0.0
        self._health = "no answer yet"
        self._line_heard = asyncio.Event()  # this process printed its ready line
        self.health_polls = 0  # health requests sent for this process, answered or not

    def request_stop(self, timeout_s: float) -> None:
        """Ask for SIGTERM, ``timeout_s`` of grace, then SIGKILL; the first request counts."""
        if not self._stop.is_set():
            self._stop_timeout_s = timeout_s
            self._stop.set()

    def request_detach(self) -> None:
        """Let go of the process without signalling it (the daemon leaves it running)."""
        if not self._stop.is_set():
            self._detach = True
            self._stop.set()

    async def run(self) -> RunResult:
        try:
            if self._adopted is not None:
                return await self._watch_adopted(self._adopted)
            return await self._run()
        except BaseException:
            # Cancelled (the loop is shutting down) or a bug: leave nothing running.
            if self.proc is not None:
                self.proc.send_signal_group(signal.SIGKILL)
            raise

    async def _run(self) -> RunResult:
        spec = self.spec
        # Listening from before the spawn, so a line printed at once is not missed.
        unlisten = self._log.listen(self._heard) if spec.ready_line is not None else None
        try:
            try:
                proc = await self._launcher.spawn(
                    spec.argv, env=spec.env, cwd=spec.cwd, log=self._log
                )
            except SpawnError as exc:
                return RunResult(RunEnd.NO_PROCESS, None, str(exc))
            self.proc = proc
            self.started_at = self._clock.now()
            t0 = self._clock.monotonic()
            end = await self._until_ready(proc)
        finally:
            if unlisten is not None:
                unlisten()
        if end is None and not self._stop.is_set():
            self.load_s = self._clock.monotonic() - t0
            self._on_ready()
            return await self._until_end(proc)
        if self._stop.is_set():
            return await self._stopped(proc)
        assert end is not None
        return await self._ended(proc, end)

    async def _watch_adopted(self, proc: RuntimeProcess) -> RunResult:
        self.started_at = self._clock.now()
        self._on_ready()
        return await self._until_end(proc)

    async def _until_end(self, proc: RuntimeProcess) -> RunResult:
        """A ready process: until it exits, or a stop or detach is asked."""
        await _first({RunEnd.STOPPED: self._stop.wait(), RunEnd.EXITED: proc.wait()})
        if self._stop.is_set():
            return await self._stopped(proc)
        return await self._ended(proc, RunEnd.EXITED)

    async def _stopped(self, proc: RuntimeProcess) -> RunResult:
        if not self._detach:
            return await self._terminate(proc)
        proc.detach()
        self.proc = None
        return RunResult(RunEnd.DETACHED, None, "")

    async def _until_ready(self, proc: RuntimeProcess) -> RunEnd | None:
        """None once health says ready; otherwise why the start ended."""
        if self.spec.on_spawned is not None:
            try:
                await self.spec.on_spawned(proc)
            except Exception as exc:
                logger.exception("on_spawned failed for pid %d", proc.pid)
                self._health = f"could not record the started process: {exc!r}"
                return RunEnd.ABORTED
        return await _first(
            {
                RunEnd.STOPPED: self._stop.wait(),
                RunEnd.EXITED: proc.wait(),
                None: self._poll_health(),
                RunEnd.NOT_READY: self._clock.sleep(self.spec.startup_timeout_s),
            }
        )

    def _heard(self, line: LogLine) -> None:
        """A log listener: lines of earlier processes (before the mark) do not count."""
        pattern = self.spec.ready_line
        if line.seq >= self.log_mark and pattern is not None and pattern.search(line.text):
            self._line_heard.set()

    async def _poll_health(self) -> None:
        t0 = self._clock.monotonic()
        final = self.spec.ready_line_final
        while True:
            if final and self._line_heard.is_set():
                return
            self._line_heard.clear()  # a line heard from here on asks for another poll
            if await self._health_says_ready():
                return
            delay = health_poll_delay(self._clock.monotonic() - t0)
            if self.spec.ready_line is None:
                await self._clock.sleep(delay)
            else:
                await _first({True: self._line_heard.wait(), False: self._clock.sleep(delay)})

    async def _health_says_ready(self) -> bool:
        """One health request: whether its answer means ready (else ``_health`` says why)."""
        self.health_polls += 1
        try:
            response = await self._http.get(
                self.spec.health_url, headers=_CLOSE, timeout=HEALTH_REQUEST_TIMEOUT_S
            )
        except httpx.ConnectError:
            self._health = "connection refused"
        except httpx.TimeoutException:
            self._health = "timed out"
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            self._health = f"{type(exc).__name__}: {exc}"
        except AttributeError as exc:
            # anyio asks a socket the runtime closed as it connected for its peer (its
            # raw socket is None then): a failed poll of a dying runtime, not our error.
            self._health = f"connection lost: {exc}"
        else:
            if self.spec.health_ok(response.status_code, response.content):
                return True
            self._health = _not_ready(response)
        return False

    async def _terminate(self, proc: RuntimeProcess) -> RunResult:
        gone_before = proc.returncode is not None
        proc.send_signal_group(signal.SIGTERM)
        killed = False
        if not await self._wait_exit(proc, self._stop_timeout_s):
            logger.warning(
                "pid %d (%s) still running %.1fs after SIGTERM: killing its process group",
                proc.pid, Path(self.spec.argv[0]).name, self._stop_timeout_s,
            )  # fmt: skip
            proc.send_signal_group(signal.SIGKILL)
            killed = True
            await self._wait_exit(proc, self._kill_timeout_s)
        code = await self._release(proc)
        error = "" if code is not None else f"pid {proc.pid} did not exit after SIGKILL"
        if code is not None and (gone_before or (code == -signal.SIGKILL and not killed)):
            # It died on its own as the stop came (the OOM killer, a kill): the stop goes
            # on as asked, but the death is said, not passed off as a clean stop.
            tail = self._log.stderr_tail(STDERR_LINES_IN_ERROR, since=self.log_mark)
            error = f"{describe_exit(code, tail)} before the stop took effect"
        return RunResult(RunEnd.STOPPED, code, error)

    async def _ended(self, proc: RuntimeProcess, end: RunEnd) -> RunResult:
        if end is not RunEnd.EXITED:
            # Not ready in time, or unrecorded: nothing worth a graceful shutdown.
            proc.send_signal_group(signal.SIGKILL)
            await self._wait_exit(proc, self._kill_timeout_s)
        code = await self._release(proc)
        if end is RunEnd.NOT_READY:
            error = (
                f"not ready after {self.spec.startup_timeout_s:g}s "
                f"(health {self.spec.health_url}: {self._health})"
            )
        elif end is RunEnd.ABORTED:
            error = self._health
        else:
            assert code is not None
            tail = self._log.stderr_tail(STDERR_LINES_IN_ERROR, since=self.log_mark)
            error = describe_exit(code, tail)
        if code is None:
            error += f"; pid {proc.pid} did not exit after SIGKILL"
        return RunResult(end, code, error)

    async def _wait_exit(self, proc: RuntimeProcess, timeout_s: float) -> bool:
        if proc.returncode is not None:
            return True
        return await _first({True: proc.wait(), False: self._clock.sleep(timeout_s)})

    async def _release(self, proc: RuntimeProcess) -> int | None:
        """Kill group members that outlived the leader, flush the output, let go."""
        proc.send_signal_group(signal.SIGKILL)
        await proc.close()
        if proc.returncode is not None:  # one stuck in the kernel stays visible
            self.proc = None
        return proc.returncode


K = TypeVar("K")


async def _first(contenders: Mapping[K, Awaitable[object]]) -> K:
    """Run the awaitables together; return the key of the first to finish (the first
    listed wins a tie) and cancel the rest."""
    tasks = {key: asyncio.ensure_future(aw) for key, aw in contenders.items()}
    try:
        done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    for key, task in tasks.items():
        if task in done:
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc
            return key
    raise AssertionError("asyncio.wait returned with nothing done")


def _not_ready(response: httpx.Response) -> str:
    """What a health answer that is not "ready" said: its status, and a 2xx's body."""
    if not response.is_success:
        return str(response.status_code)
    said = response.text.strip().replace("\n", " ")
    return f"{response.status_code} but not ready: {said[:120]}"
