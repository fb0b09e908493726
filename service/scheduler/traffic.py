"""The recent traffic, as ``yielding: auto`` replays it (``service.replay.tuner``).

The pump records every request that reaches the scheduler: when it arrived, at which
service, and how long it was in service once granted (None until it finishes, and for
a request that never ran); and the devices' sizes from the last memory sample. The
daemon and the simulator record through the same pump, so the tuner replays the same
traffic in both.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# What the tuner may ask for: the last hour, and no more than this many requests.
KEEP_S = 3600.0
MAX_KEPT = 20_000


@dataclass(slots=True)
class Arrival:
    t: float
    service: str
    granted_at: float | None = None
    duration_s: float | None = None  # grant to finish, once finished


class Traffic:
    def __init__(self, keep_s: float = KEEP_S, max_kept: int = MAX_KEPT) -> None:
        self.keep_s = keep_s
        self._kept: deque[Arrival] = deque(maxlen=max_kept)
        self._open: dict[str, Arrival] = {}
        self.device_totals: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self._kept)

    def arrived(self, request_id: str, service: str, now: float) -> None:
        while self._kept and self._kept[0].t < now - self.keep_s:
            self._kept.popleft()
        arrival = Arrival(now, service)
        self._kept.append(arrival)
        self._open[request_id] = arrival

    def granted(self, request_id: str, now: float) -> None:
        arrival = self._open.get(request_id)
        if arrival is not None:
            arrival.granted_at = now

    def ended(self, request_id: str, now: float) -> None:
        """The request finished (in service since its grant) or went away unserved."""
        arrival = self._open.pop(request_id, None)
        if arrival is not None and arrival.granted_at is not None:
            arrival.duration_s = max(0.0, now - arrival.granted_at)

    def since(self, start: float) -> list[Arrival]:
        """The arrivals at or after ``start``, oldest first (copies: the log moves on)."""
        return [
            Arrival(a.t, a.service, a.granted_at, a.duration_s) for a in self._kept if a.t >= start
        ]
