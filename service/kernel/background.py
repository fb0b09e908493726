"""Background tasks that an owner starts and must finish or cancel when it closes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("vramd.tasks")


@dataclass
class BackgroundTasks:
    """Background work the orchestrator started and must finish or cancel at close."""

    running: set[asyncio.Task[Any]] = field(default_factory=set)
    # Tasks that ended with an exception: the orchestrator's health reports them.
    failed: list[asyncio.Task[Any]] = field(default_factory=list)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.running.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.failed.append(task)
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def cancel_all(self) -> None:
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
