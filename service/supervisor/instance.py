"""One runtime instance: one child process group, its lifecycle, and its restarts.

The lifecycle is ``domain.InstanceState``; every change goes through ``_set_state``,
which checks ``domain.TRANSITIONS`` and tells the owner (``on_state``) why. The table is
used unchanged:

    STOPPED/FAILED --start()--> STARTING --health 2xx--> READY --begin_draining()--> DRAINING
    STARTING/READY --exit, timeout--> BACKOFF (restart scheduled) or FAILED (gave up)
    BACKOFF --delay passed--> STARTING        DRAINING --exit--> STOPPED (it was leaving)
    STARTING/READY/DRAINING --stop()--> STOPPING --> STOPPED (FAILED if it survives SIGKILL)
    BACKOFF/FAILED --stop()--> STOPPED        STARTING --command not found--> FAILED

A failed start goes straight to BACKOFF or FAILED, as a crash does: the restart tracker
decides, so a runtime that dies while loading and one that dies while serving count
against the same ``max_retries``. Backoff is a state with a deadline (``backoff_until``)
that ``vramd ps`` can show, not a retry loop hidden inside ``start``.

Each start runs one task that owns that process until it is gone: it spawns, waits for
health, watches for the exit, and carries out stops. ``start``, ``stop`` and the restart
timer only ask it (a stop request is an event it races against everything else), so two
coroutines never signal or reap the same process, and a caller that stops waiting for
``start`` (a client went away) does not cancel a load that others wait for.

``on_exit`` is told of every process end that ``stop`` did not ask for (a crash, an
early exit, a start that timed out), after the state has moved.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx

from service.clock import Clock
from service.domain import TRANSITIONS, InstanceState, check_transition
from service.errors import VramdError
from service.supervisor.backoff import DEFAULT_POLICY, RestartPolicy, RestartTracker
from service.supervisor.logs import LogRing
from service.supervisor.process import ProcessLauncher, RuntimeProcess, SpawnError

logger = logging.getLogger(__name__)

S = InstanceState
OnState = Callable[["Instance", InstanceState, InstanceState, str], None]
OnExit = Callable[["Instance", int, str], None]
OnSpawned = Callable[[RuntimeProcess], Awaitable[None]]
RestartGate = Callable[["Instance"], Awaitable[bool]]

# Health polling starts fast (a small runtime is up in tens of milliseconds) and slows
# down, so a model that takes minutes to load is not hammered.
HEALTH_FIRST_DELAY_S = 0.015
HEALTH_MAX_DELAY_S = 0.25
HEALTH_REQUEST_TIMEOUT_S = 2.0
STDERR_LINES_IN_ERROR = 5


class StartFailed(VramdError):
    """A start did not reach READY; the message is also the instance's ``last_error``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start (and restart) the same runtime again."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    port: int
    health_url: str
    startup_timeout_s: float
    on_spawned: OnSpawned | None


class _Outcome(enum.Enum):
    STOP = "stop"
    EXITED = "exited"
    READY = "ready"
    TIMEOUT = "timeout"
    ABORTED = "aborted"


class Instance:
    """The single owner of one service's runtime process and its state."""

    def __init__(
        self,
        key: str,
        *,
        launcher: ProcessLauncher,
        clock: Clock,
        http: httpx.AsyncClient,
        log: LogRing,
        on_state: OnState,
        on_exit: OnExit | None = None,
        restart_policy: RestartPolicy = DEFAULT_POLICY,
        restart_gate: RestartGate | None = None,
        kill_timeout_s: float = 5.0,
    ) -> None:
        """``restart_gate``, if given, is awaited before each restart after backoff: the
        orchestrator's admission (it may wait for memory); False cancels the restart."""
        self.key = key
        self.log = log
        self._launcher = launcher
        self._clock = clock
        self._http = http
        self._on_state = on_state
        self._on_exit = on_exit
        self._restart_gate = restart_gate
        self._kill_timeout_s = kill_timeout_s
        self._tracker = RestartTracker(restart_policy)
        self._state = S.STOPPED
        self._spec: LaunchSpec | None = None
        self._proc: RuntimeProcess | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._stop_event = asyncio.Event()
        self._stop_reason = ""
        self._stop_timeout_s = 0.0
        self._health_note = ""
        self._abort_reason = ""
        self._log_mark = 0
        self._last_error: str | None = None
        self._exit_code: int | None = None
        self._started_at: float | None = None
        self._ready_at: float | None = None
        self._load_s: float | None = None
        self._backoff_until: float | None = None
        self._restarts = 0

    # -- what the owner reads ---------------------------------------------------------

    @property
    def state(self) -> InstanceState:
        return self._state

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def port(self) -> int | None:
        return self._spec.port if self._spec is not None else None

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def exit_code(self) -> int | None:
        return self._exit_code

    @property
    def started_at(self) -> float | None:
        """Wall time of the current (or last) spawn."""
        return self._started_at

    @property
    def ready_at(self) -> float | None:
        return self._ready_at

    @property
    def load_s(self) -> float | None:
        """Seconds from spawn to READY of the last successful start."""
        return self._load_s

    @property
    def backoff_until(self) -> float | None:
        """Wall time the pending restart is due, while in BACKOFF."""
        return self._backoff_until if self._state is S.BACKOFF else None

    @property
    def restarts(self) -> int:
        """Restarts after backoff since this instance was created."""
        return self._restarts

    @property
    def attempt(self) -> int:
        """Consecutive failures counted towards ``max_retries``."""
        return self._tracker.failures

    # -- what the owner asks ----------------------------------------------------------

    async def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        port: int,
        health_url: str,
        startup_timeout_s: float,
        on_spawned: OnSpawned | None = None,
    ) -> None:
        """Start the runtime and return once it is READY; raise ``StartFailed`` if not.

        ``on_spawned`` is awaited right after the spawn, before health polling: the
        daemon records pid, pgid and start time there, so a process exists nowhere
        unrecorded. From STOPPED or FAILED the restart count starts afresh; from BACKOFF
        the pending restart is replaced by this one.
        """
        spec = LaunchSpec(
            tuple(argv), dict(env), cwd, port, health_url, startup_timeout_s, on_spawned
        )
        if self._state in (S.STOPPED, S.FAILED):
            self._tracker.reset()
        elif self._state is S.BACKOFF:
            self._cancel_restart()
        started = self._begin(spec, "start requested")
        await asyncio.shield(started)

    def begin_draining(self, reason: str) -> None:
        """READY → DRAINING: take no new work; the owner stops it when in-flight is 0."""
        self._set_state(S.DRAINING, reason)

    async def stop(self, reason: str, *, timeout_s: float) -> int | None:
        """Stop the process group: SIGTERM, ``timeout_s`` of grace, SIGKILL, reap.

        Safe in any state: a pending restart is cancelled, FAILED becomes STOPPED, and a
        second caller waits for the first. Returns the runtime's exit status (None if
        there was no process to stop).
        """
        if self._state in (S.STARTING, S.READY, S.DRAINING):
            self._stop_reason = reason
            self._stop_timeout_s = timeout_s
            self._set_state(S.STOPPING, reason)
            self._stop_event.set()
        run = self._run_task
        if run is not None and not run.done():
            # Shielded: a caller that gives up waiting must not abort a half-done kill.
            await asyncio.shield(run)
        if self._state is S.BACKOFF:
            self._cancel_restart()
            self._set_state(S.STOPPED, reason)
        elif self._state is S.FAILED:
            self._set_state(S.STOPPED, reason)
        return self._exit_code

    # -- the state setter -------------------------------------------------------------

    def _set_state(self, new: InstanceState, reason: str) -> None:
        old = self._state
        check_transition(old, new)
        self._state = new
        try:
            self._on_state(self, old, new, reason)
        except Exception:
            # An observer's bug must not leave a process unsupervised.
            logger.exception("on_state observer failed for %s (%s -> %s)", self.key, old, new)

    # -- the run task: one per process ------------------------------------------------

    def _begin(self, spec: LaunchSpec, reason: str) -> asyncio.Future[None]:
        self._set_state(S.STARTING, reason)
        self._spec = spec
        self._backoff_until = None
        self._stop_event = asyncio.Event()
        self._health_note = "no answer yet"
        self._log_mark = self.log.mark()
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started.add_done_callback(_mark_retrieved)
        self._run_task = asyncio.create_task(self._run(spec, started, self._stop_event))
        self._run_task.add_done_callback(self._task_done)
        return started

    async def _run(
        self, spec: LaunchSpec, started: asyncio.Future[None], stop: asyncio.Event
    ) -> None:
        proc: RuntimeProcess | None = None
        try:
            try:
                proc = await self._launcher.spawn(
                    spec.argv, env=spec.env, cwd=spec.cwd, log=self.log
                )
            except SpawnError as exc:
                self._no_process(str(exc))
                return
            self._proc = proc
            self._exit_code = None
            self._started_at = self._clock.now()
            t0 = self._clock.monotonic()
            outcome = await self._starting(proc, spec, stop)
            if outcome is _Outcome.READY and not stop.is_set():
                self._load_s = self._clock.monotonic() - t0
                self._ready_at = self._clock.now()
                self._tracker.on_ready(self._clock.monotonic())
                self._set_state(S.READY, f"ready after {self._load_s:.1f}s")
                started.set_result(None)
                outcome = await _first({_Outcome.STOP: stop.wait(), _Outcome.EXITED: proc.wait()})
            if stop.is_set():
                await self._terminate(proc)
            else:
                await self._ended(proc, outcome, spec)
        except asyncio.CancelledError:
            # Only the event loop shutting down cancels this task: leave nothing behind.
            if proc is not None:
                proc.send_signal_group(signal.SIGKILL)
            raise
        except Exception as exc:
            logger.exception("supervising %s failed", self.key)
            if proc is not None:
                proc.send_signal_group(signal.SIGKILL)
            self._last_error = f"internal error while supervising: {exc!r}"
            self._proc = None
            if S.FAILED in TRANSITIONS[self._state]:
                self._set_state(S.FAILED, self._last_error)
        finally:
            if not started.done():
                message = self._last_error if self._state is not S.STOPPED else None
                started.set_exception(StartFailed(message or f"stopped: {self._stop_reason}"))

    async def _starting(
        self, proc: RuntimeProcess, spec: LaunchSpec, stop: asyncio.Event
    ) -> _Outcome:
        if spec.on_spawned is not None:
            try:
                await spec.on_spawned(proc)
            except Exception as exc:
                logger.exception("on_spawned failed for %s", self.key)
                self._abort_reason = f"could not record the started process: {exc!r}"
                return _Outcome.ABORTED
        return await _first(
            {
                _Outcome.STOP: stop.wait(),
                _Outcome.EXITED: proc.wait(),
                _Outcome.READY: self._poll_health(spec.health_url),
                _Outcome.TIMEOUT: self._clock.sleep(spec.startup_timeout_s),
            }
        )

    async def _poll_health(self, url: str) -> None:
        delay = HEALTH_FIRST_DELAY_S
        while True:
            try:
                response = await self._http.get(url, timeout=HEALTH_REQUEST_TIMEOUT_S)
            except httpx.ConnectError:
                self._health_note = "connection refused"
            except httpx.TimeoutException:
                self._health_note = "timed out"
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                self._health_note = f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    return
                self._health_note = str(response.status_code)
            await self._clock.sleep(delay)
            delay = min(delay * 1.5, HEALTH_MAX_DELAY_S)

    async def _terminate(self, proc: RuntimeProcess) -> None:
        """Carry out a stop request: SIGTERM the group, grace, SIGKILL, reap, sweep."""
        proc.send_signal_group(signal.SIGTERM)
        if not await self._wait_exit(proc, self._stop_timeout_s):
            proc.send_signal_group(signal.SIGKILL)
            await self._wait_exit(proc, self._kill_timeout_s)
        code = await self._release(proc)
        if code is None:
            self._last_error = f"pid {proc.pid} did not exit after SIGKILL"
            self._set_state(S.FAILED, self._last_error)
        else:
            self._set_state(S.STOPPED, self._stop_reason)

    async def _ended(self, proc: RuntimeProcess, outcome: _Outcome, spec: LaunchSpec) -> None:
        """The process exited, or a start failed: reap, explain, then BACKOFF or FAILED."""
        was = self._state
        if outcome is not _Outcome.EXITED:
            proc.send_signal_group(signal.SIGKILL)
            await self._wait_exit(proc, self._kill_timeout_s)
        code = await self._release(proc)
        if outcome is _Outcome.EXITED and code is not None:
            tail = self.log.stderr_tail(STDERR_LINES_IN_ERROR, since=self._log_mark)
            error = describe_exit(code, tail)
        elif outcome is _Outcome.TIMEOUT:
            error = (
                f"not ready after {spec.startup_timeout_s:g}s "
                f"(health {spec.health_url}: {self._health_note})"
            )
        else:
            error = self._abort_reason
        if code is None:
            error += f"; pid {proc.pid} did not exit after SIGKILL"
        self._last_error = error
        if self._state is S.STOPPING:  # a stop arrived while we were reaping: it wins
            self._set_state(S.STOPPED, f"{self._stop_reason} (already ended: {error})")
            return
        if was is S.DRAINING:
            self._set_state(S.STOPPED, f"exited while draining: {error}")
        elif code is None:
            self._set_state(S.FAILED, error)  # a restart would compete with a stuck process
        else:
            decision = self._tracker.on_failure(self._clock.monotonic())
            if decision.retry:
                self._backoff_until = self._clock.now() + decision.delay_s
                self._set_state(S.BACKOFF, f"{error}; restart in {decision.delay_s:g}s")
                self._restart_task = asyncio.create_task(self._restart_after(decision.delay_s))
                self._restart_task.add_done_callback(self._task_done)
            else:
                retries = self._tracker.policy.max_retries
                self._set_state(S.FAILED, f"{error}; gave up after {retries} restarts")
        if code is not None and self._on_exit is not None:
            try:
                self._on_exit(self, code, error)
            except Exception:
                logger.exception("on_exit observer failed for %s", self.key)

    def _no_process(self, error: str) -> None:
        """The spawn itself failed: retrying cannot find a missing command, so FAILED."""
        self._last_error = error
        if self._state is S.STOPPING:
            self._set_state(S.STOPPED, self._stop_reason)
        else:
            self._set_state(S.FAILED, error)

    async def _wait_exit(self, proc: RuntimeProcess, timeout_s: float) -> bool:
        if proc.returncode is not None:
            return True
        return await _first({True: proc.wait(), False: self._clock.sleep(timeout_s)})

    async def _release(self, proc: RuntimeProcess) -> int | None:
        """Kill what is left of the group after the leader, flush its output, forget it."""
        proc.send_signal_group(signal.SIGKILL)
        await proc.close()
        self._proc = None
        self._exit_code = proc.returncode
        return proc.returncode

    # -- restart after backoff --------------------------------------------------------

    async def _restart_after(self, delay_s: float) -> None:
        await self._clock.sleep(delay_s)
        if self._restart_gate is not None:
            try:
                admitted = await self._restart_gate(self)
            except Exception as exc:
                logger.exception("restart gate failed for %s", self.key)
                self._last_error = f"restart gate failed: {exc!r}"
                self._set_state(S.FAILED, self._last_error)
                return
            if not admitted:
                self._set_state(S.STOPPED, "restart not admitted")
                return
        spec = self._spec
        assert spec is not None
        self._restart_task = None
        self._restarts += 1
        self._begin(spec, f"restart after backoff (attempt {self._tracker.failures})")

    def _cancel_restart(self) -> None:
        if self._restart_task is not None:
            self._restart_task.cancel()
            self._restart_task = None

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("supervisor task for %s failed", self.key, exc_info=task.exception())

    def __repr__(self) -> str:
        return f"<Instance {self.key} {self._state} pid={self.pid}>"


def describe_exit(returncode: int, stderr_tail: str) -> str:
    """``exited with code 1: CUDA error: out of memory`` / ``killed by signal SIGSEGV``."""
    if returncode < 0:
        try:
            head = f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            head = f"killed by signal {-returncode}"
    else:
        head = f"exited with code {returncode}"
    return f"{head}: {stderr_tail}" if stderr_tail else head


K = TypeVar("K")


async def _first(contenders: Mapping[K, Awaitable[object]]) -> K:
    """Run the awaitables together; return the key of the first to finish (first listed
    wins a tie) and cancel the rest."""
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


def _mark_retrieved(future: asyncio.Future[None]) -> None:
    # Nobody may be awaiting a restart's start: read the exception so asyncio does not
    # report it as never retrieved.
    if not future.cancelled():
        future.exception()
