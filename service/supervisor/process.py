"""Starting a runtime as a child process group, and the one object that signals it.

Every runtime runs in a session (and so a process group) of its own, created by
``start_new_session=True``. Runtimes fork: llama.cpp's RPC workers, vLLM's engine core
and tokenizer processes, Python launchers that exec a worker. Signalling only the pid we
started would orphan those children, and they keep holding device memory. Signalling the
group (``os.killpg``) reaches all of them, and the group id doubles as the handle the
startup reaper (``reaper.py``) uses for whatever a crashed daemon left behind. A new
session also detaches the runtime from the daemon's terminal, so a Ctrl-C meant for
``vramd serve`` does not kill runtimes behind the supervisor's back.

The launcher does not use the stream wrapper ``asyncio.create_subprocess_exec``: that
wrapper's ``Process.wait()`` only returns once every pipe is closed, so a grandchild that
inherited stdout would hide the runtime's exit (and a crash) for as long as it lives.
Here the exit is seen when the leader exits, output arrives through callbacks (no reader
tasks to leak, no 64 KiB ``readline`` limit), and the pipes are closed explicitly. Where
the kernel has pidfds (Linux 5.3+) the runtime is started with ``subprocess.Popen``
(vfork, not a fork of the whole daemon), its exit watched on a pidfd and its pipes read
on the loop (``PidfdChild``); elsewhere ``loop.subprocess_exec`` with a protocol of our
own does the same (``TransportChild``).

Commands are argv lists and never go through a shell (docs/operations.md, "Security
defaults").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol, cast

import psutil

from service.clock import Clock, SystemClock
from service.errors import VramdError
from service.supervisor.logs import LineSplitter, LogRing, Stream


def _pidfds_work() -> bool:
    """Whether this kernel has ``pidfd_open`` (Linux 5.3+), the fast way to watch a child."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


PIDFD = _pidfds_work()


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

    async def close(self, timeout_s: float = 1.0) -> None:
        """Let output still in flight reach the log (up to ``timeout_s``), then release it."""
        ...


class ProcessLauncher(Protocol):
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
    """The real launcher; the clock stamps the log lines."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()

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
        loop = asyncio.get_running_loop()
        # Compared with kernel start times, so real wall time; a second early because
        # psutil derives those from a boot time rounded to whole seconds.
        launched_at = time.time() - 1.0
        options: dict[str, Any] = {
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.PIPE,
            "stderr": subprocess.PIPE,
            "env": dict(env),
            "cwd": cwd,
            "start_new_session": True,
        }
        try:
            if PIDFD:
                # Popen forks with vfork; uvloop's subprocess_exec forks the whole daemon
                # (20 ms and more of page tables, on the path of every cold start).
                popen = subprocess.Popen(list(argv), **options)
            else:
                transport, protocol = await loop.subprocess_exec(
                    lambda: _ChildProtocol(log, self._clock, loop), *argv, **options
                )
        except OSError as exc:
            raise SpawnError(_describe_spawn_error(argv[0], cwd, exc)) from exc
        pid = popen.pid if PIDFD else transport.get_pid()
        try:
            start_time = psutil.Process(pid).create_time()
        except psutil.Error:
            # Already exited and reaped. Any group member it left was created after
            # launched_at, so the reaper's "created at or after" test still finds them.
            start_time = launched_at
        if PIDFD:
            return await PidfdChild.watch(popen, log, self._clock, start_time)
        return TransportChild(transport, protocol, pid=pid, start_time=start_time)


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


def _describe_spawn_error(program: str, cwd: str | None, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError | NotADirectoryError) and cwd and exc.filename == cwd:
        return f"cannot start {program!r}: working directory {cwd!r} does not exist"
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {program!r}: command not found"
    if isinstance(exc, PermissionError):
        return f"cannot start {program!r}: permission denied"
    return f"cannot start {program!r}: {exc.strerror or exc}"


class ChildProcess:
    """A runtime started by ``SubprocessLauncher``; pgid == pid (its own session)."""

    def __init__(self, *, pid: int, start_time: float) -> None:
        self._pid = pid
        self._start_time = start_time

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def pgid(self) -> int:
        return self._pid

    @property
    def proc_start_time(self) -> float:
        return self._start_time

    def send_signal_group(self, sig: int) -> None:
        # After the leader is reaped the group id stays reserved while any member lives,
        # so signalling it then still reaches only our leftovers.
        if self.pgid <= 1:  # killpg(0 or 1) would hit the daemon's own group or init's
            raise ValueError(f"refusing to signal process group {self.pgid}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pid={self._pid}>"


class TransportChild(ChildProcess):
    """Started by the loop's ``subprocess_exec`` (where pidfds are not available)."""

    def __init__(
        self,
        transport: asyncio.SubprocessTransport,
        protocol: _ChildProtocol,
        *,
        pid: int,
        start_time: float,
    ) -> None:
        super().__init__(pid=pid, start_time=start_time)
        self._transport = transport
        self._protocol = protocol

    @property
    def returncode(self) -> int | None:
        return self._transport.get_returncode()

    async def wait(self) -> int:
        await asyncio.shield(self._protocol.exited)
        code = self._transport.get_returncode()
        assert code is not None
        return code

    async def close(self, timeout_s: float = 1.0) -> None:
        await _drain(self._protocol.finished, timeout_s)
        self._protocol.flush()
        self._transport.close()


class PidfdChild(ChildProcess):
    """Started by ``subprocess.Popen``; its exit is seen on a pidfd, its output on pipes
    the loop reads (Linux 5.3 and later)."""

    def __init__(self, popen: subprocess.Popen[bytes], pidfd: int, start_time: float) -> None:
        super().__init__(pid=popen.pid, start_time=start_time)
        self._popen = popen
        self._pidfd: int | None = pidfd
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = loop.create_future()
        self._pipes: list[_PipeReader] = []
        loop.add_reader(pidfd, self._reap)

    @classmethod
    async def watch(
        cls, popen: subprocess.Popen[bytes], log: LogRing, clock: Clock, start_time: float
    ) -> PidfdChild:
        child = cls(popen, os.pidfd_open(popen.pid), start_time)
        loop = asyncio.get_running_loop()
        pipes: tuple[tuple[Stream, IO[bytes] | None], ...] = (
            ("stdout", popen.stdout),
            ("stderr", popen.stderr),
        )
        for stream, pipe in pipes:
            assert pipe is not None  # Popen was asked for both pipes
            child._pipes.append(_PipeReader(pipe, LineSplitter(stream, log, clock.now), loop))
        return child

    def _reap(self) -> None:
        """The pidfd is readable: the leader has exited; reap it (nobody else does)."""
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: its status is lost
            pid, status = self._pid, 255 << 8
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        self._popen.returncode = code  # so Popen never waits for it again
        self._forget_pidfd()
        if not self.exited.done():
            self.exited.set_result(code)

    def _forget_pidfd(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)

    async def close(self, timeout_s: float = 1.0) -> None:
        for reader in self._pipes:
            await _drain(reader.finished, timeout_s)
            reader.close()
        if self._pidfd is not None and self.exited.done():
            self._forget_pidfd()


async def _drain(finished: asyncio.Future[None], timeout_s: float) -> None:
    """Wait (up to ``timeout_s``) for output still in flight: a member that left the
    group (its own setsid) may hold the pipes forever."""
    if not finished.done():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(finished), timeout_s)


class _PipeReader:
    """One of a ``PidfdChild``'s pipes, read on the loop: its bytes become log lines.

    It owns its descriptor and closes it exactly once. Not ``loop.connect_read_pipe``:
    uvloop's pipe transport closes a file object's descriptor twice (libuv closes it,
    then the transport closes the file object), and a file another thread opened in
    between under the same number -- the sampler's /proc reads, the store's database --
    is closed under it.
    """

    def __init__(self, pipe: IO[bytes], splitter: LineSplitter, loop: asyncio.AbstractEventLoop):
        self._fd: int | None = os.dup(pipe.fileno())  # ours alone; the copy is closed now
        pipe.close()
        os.set_blocking(self._fd, False)
        self._splitter = splitter
        self._loop = loop
        self.finished: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._splitter.feed(data)
        else:
            self.close()  # end of file: every writer has exited

    def close(self) -> None:
        """Stop reading, close the descriptor and flush a last unterminated line."""
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        self._splitter.flush()
        if not self.finished.done():
            self.finished.set_result(None)


class _ChildProtocol(asyncio.SubprocessProtocol):
    """Turns pipe data into log lines and the child's exit into futures."""

    def __init__(self, log: LogRing, clock: Clock, loop: asyncio.AbstractEventLoop) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self._transport: asyncio.SubprocessTransport | None = None
        self._splitters = {
            1: LineSplitter("stdout", log, clock.now),
            2: LineSplitter("stderr", log, clock.now),
        }

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transport (uvicorn runs on uvloop) implements the SubprocessTransport
        # interface without subclassing it, so no isinstance check here.
        self._transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        splitter = self._splitters.get(fd)
        if splitter is not None:
            splitter.feed(data.encode() if isinstance(data, str) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        splitter = self._splitters.get(fd)
        if splitter is not None:
            splitter.flush()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        # Exited and every pipe closed: release the transport now, as asyncio's own
        # stream protocol does, so nothing waits for the garbage collector.
        if not self.exited.done():
            self.exited.set_result(None)
        if not self.finished.done():
            self.finished.set_result(None)
        if self._transport is not None:
            self._transport.close()

    def flush(self) -> None:
        for splitter in self._splitters.values():
            splitter.flush()
