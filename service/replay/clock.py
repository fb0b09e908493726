"""The virtual clock: a heap of callbacks keyed by (time, insertion order).

Nothing sleeps. ``run`` pops the earliest callback, sets ``now`` to its time and calls
it; callbacks schedule more. Two callbacks at the same time run in the order they were
scheduled, so a run is a pure function of its inputs.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at virtual time ``t`` (never before ``now``)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run(self, until: float | None = None) -> None:
        """Run callbacks in time order until none are left (or the next is past ``until``)."""
        heap = self._heap
        while heap:
            if until is not None and heap[0][0] > until:
                return
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)

    def __len__(self) -> int:
        return len(self._heap)
