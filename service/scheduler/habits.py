"""What a service's traffic has shown: how long it stays idle, how long a request takes.

How it decides: docs/architecture.md, "How the scheduler decides".
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

# Bin edges of the idle-gap histogram, seconds; the last bin is open-ended.
EDGES: tuple[float, ...] = (
    0.0,
    1.0,
    2.0,
    4.0,
    8.0,
    15.0,
    30.0,
    45.0,
    60.0,
    90.0,
    120.0,
    180.0,
    300.0,
    450.0,
    600.0,
    900.0,
    1200.0,
    1800.0,
    2700.0,
    3600.0,
    7200.0,
)
# Each new gap multiplies the older ones by this: about the last 50 gaps count.
DECAY = 0.98
# Fewer (decayed) gaps than this: too little to judge by.
MIN_EVIDENCE = 3.0
# The prior: this many pseudo-gaps, log-uniform between 1 s and ``PRIOR_SPAN_S``.
PRIOR_WEIGHT = 1.0
PRIOR_SPAN_S = 4 * 3600.0
# Moving averages: the weight of the newest figure.
EWMA = 0.2
# Until a service has finished a request, its requests are assumed to take this long.
DEFAULT_SERVICE_S = 5.0


@dataclass(slots=True)
class Habits:
    counts: list[float] = field(default_factory=lambda: [0.0] * len(EDGES))
    mass: float = 0.0
    last_arrival: float | None = None
    mean_gap_s: float | None = None
    service_s: float | None = None

    # ------------------------------------------------------------------ learning

    def arrived(self, now: float, idle_since: float | None) -> None:
        """A request arrived at ``now``; ``idle_since``: when the service last went idle
        (its last request finished), or None if something is in flight or queued."""
        if self.last_arrival is not None:
            gap = max(0.0, now - self.last_arrival)
            self.mean_gap_s = gap if self.mean_gap_s is None else _ewma(self.mean_gap_s, gap)
        self.last_arrival = now
        if idle_since is None:
            return
        idle = max(0.0, now - idle_since)
        self.counts = [c * DECAY for c in self.counts]
        self.counts[bisect.bisect_right(EDGES, idle) - 1] += 1.0
        self.mass = self.mass * DECAY + 1.0

    def finished(self, seconds: float) -> None:
        """A granted request took ``seconds`` from grant to its end."""
        seconds = max(0.0, seconds)
        self.service_s = seconds if self.service_s is None else _ewma(self.service_s, seconds)

    # ------------------------------------------------------------------ estimates

    @property
    def expected_service_s(self) -> float:
        return DEFAULT_SERVICE_S if self.service_s is None else self.service_s

    @property
    def rate(self) -> float:
        """Requests per second lately (0 until two have arrived)."""
        gap = self.mean_gap_s
        return 0.0 if gap is None else 1.0 / max(gap, 0.1)

    def p_asked_within(self, idle_for: float, horizon: float) -> float:
        """The chance that a request arrives within ``horizon`` seconds, given the
        service has been idle for ``idle_for`` seconds (0..1)."""
        if horizon <= 0:
            return 0.0
        if math.isinf(horizon) or self.mass < MIN_EVIDENCE:
            return 1.0
        idle_for = max(0.0, idle_for)
        beyond = self._survival(idle_for)
        inside = beyond - self._survival(idle_for + horizon)
        prior = _prior_within(idle_for, horizon)
        return (inside + PRIOR_WEIGHT * prior) / (beyond + PRIOR_WEIGHT)

    def _survival(self, x: float) -> float:
        """Mass of the gaps longer than ``x`` (linear within a bin)."""
        i = bisect.bisect_right(EDGES, x) - 1
        above = sum(self.counts[i + 1 :])
        if i == len(EDGES) - 1:
            return above + self.counts[i]  # the open bin: every gap in it counts as longer
        lo, hi = EDGES[i], EDGES[i + 1]
        return above + self.counts[i] * (hi - x) / (hi - lo)


def _prior_within(idle_for: float, horizon: float) -> float:
    """The log-uniform prior's conditional chance of a gap in (idle_for, +horizon]."""
    start = idle_for + 1.0
    end = PRIOR_SPAN_S + 1.0
    if start >= end:
        return 1.0
    return min(1.0, math.log((start + horizon) / start) / math.log(end / start))


def _ewma(old: float, new: float) -> float:
    return (1 - EWMA) * old + EWMA * new
