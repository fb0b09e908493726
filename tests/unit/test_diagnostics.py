"""Diagnosis from samples (docs/operations.md): creep, OOM classification, over-cap streaks.

Every series here is synthetic and seeded: one sample a second from ``t = 0`` (the
instance became ready at 0), ``per_s`` requests a second, a footprint shape in bytes as
a function of requests served, and uniform jitter on top.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from service.domain import Flag
from service.memory.diagnosis import (
    CapWatch,
    CreepConfig,
    DeviceFree,
    OomReport,
    Sample,
    classify_oom,
    detect_creep,
    diagnose_oom,
    recent_growth,
    theil_sen_slope,
)

KiB, MiB, GiB = 1024, 1024**2, 1024**3

Shape = Callable[[int], float]


def series(
    shape: Shape,
    *,
    seconds: int = 400,
    per_s: float = 1.0,
    jitter: float = 5 * MiB,
    seed: int = 0,
    base: int = GiB,
) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for t in range(seconds):
        served = int(per_s * (t + 1))
        noise = rng.uniform(-jitter, jitter) if jitter else 0.0
        out.append(Sample(float(t), int(base + shape(served) + noise), served))
    return out


def flagged_at(samples: Sequence[Sample], *, start: int = 60, step: int = 5) -> list[int]:
    """The prefix lengths at which the detector, run as the sampler would, says creeping."""
    return [
        k
        for k in range(start, len(samples) + 1, step)
        if detect_creep(samples[:k], ready_at=0.0).creeping
    ]


# --- Theil-Sen ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slope", "intercept"), [(1.0, 0.0), (3.0, 7.0), (-2.5, 100.0), (0.0, 5.0), (1e6, 1e9)]
)
def test_theil_sen_is_exact_on_a_line(slope: float, intercept: float) -> None:
    xs = [float(x) for x in range(50)]
    assert theil_sen_slope(xs, [slope * x + intercept for x in xs]) == pytest.approx(slope)


def test_theil_sen_ignores_pairs_with_equal_x() -> None:
    xs = [0, 0, 1, 1, 2, 2, 3]
    ys = [0, 9, 2, 11, 4, 13, 6]  # two parallel lines of slope 2, 9 apart
    assert theil_sen_slope(xs, ys) == pytest.approx(2.0)


@pytest.mark.parametrize("seed", range(5))
def test_theil_sen_shrugs_off_30_percent_outliers(seed: int) -> None:
    rng = random.Random(seed)
    xs = [float(x) for x in range(100)]
    ys = [3.0 * x + 7.0 for x in xs]
    for i in rng.sample(range(100), 30):
        ys[i] += rng.choice([-1, 1]) * rng.uniform(1e4, 1e6)
    assert theil_sen_slope(xs, ys) == pytest.approx(3.0, abs=0.2)
    # Least squares, for contrast, is dragged far off by the same points.
    mx, my = sum(xs) / 100, sum(ys) / 100
    ols = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    assert abs(ols - 3.0) > 10


def test_theil_sen_one_sided_outliers_do_not_tilt_it() -> None:
    xs = [float(x) for x in range(100)]
    ys = [2.0 * x + (5e5 if x % 10 in (3, 6, 9) else 0.0) for x in xs]  # 30% spikes up
    assert theil_sen_slope(xs, ys) == pytest.approx(2.0, abs=0.05)


@pytest.mark.parametrize(
    ("xs", "ys"), [([], []), ([1.0], [5.0]), ([2.0, 2.0, 2.0], [1.0, 5.0, 9.0])]
)
def test_theil_sen_is_none_without_two_distinct_x(xs: list[float], ys: list[float]) -> None:
    assert theil_sen_slope(xs, ys) is None


def test_theil_sen_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        theil_sen_slope([1.0, 2.0], [1.0])


def test_theil_sen_subsamples_long_series_and_stays_exact() -> None:
    xs = [float(x) for x in range(5000)]
    assert theil_sen_slope(xs, [4.0 * x - 1.0 for x in xs]) == pytest.approx(4.0)


# --- creep: leaks -------------------------------------------------------------------------


@pytest.mark.parametrize("per_s", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("rate", [20 * MiB, 5 * MiB, 1 * MiB])
@pytest.mark.parametrize("seed", [0, 1])
def test_linear_leak_is_flagged(rate: int, per_s: float, seed: int) -> None:
    samples = series(lambda r: rate * r, per_s=per_s, seed=seed)
    verdict = detect_creep(samples, ready_at=0.0)
    assert verdict.creeping, verdict.reason
    assert verdict.flag is Flag.CREEPING
    assert verdict.slope_bytes_per_request == pytest.approx(rate, rel=0.1)
    assert verdict.growth_bytes > 32 * MiB
    assert "per request, Theil-Sen" in verdict.reason
    assert "still making new highs" in verdict.reason


def test_slow_leak_over_many_requests_is_flagged() -> None:
    samples = series(lambda r: 1 * MiB * r, seconds=300)  # +1MiB a request for 300 requests
    verdict = detect_creep(samples, ready_at=0.0)
    assert verdict.creeping, verdict.reason
    assert verdict.reason.startswith("footprint rose 12")  # ~120MiB over 119 requests
    assert "over the last 119 requests (1" in verdict.reason


def test_leak_is_flagged_soon_after_warm_up_and_stays_flagged() -> None:
    samples = series(lambda r: 5 * MiB * r)
    hits = flagged_at(samples)
    assert hits[0] <= 100  # warm-up (60 s) plus min_samples (30)
    assert hits == list(range(hits[0], len(samples) + 1, 5))


def test_leak_with_big_request_spikes_is_still_flagged() -> None:
    base = series(lambda r: 2 * MiB * r, seed=3)
    samples = [
        Sample(s.t, s.bytes + (300 * MiB if i % 7 == 0 else 0), s.requests)
        for i, s in enumerate(base)
    ]
    assert detect_creep(samples, ready_at=0.0).creeping


# --- creep: not leaks ---------------------------------------------------------------------


def _step(r: int) -> float:
    return 500 * MiB if r >= 5 else 0.0


def _log_then_flat(r: int) -> float:
    return 150 * MiB * math.log1p(min(r, 40))


def _exp_approach(r: int) -> float:
    return GiB * (1 - math.exp(-r / 8))


def _ramp_then_flat(r: int) -> float:
    return 10 * MiB * min(r, 50)


PLATEAUS: dict[str, Shape] = {
    "step up then flat": _step,
    "log-shaped rise then flat": _log_then_flat,
    "exponential approach": _exp_approach,
    "ramp then flat": _ramp_then_flat,
}


@pytest.mark.parametrize("shape", list(PLATEAUS.values()), ids=list(PLATEAUS))
@pytest.mark.parametrize("per_s", [1.0, 3.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_warm_up_then_plateau_is_never_flagged(shape: Shape, per_s: float, seed: int) -> None:
    # These shapes settle within the warm-up gate (60 s): every verdict, not only the
    # last, must be "not creeping".
    samples = series(shape, seconds=300, per_s=per_s, seed=seed)
    assert flagged_at(samples) == []
    verdict = detect_creep(samples, ready_at=0.0)
    assert verdict.reason.startswith("plateaued at "), verdict.reason
    assert "after warm-up" in verdict.reason


@pytest.mark.parametrize("shape", list(PLATEAUS.values()), ids=list(PLATEAUS))
def test_warm_up_slower_than_the_gate_is_cleared_once_it_plateaus(shape: Shape) -> None:
    # At 0.5 requests a second the rise outlasts the gate; while it still rises it may
    # look like a leak, but once flat the verdict is clear for good.
    samples = series(shape, seconds=400, per_s=0.5, seed=4)
    late = [k for k in flagged_at(samples) if k > 180]
    assert late == []
    assert not detect_creep(samples, ready_at=0.0).creeping


def test_warm_up_still_rising_after_the_gate_looks_like_a_leak_until_it_flattens() -> None:
    # The documented limit: the gate (20 requests, 60 s) is the knob for slow warm-ups.
    samples = series(lambda r: GiB * (1 - math.exp(-r / 30)), seconds=300)
    hits = flagged_at(samples)
    assert hits and hits[0] < 120
    assert hits[-1] < 200
    assert not detect_creep(samples, ready_at=0.0).creeping
    patient = CreepConfig(min_requests=200, min_age_s=200.0)
    assert not any(
        detect_creep(samples[:k], ready_at=0.0, config=patient).creeping for k in range(60, 301, 5)
    )


@pytest.mark.parametrize("jitter", [1 * MiB, 5 * MiB, 20 * MiB])
@pytest.mark.parametrize("per_s", [0.5, 1.0, 3.0])
def test_noise_around_a_flat_level_is_never_flagged(jitter: float, per_s: float) -> None:
    samples = series(lambda r: 0.0, seconds=300, per_s=per_s, jitter=jitter, seed=int(per_s * 7))
    assert flagged_at(samples) == []


def test_isolated_spikes_from_big_requests_are_not_creep() -> None:
    base = series(lambda r: 0.0, seed=5)
    samples = [
        Sample(s.t, s.bytes + (400 * MiB if i % 9 == 0 else 0), s.requests)
        for i, s in enumerate(base)
    ]
    assert flagged_at(samples, step=2) == []


@pytest.mark.parametrize(
    ("period", "amplitude"), [(10, 100 * MiB), (20, 200 * MiB), (40, 300 * MiB)]
)
@pytest.mark.parametrize("per_s", [1.0, 3.0])
def test_garbage_collected_sawtooth_is_not_flagged(
    period: int, amplitude: int, per_s: float
) -> None:
    samples = series(
        lambda r: amplitude * (r % period) / period, seconds=300, per_s=per_s, seed=period
    )
    assert flagged_at(samples) == []


def test_leak_that_stopped_40_percent_into_the_window_is_not_flagged() -> None:
    # Decision: creep means *still* growing. The leak ran until 48 samples into the last
    # 120 and has been flat since, so the last 24 samples make no new high.
    samples = series(lambda r: 5 * MiB * min(r, 328), seconds=400)
    verdict = detect_creep(samples, ready_at=0.0)
    assert not verdict.creeping
    assert verdict.flag is None
    assert verdict.reason.startswith("plateaued at ")
    # The slope over the window is still steep: new highs alone make the difference.
    assert verdict.slope_bytes_per_request is not None
    assert verdict.slope_bytes_per_request > 256 * KiB
    # While it was leaking, and until its last rise left the recent part, it was flagged.
    assert detect_creep(samples[:328], ready_at=0.0).creeping
    assert detect_creep(samples[:345], ready_at=0.0).creeping
    assert not detect_creep(samples[:360], ready_at=0.0).creeping


def test_load_before_ready_does_not_count() -> None:
    loading = [Sample(float(t), t * 100 * MiB, 0) for t in range(-30, 0)]
    flat = series(lambda r: 0.0, base=3 * GiB)
    assert not detect_creep(loading + flat, ready_at=0.0).creeping


def test_sample_order_does_not_matter() -> None:
    samples = series(lambda r: 3 * MiB * r, seed=9)
    shuffled = samples[:]
    random.Random(1).shuffle(shuffled)
    assert detect_creep(shuffled, ready_at=0.0) == detect_creep(samples, ready_at=0.0)


# --- creep: warm-up gate, thresholds, reasons ---------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "per_s", "fragment"),
    [
        (120, 19 / 120, "warming up: 19 of 20 requests, 1m59s of 1m since ready"),
        (60, 2.0, "warming up: 120 of 20 requests, 59s of 1m since ready"),
        (13, 1.0, "warming up: 13 of 20 requests, 12s of 1m since ready"),
    ],
)
def test_before_warm_up_nothing_is_flagged_even_with_a_steep_rise(
    seconds: int, per_s: float, fragment: str
) -> None:
    samples = series(lambda r: 50 * MiB * r, seconds=seconds, per_s=per_s, jitter=0)
    verdict = detect_creep(samples, ready_at=0.0)
    assert not verdict.creeping
    assert verdict.slope_bytes_per_request is None
    assert verdict.reason == fragment


def test_no_samples_since_ready_is_warming_up() -> None:
    verdict = detect_creep([Sample(-5.0, GiB, 0)], ready_at=0.0)
    assert verdict.reason == "warming up: no samples since ready"


def test_just_after_warm_up_it_waits_for_enough_samples() -> None:
    samples = series(lambda r: 50 * MiB * r, seconds=75, jitter=0)
    verdict = detect_creep(samples, ready_at=0.0)
    assert not verdict.creeping
    assert verdict.reason == "too few samples after warm-up to judge: 15 of 30"
    assert detect_creep(series(lambda r: 50 * MiB * r, seconds=90, jitter=0), ready_at=0).creeping


def test_idle_window_is_not_judged() -> None:
    busy = series(lambda r: 5 * MiB * r, seconds=100)
    idle = [Sample(100.0 + i, busy[-1].bytes, busy[-1].requests) for i in range(130)]
    verdict = detect_creep(busy + idle, ready_at=0.0)
    assert not verdict.creeping
    assert verdict.reason == (
        "no requests served in the last 120 samples; creep is judged per request"
    )


def test_slope_under_the_threshold_is_not_creep() -> None:
    samples = series(lambda r: 200 * KiB * r, per_s=3.0, jitter=0)  # ~70MiB over the window
    verdict = detect_creep(samples, ready_at=0.0)
    assert not verdict.creeping
    assert verdict.reason.startswith("flat at ")
    assert "200KiB per request" in verdict.reason
    assert "under the 256KiB threshold" in verdict.reason
    lower = CreepConfig(min_slope_bytes_per_request=128 * KiB)
    assert detect_creep(samples, ready_at=0.0, config=lower).creeping


def test_growth_under_the_threshold_is_not_creep() -> None:
    samples = series(lambda r: 512 * KiB * r, per_s=0.5, jitter=0)  # 60 requests: 30MiB
    verdict = detect_creep(samples, ready_at=0.0)
    assert not verdict.creeping
    assert verdict.growth_bytes == 60 * 512 * KiB
    assert verdict.reason == (
        "footprint rose only 30MiB over the last 60 requests "
        "(512KiB per request, Theil-Sen), under the 32MiB threshold"
    )


def test_creep_reason_reads_as_a_sentence_with_figures() -> None:
    samples = series(lambda r: 1536 * KiB * r, seconds=300, jitter=0)
    verdict = detect_creep(samples, ready_at=0.0)
    assert verdict.reason == (
        "footprint rose 178MiB over the last 119 requests (1.5MiB per request, Theil-Sen) "
        "and is still making new highs (peak 1.4GiB)"
    )


def test_plateau_reason_names_the_level() -> None:
    samples = series(lambda r: 200 * MiB * min(r, 50), seconds=300, jitter=0)
    verdict = detect_creep(samples, ready_at=0.0)
    assert verdict.reason == (
        "plateaued at 10.8GiB after warm-up: no new high in the last 24 samples "
        "(peak 10.8GiB; 0B per request, Theil-Sen over the last 119 requests)"
    )


# --- out of memory ------------------------------------------------------------------------


def test_recent_growth_is_max_minus_min_over_the_horizon() -> None:
    samples = [Sample(float(t), GiB + (t * MiB if t < 100 else 500 * MiB), t) for t in range(121)]
    # The last 60 s hold t = 60..120: from 1GiB+60MiB up to 1GiB+500MiB.
    assert recent_growth(samples) == 440 * MiB
    assert recent_growth(samples, horizon_s=10.0) == 0
    assert recent_growth(samples, horizon_s=30.0, now=50.0) == 30 * MiB


@pytest.mark.parametrize(
    ("samples", "now", "expected"),
    [
        ([], None, 0),
        ([Sample(5.0, GiB, 0)], None, 0),
        ([Sample(0.0, GiB, 0), Sample(100.0, 2 * GiB, 1)], 500.0, 0),  # nothing in horizon
        ([Sample(0.0, 2 * GiB, 0), Sample(10.0, GiB, 1)], None, GiB),  # a drop counts too
    ],
)
def test_recent_growth_edges(samples: list[Sample], now: float | None, expected: int) -> None:
    assert recent_growth(samples, now=now) == expected


@pytest.mark.parametrize(
    ("free", "growth", "need", "expected"),
    [
        (4 * GiB, 200 * MiB, None, "fragmented"),
        (4 * GiB, 200 * MiB, 1 * GiB, "fragmented"),
        (4 * GiB, 200 * MiB, 6 * GiB, "capacity"),  # the request needed more than was free
        (4 * GiB, 200 * MiB, 4 * GiB, "capacity"),  # boundary: free must be strictly more
        (300 * MiB, 2 * GiB, None, "capacity"),  # it grew by more than the device had free
        (1 * GiB, 1 * GiB, None, "capacity"),  # boundary
        (1 * GiB + 1, 1 * GiB, None, "fragmented"),
        (0, 0, None, "capacity"),
    ],
)
def test_classify_oom(free: int, growth: int, need: int | None, expected: str) -> None:
    kind = classify_oom(device_free=free, recent_growth_bytes=growth, request_need_bytes=need)
    assert kind == expected


def test_diagnose_oom_uses_growth_up_to_the_report() -> None:
    samples = [Sample(float(t), GiB + t * 10 * MiB, t) for t in range(200)]
    report = OomReport(t=100.0, text="CUDA error: out of memory")
    frag = diagnose_oom(report, device=DeviceFree(4 * GiB), samples=samples)
    assert frag.kind == "fragmented"
    assert frag.flag is Flag.FRAGMENTED
    assert frag.reason == (
        "out of memory although the device had room (device had 4GiB free, instance grew "
        "600MiB in the last 1m): fragmentation or an allocator pool; a clean restart "
        "should cure it"
    )
    cap = diagnose_oom(
        report, device=DeviceFree(4 * GiB), samples=samples, request_need_bytes=5 * GiB
    )
    assert cap.kind == "capacity"
    assert cap.flag is None
    assert cap.reason == (
        "out of memory for lack of capacity (device had 4GiB free, instance grew 600MiB "
        "in the last 1m, request needed 5GiB)"
    )


# --- over-cap -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "needed", "footprints", "fires"),
    [
        (100, 3, [101, 101, 101], [3]),
        (100, 3, [101] * 10, [3]),  # once per streak, not on every sample after
        (100, 3, [101, 101, 99, 101, 101, 101], [6]),  # a dip resets the count
        (100, 3, [101, 101, 100, 101, 101], []),  # at the cap is not above it
        (100, 3, [101, 101, 101, 50, 101, 101, 101], [3, 7]),  # a new streak fires again
        (100, 1, [101, 101, 90, 101], [1, 4]),
        (None, 3, [10**12] * 5, []),  # no cap, never over it
        (100, 3, [], []),
    ],
)
def test_cap_watch(cap: int | None, needed: int, footprints: list[int], fires: list[int]) -> None:
    watch = CapWatch(cap, needed=needed)
    got = [i for i, f in enumerate(footprints, start=1) if watch.observe(f)]
    assert got == fires


def test_cap_watch_exposes_the_streak() -> None:
    watch = CapWatch(100)
    streaks = []
    for footprint in (150, 150, 150, 150, 20):
        watch.observe(footprint)
        streaks.append(watch.streak)
    assert streaks == [1, 2, 3, 4, 0]
