"""The memory-settle barrier: wait until a stopped runtime's memory is really free."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from service.clock import Clock


async def wait_settled(
    released: Callable[[], Awaitable[bool]],
    *,
    clock: Clock,
    timeout_s: float,
    interval_s: float = 0.1,
    first_interval_s: float = 0.005,
) -> bool:
    """Poll ``released()`` until it says True (return True) or ``timeout_s`` passes (False).

    ``released`` is asked at least once, even with a zero timeout. The first re-check
    comes after ``first_interval_s`` (at most ``interval_s``) and the wait doubles up to
    ``interval_s``: a stopped process is usually gone, and its memory listed free, within
    a few milliseconds of its reaping, and a swap should not wait a whole interval for
    that; a driver that takes seconds to let go is still asked only every ``interval_s``.

    A runtime's exit is not the moment its device memory comes back: the driver tears down the
    context after the process is gone, and an allocator may hand pages back later still.
    Starting the next runtime on the strength of the exit alone races it against that teardown
    and can fail with out-of-memory on a device that is about to have room. So the
    orchestrator starts a replacement only after the probe shows the memory released
    (docs/operations.md, "The settle barrier"), and gives up waiting after a timeout: the
    probe may never agree (a foreign process took the memory), and then the caller records an
    event and lets admission decide again with fresh numbers.
    """
    deadline = clock.monotonic() + timeout_s
    wait = min(first_interval_s, interval_s)
    while True:
        if await released():
            return True
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            return False
        await clock.sleep(min(wait, remaining))
        wait = min(wait * 2, interval_s)
