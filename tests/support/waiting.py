"""Waiting for a condition, the one way tests wait (docs/architecture.md, "The tests").

``wait_until`` polls a predicate (plain or awaitable) on the event loop; the blocking
form serves threads and synchronous tests. Both fail with what they waited for, and
never pass on time alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_until_blocking(
    predicate: Callable[[], bool],
    *,
    timeout: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
    detail: Callable[[], str] | None = None,
) -> None:
    """``wait_until`` for a thread: ``detail`` (a log, say) is added to the failure."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(interval)
