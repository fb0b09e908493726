"""A ``ProcessLauncher`` whose processes exist only in the test: no fork, no sleep.

    launcher = FakeLauncher()
    # ... an Instance spawns through it ...
    launcher.spawned[0].exit(139)      # the "process" crashes now

Processes exit when the test says so, or on a signal they do not ignore.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from service.supervisor import LogRing, RuntimeProcess, SpawnError


class FakeProcess:
    """A process that exits when the test says so, or on a signal it does not ignore."""

    def __init__(self, pid: int, *, ignore_sigterm: bool = False, unkillable: bool = False) -> None:
        self.pid = self.pgid = pid
        self.proc_start_time = 1_700_000_000.0
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.closed = False
        self._ignore_sigterm = ignore_sigterm
        self._unkillable = unkillable  # stuck in the kernel: not even SIGKILL ends it
        self._exited = asyncio.get_running_loop().create_future()

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set_result(None)

    async def wait(self) -> int:
        await asyncio.shield(self._exited)
        assert self.returncode is not None
        return self.returncode

    def send_signal_group(self, sig: int) -> None:
        self.signals.append(sig)
        if self._unkillable:
            return
        if sig == signal.SIGKILL or (sig == signal.SIGTERM and not self._ignore_sigterm):
            self.exit(-sig)

    async def close(self, timeout_s: float = 1.0) -> None:
        self.closed = True


@dataclass
class FakeLauncher:
    ring_lines: list[str] = field(default_factory=list)  # stderr printed by each spawn
    ignore_sigterm: bool = False
    unkillable: bool = False
    missing: bool = False
    spawned: list[FakeProcess] = field(default_factory=list)

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, log: LogRing
    ) -> RuntimeProcess:
        if self.missing:
            raise SpawnError(f"cannot start {argv[0]!r}: command not found")
        for text in self.ring_lines:
            log.append("stderr", text, ts=0.0)
        proc = FakeProcess(
            1000 + len(self.spawned),
            ignore_sigterm=self.ignore_sigterm,
            unkillable=self.unkillable,
        )
        self.spawned.append(proc)
        return proc
