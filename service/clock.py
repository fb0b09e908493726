"""Time as a dependency: the daemon gets ``SystemClock``, tests get a fake one.

Code that needs the time or a pause takes a ``Clock`` in its constructor and never calls
``time`` or ``asyncio.sleep`` itself, so timeouts, TTLs and backoff can be tested without
sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch (for records and cron)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes backwards (for intervals)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def time_of_day(clock: Clock) -> Callable[[float], str]:
    """Turns ``clock.monotonic()`` seconds into the local time of day ("12:03:10"), for
    messages that say when something will happen ("yields by 12:03:10")."""
    offset = clock.now() - clock.monotonic()
    return lambda t: datetime.fromtimestamp(t + offset).strftime("%H:%M:%S")
