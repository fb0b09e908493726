"""The statistics every benchmark report uses, each with one meaning.

- ``percentile(values, pct)``: linear interpolation between the two closest ranks (numpy's
  default); the simulator's figures use the same function, so a "p99" means one thing in
  every report and in ``GET /api/scheduler``'s figures.
- ``median``: ``percentile(values, 50)``, or None for no values.
- ``median_of(rows, key)``: the median of ``row[key]`` over the rows that carry it.
- ``mean``: the arithmetic mean, or None for no values.
- ``spread``: the median absolute deviation, how far a run strays from the median.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from service.replay.metrics import percentile

__all__ = ["mean", "median", "median_of", "percentile", "spread"]


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50) if values else None


def median_of(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    return median([float(row[key]) for row in rows if row.get(key) is not None])


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def spread(values: Sequence[float]) -> float:
    """The median absolute deviation; 0 for no values."""
    mid = median(values)
    if mid is None:
        return 0.0
    return percentile([abs(v - mid) for v in values], 50)
