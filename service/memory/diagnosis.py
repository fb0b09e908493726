"""Diagnosis from memory samples: creep, fragmentation versus capacity, over-cap streaks.

Pure functions over values: no I/O, no clock reads, no logging (what they decide is in
docs/operations.md, "Flags" and "Fragmentation versus capacity"). The sampler and the
supervisor feed them samples and log lines and turn verdicts into flags.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from service.domain import Flag
from service.units import format_duration, format_size

OomKind = Literal["fragmented", "capacity"]

# Above this many points Theil-Sen uses an evenly spaced subset, so a caller that passes
# a day of samples costs ~20k slopes rather than millions.
THEIL_SEN_MAX_POINTS = 200

# A new high must clear the earlier high by this many standard deviations of the
# sample-to-sample jitter: at 2, jitter around a plateau reached late in the window almost
# never passes, while a leak of 1MiB per request under +-5MB of noise still does.
NEW_HIGH_JITTERS = 2.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One footprint sample of one instance (device or host memory)."""

    t: float  # seconds, any origin shared with ``ready_at``
    bytes: int
    # Requests served so far by this instance. It serves none before it is ready, so this
    # is also the count since ready.
    requests: int


@dataclass(frozen=True, slots=True)
class CreepConfig:
    """Why these rules:

    - **Creep is judged per request, with Theil-Sen.** A leak or an unbounded cache grows
      with work done, not with time, so the slope is bytes against requests served. Theil-Sen
      (the median of all pairwise slopes) shrugs off up to ~29% wild samples: a transient
      spike from one huge request, or a probe glitch, moves a least-squares slope a lot and
      the median of slopes hardly at all.
    - **Creep needs new highs.** A slope over a window that still holds the end of a warm-up,
      or a leak that has stopped, stays positive for a while after the growth is over. What
      tells "still growing" from "grew and stopped" is whether the last part of the window
      reaches above every earlier sample since ready (not only the earlier part of the
      window: a garbage-collected sawtooth whose period is longer than the window never
      climbs above its own earlier peaks). A warm-up plateau, a leak that stopped and a
      sawtooth (rises, then drops back) all fail that test; a leak that stopped is flagged
      until its last rise leaves the recent part of the window, then no longer. Two recent
      samples must clear the earlier high (one is a sawtooth's peak or one big request's
      spike), by more than twice the sample-to-sample jitter (estimated from successive
      differences, so a steady rise or one step does not inflate it): noise around a plateau
      reached late in the window is not a new high.
    - **Creep is only judged after warm-up.** Samples from before the instance served
      ``min_requests`` requests and was ``min_age_s`` old never enter the window: loading
      caches, compiling kernels and sizing pools is expected growth, not a leak. Nor is it
      judged on fewer than ``min_samples`` post-warm-up samples: over a handful of samples
      the pairwise slopes are mostly jitter. A warm-up that is still rising after that gate,
      or a sawtooth whose first rise outlasts it, looks like a leak until it flattens; the
      gate is the knob for runtimes that warm up slowly.
    - **Free memory above recent growth means fragmentation.** If the runtime says out of
      memory while its device has more free than the instance grew in the last minute (and
      more than the failing request needed, when known), the device as a whole had room for
      the allocation; the allocator could not place it (fragmentation, or memory parked in
      another pool). A clean restart cures that; more memory would not. Otherwise it is a
      capacity shortage.
    - **Over-cap needs a streak.** One sample above ``memory.cap`` can be a probe caught
      mid-allocation; ``needed`` consecutive samples (3 in the design) cannot.
    """

    min_requests: int = 20  # warm-up: at least this many requests served...
    min_age_s: float = 60.0  # ...and this long since ready
    window: int = 120  # the most recent post-warm-up samples considered
    min_slope_bytes_per_request: float = 256 * 1024  # Theil-Sen slope must exceed this
    min_growth_bytes: int = 32 * 1024**2  # first-to-last rise over the window must exceed this
    new_high_fraction: float = 0.2  # the last 20% of the window must reach a new high
    min_samples: int = 30  # fewer post-warm-up samples than this: not judged yet


@dataclass(frozen=True, slots=True)
class CreepVerdict:
    creeping: bool
    slope_bytes_per_request: float | None
    growth_bytes: int
    reason: str  # a sentence with figures, for the event log

    @property
    def flag(self) -> Flag | None:
        return Flag.CREEPING if self.creeping else None


def theil_sen_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Median of the slopes between every pair of points with distinct x.

    ``None`` when fewer than two distinct x values exist. Above ``THEIL_SEN_MAX_POINTS``
    points an evenly spaced subset (always keeping the first and last) is used.
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} vs {len(ys)})")
    picked = _spread(len(xs), THEIL_SEN_MAX_POINTS)
    px = [float(xs[i]) for i in picked]
    py = [float(ys[i]) for i in picked]
    slopes = [
        (py[j] - py[i]) / (px[j] - px[i])
        for i in range(len(px))
        for j in range(i + 1, len(px))
        if px[j] != px[i]
    ]
    return statistics.median(slopes) if slopes else None


def _spread(n: int, most: int) -> list[int]:
    if n <= most:
        return list(range(n))
    return sorted({round(k * (n - 1) / (most - 1)) for k in range(most)})


def detect_creep(
    samples: Sequence[Sample], *, ready_at: float, config: CreepConfig = CreepConfig()
) -> CreepVerdict:
    """Is this instance's footprint still rising with requests served, after warm-up?

    The latest sample's ``t`` is "now". Creeping needs all three: a Theil-Sen slope of
    bytes per request above ``min_slope_bytes_per_request``, a first-to-last rise over
    the window above ``min_growth_bytes``, and a new high in the last
    ``new_high_fraction`` of the window.
    """
    series = sorted((s for s in samples if s.t >= ready_at), key=lambda s: s.t)
    window = _judged_window(series, ready_at, config)
    if isinstance(window, str):
        return CreepVerdict(False, None, 0, window)
    xs = [s.requests for s in window]
    ys = [s.bytes for s in window]
    growth = ys[-1] - ys[0]
    slope = theil_sen_slope(xs, ys)
    if slope is None:
        return CreepVerdict(
            False,
            None,
            growth,
            f"no requests served in the last {len(window)} samples; creep is judged per request",
        )

    served = xs[-1] - xs[0]
    split = max(1, min(len(window) - 1, round(len(window) * config.new_high_fraction)))
    # The second-highest recent sample: one sample on top (a GC sawtooth's peak, a spike
    # from one big request) is not "making new highs".
    recent_high = sorted(ys[-split:])[-min(2, split)]
    # Everything before the recent part, warm-up included: a sawtooth whose period is
    # longer than the window never climbs above its own earlier peaks.
    earlier_high = max(s.bytes for s in series[: len(series) - split])
    new_high = recent_high - earlier_high > NEW_HIGH_JITTERS * _jitter(ys)
    steep = slope > config.min_slope_bytes_per_request
    grew = growth > config.min_growth_bytes

    rate = f"{format_size(slope)} per request, Theil-Sen"
    if steep and grew and new_high:
        return CreepVerdict(
            True,
            slope,
            growth,
            f"footprint rose {format_size(growth)} over the last {served} requests ({rate}) "
            f"and is still making new highs (peak {format_size(recent_high)})",
        )
    level = format_size(statistics.median(ys[-split:]))
    if not new_high:
        why = (
            f"plateaued at {level} after warm-up: no new high in the last {split} samples "
            f"(peak {format_size(max(ys))}; {rate} over the last {served} requests)"
        )
    elif not steep:
        why = (
            f"flat at {level}: {rate} over the last {served} requests, "
            f"under the {format_size(config.min_slope_bytes_per_request)} threshold"
        )
    else:
        why = (
            f"footprint rose only {format_size(growth)} over the last {served} requests "
            f"({rate}), under the {format_size(config.min_growth_bytes)} threshold"
        )
    return CreepVerdict(False, slope, growth, why)


def _judged_window(
    series: Sequence[Sample], ready_at: float, config: CreepConfig
) -> list[Sample] | str:
    """The samples after warm-up that creep is judged on, or why there are none yet."""
    if not series:
        return "warming up: no samples since ready"
    last = series[-1]
    age = last.t - ready_at
    if last.requests < config.min_requests or age < config.min_age_s:
        return (
            f"warming up: {last.requests} of {config.min_requests} requests, "
            f"{format_duration(age)} of {format_duration(config.min_age_s)} since ready"
        )
    start = next(
        i
        for i, s in enumerate(series)
        if s.requests >= config.min_requests and s.t - ready_at >= config.min_age_s
    )
    window = list(series[start:][-config.window :])
    enough = min(config.min_samples, config.window)
    if len(window) < enough:
        return f"too few samples after warm-up to judge: {len(window)} of {enough}"
    return window


def _jitter(ys: Sequence[int]) -> float:
    """Standard deviation of sample-to-sample noise, from the median absolute deviation
    of successive differences: a steady rise, one step or a slow curve hardly moves it."""
    steps = [b - a for a, b in itertools.pairwise(ys)]
    typical = statistics.median(steps)
    return 1.4826 * statistics.median(abs(d - typical) for d in steps) / math.sqrt(2)


# --- out of memory ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OomReport:
    """The runtime said out-of-memory: a log line or an error body, and when."""

    t: float
    text: str


@dataclass(frozen=True, slots=True)
class DeviceFree:
    free_bytes: int


@dataclass(frozen=True, slots=True)
class OomDiagnosis:
    kind: OomKind
    reason: str

    @property
    def flag(self) -> Flag | None:
        return Flag.FRAGMENTED if self.kind == "fragmented" else None


def recent_growth(
    samples: Sequence[Sample], *, horizon_s: float = 60.0, now: float | None = None
) -> int:
    """Max minus min footprint over the ``horizon_s`` seconds up to ``now``.

    ``now`` defaults to the latest sample's time; 0 when no sample falls in the horizon.
    """
    if not samples:
        return 0
    end = max(s.t for s in samples) if now is None else now
    inside = [s.bytes for s in samples if end - horizon_s <= s.t <= end]
    return max(inside) - min(inside) if inside else 0


def classify_oom(
    *, device_free: int, recent_growth_bytes: int, request_need_bytes: int | None = None
) -> OomKind:
    """``fragmented`` when the device had more free than the instance's recent growth
    (and than the request needed, when known); otherwise ``capacity``.

    Strictly more: free memory only equal to what was needed is a capacity shortage.
    """
    room = device_free > recent_growth_bytes and (
        request_need_bytes is None or device_free > request_need_bytes
    )
    return "fragmented" if room else "capacity"


def diagnose_oom(
    report: OomReport,
    *,
    device: DeviceFree,
    samples: Sequence[Sample],
    request_need_bytes: int | None = None,
    horizon_s: float = 60.0,
) -> OomDiagnosis:
    """Classify one reported out-of-memory, with a sentence for the incident record."""
    growth = recent_growth(samples, horizon_s=horizon_s, now=report.t)
    kind = classify_oom(
        device_free=device.free_bytes,
        recent_growth_bytes=growth,
        request_need_bytes=request_need_bytes,
    )
    need = ""
    if request_need_bytes is not None:
        need = f", request needed {format_size(request_need_bytes)}"
    figures = (
        f"device had {format_size(device.free_bytes)} free, instance grew "
        f"{format_size(growth)} in the last {format_duration(horizon_s)}{need}"
    )
    if kind == "fragmented":
        reason = (
            f"out of memory although the device had room ({figures}): fragmentation or an "
            "allocator pool; a clean restart should cure it"
        )
    else:
        reason = f"out of memory for lack of capacity ({figures})"
    return OomDiagnosis(kind, reason)


# --- over-cap -----------------------------------------------------------------------------


@dataclass(slots=True)
class CapWatch:
    """Counts consecutive samples above ``memory.cap`` for one instance."""

    cap: int | None
    needed: int = 3
    streak: int = field(default=0, init=False)

    def observe(self, footprint: int) -> bool:
        """True exactly once per streak: on the sample that makes it ``needed`` long."""
        if self.cap is None or footprint <= self.cap:
            self.streak = 0
            return False
        self.streak += 1
        return self.streak == self.needed
