"""Operators waiting for an answer: the futures behind ``vramd load``/``unload``/``restart``.

The orchestrator hands the scheduler an event with a fresh ticket and awaits
``Tickets.wait``; the scheduler answers with a ``Resolve`` action once the outcome is
known (``scheduler.operators``), which the kernel's effects pass to ``answer``. Nothing
polls.
"""

from __future__ import annotations

import asyncio
import itertools

from service.errors import RequestRejected
from service.scheduler import Resolve


class Tickets:
    def __init__(self) -> None:
        self._open: dict[str, asyncio.Future[Resolve]] = {}
        self._numbers = itertools.count(1)

    def issue(self) -> str:
        ticket = f"op-{next(self._numbers)}"
        self._open[ticket] = asyncio.get_running_loop().create_future()
        return ticket

    async def wait(self, ticket: str, *, timeout_s: float) -> Resolve | None:
        """The answer, or None if none came within ``timeout_s``."""
        future = self._open[ticket]
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            return None
        finally:
            self._open.pop(ticket, None)

    def answer(self, resolve: Resolve) -> None:
        future = self._open.get(resolve.ticket)
        if future is not None and not future.done():
            future.set_result(resolve)


def raise_for(answer: Resolve) -> None:
    """An operator's answer as the API's error, if it is one."""
    code = answer.outcome.error
    if code is not None:
        raise RequestRejected.of(code, answer.message, retry_after=answer.retry_after)
