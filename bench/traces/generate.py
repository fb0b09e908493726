"""A seeded trace generator: Zipf popularity, Gamma arrivals, bursty groups, a daily cycle.

    python -m bench.traces.generate --alpha 0.9 --cv 4 --seed 1 --duration 3600 \\
        --out bench/traces/a0.9-cv4.jsonl [--policy bench/policies/ten-services.yaml]

Each service of the policy gets one model name (its first) and a popularity rank, in the
order the policy lists them. The arrival intensity of the model of rank r is

    rate * r**-alpha / sum_k k**-alpha  *  day(t)  *  burst(group, t)

- ``day(t) = 1 - diurnal * cos(2 pi t / duration)``: one compressed day over the trace,
  quiet at the start and end, busiest in the middle; it averages 1.
- ``burst``: models in one group (``--groups "coder,chat-large;sdxl,flux,vision"``) are
  switched on and off together: on periods average ``--burst-on`` seconds, off periods
  ``--burst-off``, both exponential; off multiplies the rate by ``OFF_LEVEL`` and on by
  whatever keeps the average at 1. Models in no group are steady.
- Within that intensity, arrivals are a renewal process whose gaps are Gamma with
  coefficient of variation ``--cv`` (1: Poisson; 4: long silences and tight clusters),
  placed by time rescaling: unit-mean Gamma gaps in "operational time", mapped through
  the inverse of the cumulative intensity.

Service times come from the model's kind (``DURATIONS``: log-normal median and spread);
chat requests stream with probability ``STREAM_P``. The same arguments always give the
same file: every random stream is seeded from ``--seed`` and the model's name.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.domain import ServiceKind
from service.policy import load_policy
from service.replay.trace import TraceRequest, dump_trace

DEFAULT_POLICY = "bench/policies/ten-services.yaml"
DEFAULT_GROUPS = "coder,chat-large;sdxl,flux,vision;whisper,tts"
OFF_LEVEL = 0.2
STREAM_P = 0.7
STEP_S = 1.0  # grid of the cumulative intensity
# kind -> (median seconds, log-normal sigma)
DURATIONS: dict[ServiceKind, tuple[float, float]] = {
    ServiceKind.CHAT: (4.0, 0.6),
    ServiceKind.EMBEDDING: (0.2, 0.5),
    ServiceKind.DIFFUSION: (6.0, 0.3),
    ServiceKind.SPEECH: (3.0, 0.5),
    ServiceKind.RERANK: (0.3, 0.4),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    model: str
    service: str
    kind: ServiceKind


@dataclass(frozen=True, slots=True)
class TraceParams:
    alpha: float
    cv: float
    seed: int
    duration: float
    rate: float = 0.6
    diurnal: float = 0.5
    burst_on: float = 300.0
    burst_off: float = 900.0


def zipf_shares(n: int, alpha: float) -> list[float]:
    weights = [(rank + 1) ** -alpha for rank in range(n)]
    total = sum(weights)
    return [w / total for w in weights]


def parse_groups(text: str, services: Sequence[str]) -> list[list[str]]:
    groups = [[s.strip() for s in part.split(",") if s.strip()] for part in text.split(";")]
    groups = [g for g in groups if g]
    for group in groups:
        unknown = [s for s in group if s not in services]
        if unknown:
            raise ValueError(f"--groups names services not in the policy: {unknown}")
    return groups


def _burst_levels(rng: random.Random, params: TraceParams, steps: int) -> list[float]:
    """The group's rate multiplier on each grid step (averages 1 over a long trace)."""
    duty = params.burst_on / (params.burst_on + params.burst_off)
    on_level = (1.0 - OFF_LEVEL * (1.0 - duty)) / duty
    levels: list[float] = []
    on = rng.random() < duty
    while len(levels) < steps:
        mean = params.burst_on if on else params.burst_off
        length = max(1, round(rng.expovariate(1.0 / mean) / STEP_S))
        levels.extend([on_level if on else OFF_LEVEL] * length)
        on = not on
    return levels[:steps]


def _arrivals(rng: random.Random, intensity: Sequence[float], cv: float) -> list[float]:
    """Renewal arrivals with Gamma(cv) gaps under a piecewise-constant intensity."""
    cumulative = [0.0]
    for value in intensity:
        cumulative.append(cumulative[-1] + value * STEP_S)
    shape = 1.0 / (cv * cv)
    times: list[float] = []
    s = rng.gammavariate(shape, 1.0 / shape) * rng.random()  # a stationary-ish start
    while s < cumulative[-1]:
        i = bisect.bisect_right(cumulative, s) - 1
        rate = intensity[i] if i < len(intensity) else 0.0
        if rate > 0:
            times.append((i + (s - cumulative[i]) / (rate * STEP_S)) * STEP_S)
        s += rng.gammavariate(shape, 1.0 / shape)
    return times


def generate(
    models: Sequence[ModelSpec], params: TraceParams, groups: Sequence[Sequence[str]]
) -> list[TraceRequest]:
    steps = max(1, math.ceil(params.duration / STEP_S))
    day = [
        1.0 - params.diurnal * math.cos(2 * math.pi * (i + 0.5) * STEP_S / params.duration)
        for i in range(steps)
    ]
    burst: dict[str, list[float]] = {}
    for group in groups:
        group_levels = _burst_levels(
            random.Random(f"{params.seed}:group:{','.join(group)}"), params, steps
        )
        for service in group:
            burst[service] = group_levels
    shares = zipf_shares(len(models), params.alpha)
    raw: list[tuple[float, str, float, bool]] = []
    for spec, share in zip(models, shares, strict=True):
        rng = random.Random(f"{params.seed}:model:{spec.model}")
        levels = burst.get(spec.service)
        intensity = [
            params.rate * share * day[i] * (levels[i] if levels else 1.0) for i in range(steps)
        ]
        median, sigma = DURATIONS[spec.kind]
        for t in _arrivals(rng, intensity, params.cv):
            duration = rng.lognormvariate(math.log(median), sigma)
            stream = spec.kind is ServiceKind.CHAT and rng.random() < STREAM_P
            raw.append((t, spec.model, duration, stream))
    raw.sort(key=lambda r: (r[0], r[1]))
    return [TraceRequest(f"r{i}", t, m, d, s) for i, (t, m, d, s) in enumerate(raw)]


def models_of_policy(text: str) -> list[ModelSpec]:
    policy = load_policy(text)
    return [ModelSpec(svc.models[0], name, svc.kind) for name, svc in policy.services.items()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.traces.generate", description=__doc__.split("\n")[0]
    )
    p.add_argument("--alpha", type=float, required=True, help="Zipf exponent of popularity")
    p.add_argument("--cv", type=float, required=True, help="coefficient of variation of gaps")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=3600.0, help="seconds")
    p.add_argument("--rate", type=float, default=0.6, help="mean requests per second, all models")
    p.add_argument("--diurnal", type=float, default=0.5, help="daily cycle amplitude, 0..1")
    p.add_argument(
        "--groups", default=DEFAULT_GROUPS, help='bursty groups: "a,b;c,d" ("" for none)'
    )
    p.add_argument("--burst-on", type=float, default=300.0, help="mean on period of a group, s")
    p.add_argument("--burst-off", type=float, default=900.0, help="mean off period, s")
    p.add_argument("--policy", default=DEFAULT_POLICY)
    p.add_argument("--out", help="JSONL file to write (default: stdout)")
    args = p.parse_args(argv)
    if args.cv <= 0 or args.duration <= 0 or args.rate <= 0 or not 0 <= args.diurnal <= 1:
        p.error("--cv, --duration and --rate must be > 0 and --diurnal within 0..1")
    models = models_of_policy(Path(args.policy).read_text(encoding="utf-8"))
    try:
        groups = parse_groups(args.groups, [m.service for m in models])
    except ValueError as exc:
        p.error(str(exc))
    params = TraceParams(
        alpha=args.alpha,
        cv=args.cv,
        seed=args.seed,
        duration=args.duration,
        rate=args.rate,
        diurnal=args.diurnal,
        burst_on=args.burst_on,
        burst_off=args.burst_off,
    )
    text = dump_trace(generate(models, params, groups))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
