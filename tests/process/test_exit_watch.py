"""A runtime's exit is seen on every kernel: by a pidfd where there are pidfds (Linux
5.3+), else by a waiting thread (our child) or a poll (an adopted process)."""

import asyncio
import subprocess
import sys

import pytest

from service.supervisor.process import PIDFD, ExitWatch, PidfdWatch, WaitWatch

WATCHES = [
    pytest.param(PidfdWatch, marks=pytest.mark.skipif(not PIDFD, reason="no pidfds here")),
    WaitWatch,
]


async def exit_seen(watch: type[PidfdWatch] | type[WaitWatch], *, child: bool) -> bool:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    seen = asyncio.Event()
    watcher = watch(proc.pid, seen.set, child=child)
    try:
        assert not seen.is_set()
        await asyncio.wait_for(seen.wait(), timeout=10)
        return proc.poll() is not None or proc.wait(5) is not None
    finally:
        watcher.close()
        proc.wait(5)


@pytest.mark.parametrize("watch", WATCHES)
async def test_the_exit_of_a_child_is_seen(watch: type[PidfdWatch] | type[WaitWatch]) -> None:
    assert await exit_seen(watch, child=True)


@pytest.mark.parametrize("watch", WATCHES)
async def test_the_exit_of_a_process_we_only_adopted_is_seen(
    watch: type[PidfdWatch] | type[WaitWatch],
) -> None:
    assert await exit_seen(watch, child=False)


def test_the_watch_is_chosen_once_for_this_kernel() -> None:
    assert ExitWatch is (PidfdWatch if PIDFD else WaitWatch)
