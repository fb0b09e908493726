"""Starting a runtime as a process group of its own, and the one object that signals it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import psutil

from service.clock import Clock, SystemClock
from service.errors import VramdError
from service.supervisor.logs import LogRing
from service.supervisor.output import OutputFiles, OutputFollower


def _pidfds_work() -> bool:
    """Whether this kernel has ``pidfd_open`` (Linux 5.3+), the fast way to watch a child."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


PIDFD = _pidfds_work()

# The exit status of a process vramd did not start (an adopted runtime): the kernel tells
# it only to the parent. No real status is this value (0..255, or -1..-64 for a signal).
EXIT_UNKNOWN = -1000


class SpawnError(VramdError):
    """The runtime could not be started at all (no such command, no permission, bad cwd)."""


class RuntimeProcess(Protocol):
    """A started runtime: the group leader, and the group it leads."""

    @property
    def pid(self) -> int: ...

    @property
    def pgid(self) -> int: ...

    @property
    def proc_start_time(self) -> float:
        """The kernel's start time of ``pid``, recorded to tell a recycled pid apart later."""
        ...

    @property
    def returncode(self) -> int | None:
        """The leader's exit status once it has exited; negative for a signal."""
        ...

    async def wait(self) -> int:
        """Wait for the group leader to exit (not for its pipes) and return its status."""
        ...

    def send_signal_group(self, sig: int) -> None:
        """Signal every process in the group; a group that is already gone is not an error."""
        ...

    @property
    def output(self) -> OutputFiles | None:
        """Where it writes its output (None where it has no files)."""
        ...

    async def close(self, timeout_s: float = 1.0) -> None:
        """Read the last of its output into the log, then release it (its files too)."""
        ...

    def detach(self) -> None:
        """Let go of it without signalling: it runs on for the next daemon to adopt."""
        ...


class ProcessLauncher(Protocol):
    """Every runtime runs in a session (and so a process group) of its own, created by
    ``start_new_session=True``. Runtimes fork: llama.cpp's RPC workers, vLLM's engine core
    and tokenizer processes, Python launchers that exec a worker. Signalling only the pid we
    started would orphan those children, and they keep holding device memory. Signalling the
    group (``os.killpg``) reaches all of them, and the group id doubles as the handle the
    startup reaper (``reaper.py``) uses for whatever a crashed daemon left behind. A new
    session also detaches the runtime from the daemon's terminal, so a Ctrl-C meant for
    ``vramd serve`` does not kill runtimes behind the supervisor's back.

    Nothing a runtime needs depends on the daemon's process (docs/operations.md, "Restarts
    and upgrades"): its output goes to files (``output.py``), not pipes; no parent-death
    signal is set; its group is its own. So a runtime outlives a daemon that crashed or was
    told to leave it running, and the next daemon can adopt it (``AdoptedProcess``): the same
    signalling, its exit seen on a pidfd (a pidfd works for any process, not only children;
    only the exit status is then unknown), its output followed from the same files.

    A spawned runtime's exit is watched on a pidfd (Linux 5.3+), or by a thread blocked in
    ``waitpid`` elsewhere. ``subprocess.Popen`` forks with vfork, not a fork of the whole
    daemon.

    Commands are argv lists and never go through a shell (docs/operations.md, "Security
    defaults").
    """

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        log: LogRing,
    ) -> RuntimeProcess:
        """Start ``argv`` in a new session; its stdout and stderr lines go to ``log``.

        Raises ``SpawnError`` when the process cannot be started.
        """
        ...


class SubprocessLauncher:
    """The real launcher; the clock stamps the log lines, ``output_dir`` holds the
    runtimes' output files (a fresh temporary directory if not given)."""

    def __init__(self, clock: Clock | None = None, output_dir: Path | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._output_dir = output_dir

    @property
    def output_dir(self) -> Path:
        if self._output_dir is None:
            self._output_dir = Path(tempfile.mkdtemp(prefix="vramd-output-"))
        return self._output_dir

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        log: LogRing,
    ) -> RuntimeProcess:
        if not argv:
            raise SpawnError("cannot start a runtime: the command is empty")
        # Compared with kernel start times, so real wall time; a second early because
        # psutil derives those from a boot time rounded to whole seconds.
        launched_at = time.time() - 1.0
        try:
            files = OutputFiles.create(self.output_dir, Path(argv[0]).name)
            stdout, stderr = files.open_for_runtime()
        except OSError as exc:
            raise SpawnError(f"cannot create the output files of {argv[0]!r}: {exc}") from exc
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            files.remove()
            raise SpawnError(_describe_spawn_error(argv[0], cwd, exc)) from exc
        finally:
            os.close(stdout)
            os.close(stderr)
        try:
            start_time = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            # Already exited and reaped. Any group member it left was created after
            # launched_at, so the reaper's "created at or after" test still finds them.
            start_time = launched_at
        follower = OutputFollower(files, log, self._clock.now)
        return SpawnedProcess(popen, start_time, follower)


def describe_exit(returncode: int, stderr_tail: str) -> str:
    """``exited with code 1: CUDA error: out of memory`` / ``killed by signal SIGSEGV``."""
    if returncode == EXIT_UNKNOWN:
        head = "exited (its status is known only to the vramd that started it)"
    elif returncode < 0:
        try:
            head = f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            head = f"killed by signal {-returncode}"
    else:
        head = f"exited with code {returncode}"
    return f"{head}: {stderr_tail}" if stderr_tail else head


def _describe_spawn_error(program: str, cwd: str | None, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError | NotADirectoryError) and cwd and exc.filename == cwd:
        return f"cannot start {program!r}: working directory {cwd!r} does not exist"
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {program!r}: command not found"
    if isinstance(exc, PermissionError):
        return f"cannot start {program!r}: permission denied"
    return f"cannot start {program!r}: {exc.strerror or exc}"


class ChildProcess:
    """A runtime vramd signals: pgid == pid (its own session)."""

    def __init__(self, *, pid: int, start_time: float, follower: OutputFollower | None) -> None:
        self._pid = pid
        self._start_time = start_time
        self._follower = follower
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = loop.create_future()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def pgid(self) -> int:
        return self._pid

    @property
    def proc_start_time(self) -> float:
        return self._start_time

    @property
    def output(self) -> OutputFiles | None:
        return self._follower.files if self._follower is not None else None

    @property
    def returncode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)

    def send_signal_group(self, sig: int) -> None:
        # After the leader is reaped the group id stays reserved while any member lives,
        # so signalling it then still reaches only our leftovers.
        if self.pgid <= 1:  # killpg(0 or 1) would hit the daemon's own group or init's
            raise ValueError(f"refusing to signal process group {self.pgid}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    async def close(self, timeout_s: float = 1.0) -> None:
        self._stop_watching()
        if self._follower is not None:
            self._follower.close(remove=self.exited.done())
            self._follower = None

    def detach(self) -> None:
        self._stop_watching()
        if self._follower is not None:
            self._follower.close(remove=False)
            self._follower = None

    def _exit_seen(self, code: int) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    def _stop_watching(self) -> None:
        """Stop watching for the exit (overridden where there is something to release)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pid={self._pid}>"


class SpawnedProcess(ChildProcess):
    """A runtime this daemon started: its child, so its exit status is known."""

    def __init__(
        self, popen: subprocess.Popen[bytes], start_time: float, follower: OutputFollower
    ) -> None:
        super().__init__(pid=popen.pid, start_time=start_time, follower=follower)
        self._popen = popen
        self._watch = ExitWatch(popen.pid, self._reap)

    def _reap(self) -> None:
        """The leader has exited: reap it (nobody else does) and say how it ended."""
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: its status is lost
            pid, status = self._pid, 255 << 8
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        self._popen.returncode = code  # so Popen never waits for it again
        self._watch.close()
        self._exit_seen(code)

    def _stop_watching(self) -> None:
        self._watch.close()


class AdoptedProcess(ChildProcess):
    """A runtime a previous daemon started, taken over by this one.

    It is not our child: its exit is seen on a pidfd (or by polling where there is
    none), and its exit status is ``EXIT_UNKNOWN``.
    """

    def __init__(self, *, pid: int, start_time: float, follower: OutputFollower | None) -> None:
        super().__init__(pid=pid, start_time=start_time, follower=follower)
        self._watch = ExitWatch(pid, lambda: self._gone(), child=False)

    def _gone(self) -> None:
        self._watch.close()
        self._exit_seen(EXIT_UNKNOWN)

    def _stop_watching(self) -> None:
        self._watch.close()


class PidfdWatch:
    """Calls ``on_exit`` on the loop once ``pid`` has exited: a pidfd becomes readable
    when the process exits, whoever its parent is (Linux 5.3+)."""

    def __init__(self, pid: int, on_exit: Callable[[], None], *, child: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd: int | None = None
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._loop.call_soon(on_exit)
            return
        self._loop.add_reader(self._fd, on_exit)

    def close(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None


class WaitWatch:
    """``PidfdWatch`` on kernels without pidfds (before Linux 5.3, some sandboxes): a
    child is waited for by a thread, any other process polled every ``POLL_EXIT_S``."""

    def __init__(self, pid: int, on_exit: Callable[[], None], *, child: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._pid = pid
        self._timer: asyncio.TimerHandle | None = None
        self._on_exit = on_exit
        if child:
            self._loop.run_in_executor(None, _wait_quietly, pid).add_done_callback(
                lambda _: self._loop.call_soon_threadsafe(on_exit)
            )
        else:
            self._timer = self._loop.call_later(POLL_EXIT_S, self._poll)

    def _poll(self) -> None:
        try:
            alive = psutil.Process(self._pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            alive = False
        if alive:
            self._timer = self._loop.call_later(POLL_EXIT_S, self._poll)
        else:
            self._on_exit()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# Chosen once for this kernel.
ExitWatch: type[PidfdWatch] | type[WaitWatch] = PidfdWatch if PIDFD else WaitWatch


POLL_EXIT_S = 0.5


def _wait_quietly(pid: int) -> None:
    """Block until child ``pid`` can be reaped, without reaping it (``_reap`` does)."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
