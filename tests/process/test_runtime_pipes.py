"""A runtime's output (files now, pipes once) on the daemon's own loop (uvloop), through
the real launcher (``service.supervisor.process``): every line captured, every descriptor closed.

Why the launcher reads the pipes itself: uvloop's pipe transports close a pipe's
descriptor twice (libuv closes it, then the transport closes the file object), so a file
another thread opens in that instant under the same number is closed under it -- the
sampler's /proc reads failed with EBADF and its task died (a ``make test`` run on
2026-12-02). That window is microseconds wide and rarely hit on purpose; this test runs
the launcher's own reader with such a thread beside it and proves what the reader must
do: read every line of both pipes to the end and leave no pipe or pidfd open.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import uvloop

from service.supervisor import LogRing, SubprocessLauncher

PRINTS = "import sys; print('out', sys.argv[1]); print('err', sys.argv[1], file=sys.stderr)"


def open_pipes() -> set[int]:
    """This process's open pipes and pidfds (the other thread's /proc reads come and go)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if (
            target.startswith("pipe:")
            or "pidfd" in target
            or "inotify" in target
            or ("vramd-output" in target)
        ):
            found.add(int(name))
    return found


def test_runtime_output_is_read_whole_and_every_descriptor_closed_beside_a_thread() -> None:
    failed_closes: list[OSError] = []
    done = threading.Event()

    def open_and_close() -> None:  # as the sampler does, in a thread of its own
        while not done.is_set():
            fd = os.open("/proc/self/statm", os.O_RDONLY)
            try:
                os.read(fd, 64)
            finally:
                try:
                    os.close(fd)
                except OSError as exc:
                    failed_closes.append(exc)

    async def spawn_many() -> tuple[list[list[str]], set[int]]:
        launcher = SubprocessLauncher()
        lines = []
        before = open_pipes()
        for i in range(40):
            ring = LogRing()
            child = await launcher.spawn(
                [sys.executable, "-c", PRINTS, str(i)], env=dict(os.environ), cwd=None, log=ring
            )
            assert await child.wait() == 0
            await child.close()
            lines.append(sorted(line.text for line in ring.tail(10)))
        return lines, open_pipes() - before

    reader = threading.Thread(target=open_and_close)
    reader.start()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            captured, left = runner.run(spawn_many())
    finally:
        done.set()
        reader.join()
    assert captured == [sorted([f"out {i}", f"err {i}"]) for i in range(40)]
    assert failed_closes == []
    assert not left  # nothing of the runtimes' pipes (and pidfds) left open
