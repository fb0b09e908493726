"""A ``service.clock.Clock`` whose time moves only when a test says so.

    clock = FakeClock()
    task = asyncio.create_task(thing_that_sleeps(clock))
    await clock.advance(5)        # wakes every sleeper due by now+5, lets them run

``sleep`` parks the caller until ``advance`` moves monotonic time past its deadline;
``now()`` moves with it. Nothing here sleeps for real, so timeouts, TTLs and backoff are
tested in microseconds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class FakeClock:
    def __init__(self, *, wall: float = 1_700_000_000.0, monotonic: float = 1_000.0) -> None:
        self._wall_offset = wall - monotonic
        self._mono = monotonic
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._wall_offset + self._mono

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending (cancelled ones excluded)."""
        return sum(1 for _, _, future in self._sleepers if not future.done())

    def next_deadline(self) -> float | None:
        """Monotonic time of the earliest pending sleep, if any."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking sleepers in deadline order, and let woken code run.

        Ready tasks run first, so a task created just before this call starts its sleep
        at the old time. Time stops at each deadline on the way, so a sleeper that wakes
        and sleeps again within the interval is woken again too.
        """
        if seconds < 0:
            raise ValueError("time does not go backwards")
        await settle()  # tasks created just before get to start their sleeps first
        target = self._mono + seconds
        while True:
            self._drop_cancelled()
            if not self._sleepers or self._sleepers[0][0] > target:
                break
            deadline, _, future = heapq.heappop(self._sleepers)
            self._mono = max(self._mono, deadline)
            future.set_result(None)
            await settle()
        self._mono = target
        await settle()

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)


async def settle(rounds: int = 20) -> None:
    """Give every ready task a few turns of the event loop."""
    for _ in range(rounds):
        await asyncio.sleep(0)
