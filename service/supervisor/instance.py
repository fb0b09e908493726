"""One runtime instance: its lifecycle state, its restarts, and the requests it takes."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping, Sequence

import httpx

from service.clock import Clock
from service.domain import InstanceState, check_transition
from service.errors import VramdError
from service.supervisor.backoff import (
    DEFAULT_POLICY,
    RestartDecision,
    RestartPolicy,
    RestartTracker,
)
from service.supervisor.logs import LogRing
from service.supervisor.process import ProcessLauncher, RuntimeProcess
from service.supervisor.run import (
    HealthOk,
    LaunchSpec,
    OnSpawned,
    ProcessRun,
    RunEnd,
    RunResult,
    any_success,
)

logger = logging.getLogger("vramd.supervisor")

S = InstanceState
OnState = Callable[["Instance", InstanceState, InstanceState, str], None]


class StartFailed(VramdError):
    """A start did not reach READY; the message is also the instance's ``last_error``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Instance:
    """The single owner of one service's runtime process and its state.

    The lifecycle is ``domain.InstanceState``; every change goes through ``_set_state``,
    which checks ``domain.TRANSITIONS`` and tells the owner (``on_state``) why. The table is
    used unchanged:

        STOPPED/FAILED --start()--> STARTING --health ok--> READY --begin_draining()--> DRAINING
        STARTING/READY --exit, not ready in time--> BACKOFF (restart due) or FAILED (gave up)
        BACKOFF --delay passed--> STARTING        DRAINING --exit--> STOPPED (it was leaving)
        STARTING/READY/DRAINING --stop()--> STOPPING --> STOPPED (FAILED if it survives SIGKILL)
        BACKOFF/FAILED --stop()--> STOPPED        STARTING --command not found--> FAILED

    A failed start goes straight to BACKOFF or FAILED, a crash of a ready instance to
    BACKOFF: the restart tracker (``backoff``) decides, and only starts that never became
    ready count towards ``max_retries`` (a runtime that keeps coming up is never given up
    on; it is flagged crash-looping instead). Backoff is a state with a deadline (``backoff_until``)
    that ``vramd ps`` can show, not a retry loop hidden inside ``start``: the instance waits
    in BACKOFF for its owner to ``start`` it again, so the retry is a decision like any
    other (the daemon's scheduler issues it once the deadline has passed and memory allows).

    Each start creates one ``ProcessRun`` (``run.py``), run by one task that owns that
    process until it is reaped. ``start`` and ``stop`` only ask it, so a caller that stops
    waiting for ``start`` (a client went away) does not cancel a load that others wait for,
    and a stop arriving mid-start is carried out by the same task.
    """

    def __init__(
        self,
        key: str,
        *,
        launcher: ProcessLauncher,
        clock: Clock,
        http: httpx.AsyncClient,
        log: LogRing,
        on_state: OnState,
        restart_policy: RestartPolicy = DEFAULT_POLICY,
        kill_timeout_s: float = 5.0,
    ) -> None:
        """``kill_timeout_s`` bounds the wait after SIGKILL for a process stuck in the
        kernel (a hung driver call)."""
        self.key = key
        self.log = log
        self._launcher = launcher
        self._clock = clock
        self._http = http
        self._on_state = on_state
        self._kill_timeout_s = kill_timeout_s
        self._tracker = RestartTracker(restart_policy)
        self._state = S.STOPPED
        self._run: ProcessRun | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._stop_reason = ""
        self._last_error: str | None = None
        self._exit_code: int | None = None
        self._ready_at: float | None = None
        self._load_s: float | None = None
        self._backoff_until: float | None = None
        self._backoff_due: float | None = None
        self._restarts = 0
        self._last_failure: RestartDecision | None = None
        self._adopted = False
        self._detached = False

    # -- what the owner reads ---------------------------------------------------------

    @property
    def state(self) -> InstanceState:
        return self._state

    @property
    def pid(self) -> int | None:
        """The group leader's pid while a process exists (until it is reaped)."""
        proc = self._run.proc if self._run is not None else None
        return proc.pid if proc is not None else None

    @property
    def port(self) -> int | None:
        return self._run.spec.port if self._run is not None else None

    def run_output(self) -> str:
        """Every line the current (or last) process printed that the ring still holds.

        A start that fails names its cause early and its consequences last (ggml's
        allocation failure, then "failed to load model"): ``last_error`` quotes the tail.
        """
        if self._run is None:
            return ""
        return "\n".join(
            line.text for line in self.log.tail(self.log.max_lines, since=self._run.log_mark)
        )

    @property
    def adopted(self) -> bool:
        """The current process was started by a previous daemon and adopted by this one."""
        return self._adopted and self._run is not None and self._run.proc is not None

    @property
    def detached(self) -> bool:
        """The last process was left running (``detach``), not ended."""
        return self._detached

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def exit_code(self) -> int | None:
        """Exit status of the last process that ended (negative: killed by that signal)."""
        return self._exit_code

    @property
    def started_at(self) -> float | None:
        """Wall time of the current (or last) spawn."""
        return self._run.started_at if self._run is not None else None

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
    def backoff_due(self) -> float | None:
        """Monotonic time the backoff ends, while in BACKOFF (for the owner's clock)."""
        return self._backoff_due if self._state is S.BACKOFF else None

    @property
    def restarts(self) -> int:
        """Restarts after backoff since this instance was created."""
        return self._restarts

    @property
    def attempt(self) -> int:
        """Failures since the last stable run: the step of the backoff."""
        return self._tracker.failures

    @property
    def last_failure(self) -> RestartDecision | None:
        """How the last unasked end was judged: a failed start or a death, and what next."""
        return self._last_failure

    @property
    def stable_after_s(self) -> float:
        """How long a ready instance must hold for its failures to be forgiven."""
        return self._tracker.policy.stable_after_s

    @property
    def crash_looping(self) -> bool:
        """Died after being ready ``max_retries`` times within ten minutes, and not ready
        for ``stable_after_s`` since (``backoff.RestartTracker.looping``)."""
        return self._tracker.looping(self._clock.monotonic())

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
        health_ok: HealthOk = any_success,
        ready_line: re.Pattern[str] | None = None,
        ready_line_final: bool = False,
    ) -> None:
        """Start the runtime and return once it is READY; raise ``StartFailed`` if not.

        ``ready_line`` (the adapter's) is the log line the runtime prints once it can
        serve: when this process prints it, health is polled at once (``run.py``), or,
        with ``ready_line_final``, the line alone means ready.

        ``on_spawned`` is awaited right after the spawn, before health polling: the
        daemon records pid, pgid and start time there, so no process runs unrecorded
        (if it raises, the process is killed and the start fails). From STOPPED or
        FAILED the restart count starts afresh; from BACKOFF this start replaces the
        pending restart. Anything else is refused with ``IllegalTransition``.
        """
        spec = LaunchSpec(
            tuple(argv),
            dict(env),
            cwd,
            port,
            health_url,
            startup_timeout_s,
            on_spawned,
            health_ok,
            ready_line,
            ready_line_final,
        )
        check_transition(self._state, S.STARTING)
        reason = "start requested"
        if self._state is S.BACKOFF:
            self._restarts += 1
            reason = f"restart after backoff (attempt {self.attempt})"
        else:
            self._tracker.reset()
        await asyncio.shield(self._begin(spec, reason))

    def adopt(self, proc: RuntimeProcess, spec: LaunchSpec, reason: str) -> None:
        """STOPPED → STARTING → READY at once for a process a previous daemon started and
        that answers its health now: no spawn, no load (``load_s`` stays None). From here
        on it is supervised like any: stopped, restarted when it dies, detached."""
        check_transition(self._state, S.STARTING)
        self._tracker.reset()
        self._adopted, self._detached = True, False
        self._load_s = None
        self._set_state(S.STARTING, reason)
        run = self._new_run(spec, adopted=proc)
        self._run_task = asyncio.create_task(self._supervise(run, self._started_future()))
        self._run_task.add_done_callback(self._task_done)

    async def detach(self, reason: str) -> bool:
        """Leave a READY process running when the daemon exits, for the next daemon to
        adopt; its run ends (READY → STOPPED) without a signal. False, and nothing done,
        in any other state."""
        if self._state is not S.READY or self._run is None:
            return False
        self._stop_reason = reason
        self._run.request_detach()
        if self._run_task is not None:
            await asyncio.shield(self._run_task)
        return True

    def begin_draining(self, reason: str) -> None:
        """READY → DRAINING: take no new work; the owner stops it when in-flight is 0."""
        self._set_state(S.DRAINING, reason)

    def mark_sleeping(self, reason: str) -> None:
        """READY/DRAINING → SLEEPING: the owner put the runtime to sleep (its process lives)."""
        self._set_state(S.SLEEPING, reason)

    def mark_awake(self, reason: str) -> None:
        """SLEEPING → READY: the owner woke the runtime up."""
        self._set_state(S.READY, reason)

    async def stop(self, reason: str, *, timeout_s: float) -> int | None:
        """Stop the process group: SIGTERM, ``timeout_s`` of grace, SIGKILL, reap.

        Safe in any state: a pending restart is cancelled, FAILED becomes STOPPED, and a
        second caller waits for the first. A process that survives SIGKILL (stuck in
        the kernel) leaves the instance FAILED with its pid still shown, since it may
        still hold memory. Returns ``exit_code`` afterwards.
        """
        if self._state in (S.STARTING, S.READY, S.DRAINING, S.SLEEPING):
            assert self._run is not None
            self._stop_reason = reason
            self._set_state(S.STOPPING, reason)
            self._run.request_stop(timeout_s)
        task = self._run_task
        if task is not None and not task.done():
            # Shielded: a caller that gives up waiting must not abort a half-done kill.
            await asyncio.shield(task)
        if self._state is S.BACKOFF or (self._state is S.FAILED and self.pid is None):
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

    # -- one process at a time --------------------------------------------------------

    def _begin(self, spec: LaunchSpec, reason: str) -> asyncio.Future[None]:
        self._set_state(S.STARTING, reason)
        self._backoff_until = None
        self._adopted = self._detached = False
        run = self._new_run(spec)
        started = self._started_future()
        self._run_task = asyncio.create_task(self._supervise(run, started))
        self._run_task.add_done_callback(self._task_done)
        return started

    def _new_run(self, spec: LaunchSpec, adopted: RuntimeProcess | None = None) -> ProcessRun:
        self._run = ProcessRun(
            spec,
            launcher=self._launcher,
            clock=self._clock,
            http=self._http,
            log=self.log,
            on_ready=self._became_ready,
            kill_timeout_s=self._kill_timeout_s,
            adopted=adopted,
        )
        return self._run

    def _started_future(self) -> asyncio.Future[None]:
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Nobody awaits a restart's start: read its exception so asyncio does not
        # report it as never retrieved.
        started.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._started = started
        return started

    def _became_ready(self) -> None:
        """Called by the current run, synchronously, when health first answers 2xx (or
        at once, for an adopted process)."""
        run, started = self._run, self._started
        assert run is not None and started is not None
        self._load_s = run.load_s
        self._ready_at = self._clock.now()
        self._tracker.on_ready(self._clock.monotonic())
        if run.load_s is None:
            self._set_state(S.READY, "adopted: it answers its health check")
        else:
            self._set_state(S.READY, f"ready after {run.load_s:.1f}s")
        started.set_result(None)

    async def _supervise(self, run: ProcessRun, started: asyncio.Future[None]) -> None:
        try:
            try:
                result = await run.run()
            except Exception as exc:  # a bug: the run killed its process on the way out
                logger.exception("supervising %s failed", self.key)
                result = RunResult(RunEnd.EXITED, None, f"internal error: {exc!r}")
            self._conclude(result)
        finally:
            if not started.done():
                error = self._last_error if self._state is not S.STOPPED else None
                started.set_exception(StartFailed(error or f"stopped: {self._stop_reason}"))

    def _conclude(self, result: RunResult) -> None:
        """Turn how a process ended into the next state, then tell the owner."""
        if result.end is not RunEnd.NO_PROCESS:
            self._exit_code = result.returncode
        if result.error:
            self._last_error = result.error
        error = result.error
        if result.end is RunEnd.DETACHED:
            self._detached = True
            self._set_state(S.STOPPED, self._stop_reason)
        elif result.survived_kill:
            # A restart would compete with a process the kernel cannot end.
            self._set_state(S.FAILED, error)
        elif self._state is S.STOPPING:
            # Our stop, or one that arrived while an end was being handled: it wins.
            why = f"{self._stop_reason} ({error})" if error else self._stop_reason
            self._set_state(S.STOPPED, why)
        elif result.end is RunEnd.NO_PROCESS:
            self._set_state(S.FAILED, error)  # retrying cannot find a missing command
        elif self._state is S.DRAINING:
            self._set_state(S.STOPPED, f"exited while draining: {error}")
        elif self._state is S.SLEEPING:
            # It was serving nothing; the next request loads it afresh.
            self._set_state(S.STOPPED, f"exited while asleep: {error}")
        else:
            was_ready = self._state is S.READY
            decision = self._tracker.on_failure(self._clock.monotonic(), was_ready=was_ready)
            self._last_failure = decision
            why = f"{error}; {decision.describe(self._tracker.policy.max_retries)}"
            if decision.retry:
                self._backoff_until = self._clock.now() + decision.delay_s
                self._backoff_due = self._clock.monotonic() + decision.delay_s
                self._set_state(S.BACKOFF, why)
            else:
                self._set_state(S.FAILED, why)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("supervisor task for %s failed", self.key, exc_info=task.exception())

    def __repr__(self) -> str:
        return f"<Instance {self.key} {self._state} pid={self.pid}>"
