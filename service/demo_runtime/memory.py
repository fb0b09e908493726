"""Memory that really counts: anonymous pages written through, and helpers that hold more.

A host memory probe sees only pages that are resident, so ``touch_memory`` writes every
one of them. Multi-process runtimes hold memory in child processes too; ``spawn_workers``
forks such helpers (``--workers``), each holding its own share, so what vramd measures
for a service must count its whole process group.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

from service.units import MIB

_FILL = memoryview(b"\xa5" * MIB)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only


def touch_memory(size: int) -> mmap.mmap | None:
    """Map ``size`` bytes of anonymous memory and write all of it, so it counts in RSS."""
    if size <= 0:
        return None
    # MAP_POPULATE faults the pages in up front, several times faster than one fault per
    # page during the writes; the writes still matter, as zero pages may be deduplicated.
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
    for offset in range(0, size, MIB):
        block.write(_FILL[: size - offset])
    return block


@dataclass(frozen=True)
class Worker:
    pid: int
    ready_fd: int  # the worker writes one byte here once its memory is touched


def spawn_workers(count: int, size: int, *, ignore_sigterm: bool) -> list[Worker]:
    """Fork helpers that each hold ``size`` bytes for as long as this process lives.

    Called before any thread starts: forking a threaded process can copy a held lock.
    Helpers share the parent's stance on SIGTERM, as a real runtime's workers would.
    """
    workers = []
    parent = os.getpid()
    for _ in range(count):
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()  # or the child's exit could repeat buffered output
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _worker_main(parent, size, write_fd, ignore_sigterm)
        os.close(write_fd)
        workers.append(Worker(pid, read_fd))
    return workers


def _worker_main(parent: int, size: int, ready_fd: int, ignore_sigterm: bool) -> NoReturn:
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else signal.SIG_DFL)
        held = touch_memory(size)
        os.write(ready_fd, b"1")
        os.close(ready_fd)
        # Reparenting changes getppid: a SIGKILLed parent must not leave helpers behind.
        while os.getppid() == parent:
            time.sleep(0.1)
        del held
    except BaseException:
        code = 1
    finally:
        os._exit(code)  # never fall back into the parent's code path


def stop_workers(workers: list[Worker]) -> None:
    # SIGKILL: helpers hold nothing worth saving, and may be ignoring SIGTERM.
    for worker in workers:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(worker.pid, signal.SIGKILL)
            os.waitpid(worker.pid, 0)
