"""The scheduling targets vramd is held to on every trace (docs/benchmarks.md).

``check(report)`` reads one ``bench.replay`` report (it needs the vramd, lru-count,
static and unbounded runs) and returns one ``Target`` per goal, in this order:

- ``no-oom``: 0 requests failed by out-of-memory and 0 out-of-memory loads of a service
  whose peak had been measured (one that had been ready before in the run): a load may
  run out of memory only while a peak is still being learned;
- ``served``: requests served within their ``queue.timeout`` >= 98 % of the better of
  ``lru-count``'s and ``static``'s (a baseline's request served after it would have
  timed out in vramd's queue does not count);
- ``slo``: SLO attainment >= the better of ``lru-count``'s and ``static``'s;
- ``top-p99``: the highest priority among unpinned services that have requests: the p99
  latency of those services' requests <= 1.5 x ``unbounded``'s for the same set;
- ``cold``: cold starts <= 0.5 x ``lru-count``'s;
- ``fair``: every service with >= 1 % of the trace's requests is served within its
  timeout at least 90 % as often (its share of its own requests) as under ``lru-count``.

Each target carries the figures it compared, so a table can say by how much vramd
missed, and ``why_lost`` offers the reasons the figures themselves show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NEEDED = ("vramd", "lru-count", "static", "unbounded")
NAMES = ("no-oom", "served", "slo", "top-p99", "cold", "fair")
SERVED_FRACTION = 0.98
TOP_P99_FACTOR = 1.5
COLD_FRACTION = 0.5
FAIR_MIN_SHARE = 0.01  # of the trace's requests: smaller services are not held to `fair`
FAIR_FRACTION = 0.9
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float | None
    bound: float | None
    met: bool
    text: str


@dataclass(frozen=True, slots=True)
class Share:
    """One service's share of its requests served within timeout, vramd and lru-count."""

    service: str
    requests: int
    vramd: float
    lru: float

    @property
    def ratio(self) -> float:
        return math.inf if self.lru <= 0 else self.vramd / self.lru

    @property
    def met(self) -> bool:
        return self.vramd >= FAIR_FRACTION * self.lru - EPS

    def text(self) -> str:
        return f"{self.service} {self.vramd:.0%} vs {self.lru:.0%} of {self.requests}"


def top_unpinned(run: Mapping[str, Any]) -> str | None:
    """The highest priority (a key of ``by_priority_unpinned``) whose services have requests."""
    classes = [p for p, fig in run.get("by_priority_unpinned", {}).items() if fig["requests"]]
    return max(classes, key=int) if classes else None


def better_baseline(runs: Mapping[str, Any], key: str) -> tuple[str, float]:
    """The better of lru-count and static by ``key`` (lru-count on a tie)."""
    lru, static = runs["lru-count"][key] or 0.0, runs["static"][key] or 0.0
    return ("static", static) if static > lru else ("lru-count", lru)


def shares(runs: Mapping[str, Any]) -> list[Share]:
    """The services ``fair`` holds vramd to, worst ratio first."""
    v, lru = runs["vramd"], runs["lru-count"]
    total = v["requests"]
    out = []
    for name, fig in v.get("by_service", {}).items():
        if not fig["requests"] or fig["requests"] < FAIR_MIN_SHARE * total:
            continue
        theirs = lru["by_service"][name]
        out.append(
            Share(
                name,
                fig["requests"],
                fig["share_within_timeout"] or 0.0,
                theirs["share_within_timeout"] or 0.0,
            )
        )
    return sorted(out, key=lambda s: (s.ratio, s.service))


def check(
    report: Mapping[str, Any],
    *,
    cold_fraction: float = COLD_FRACTION,
    top_factor: float = TOP_P99_FACTOR,
) -> list[Target]:
    """The targets, in ``NAMES`` order. ``cold_fraction`` and ``top_factor`` replace the
    bounds of ``cold`` and ``top-p99`` (the sweep reads its reports with looser ones too)."""
    runs = report["policies"]
    missing = [name for name in NEEDED if name not in runs]
    if missing:
        raise ValueError(f"the targets need runs of {', '.join(missing)} too")
    v, lru, unbounded = runs["vramd"], runs["lru-count"], runs["unbounded"]
    out = []

    late_oom = v.get("oom_loads_after_ready", 0)
    bad = late_oom + v["failed_oom"]
    text = f"{v['failed_oom']} reqs failed, {v['oom_loads']} OOM loads ({late_oom} after ready)"
    out.append(Target("no-oom", bad, 0, bad == 0, text))

    base_name, base = better_baseline(runs, "served_within_timeout")
    bound = SERVED_FRACTION * base
    within = v["served_within_timeout"]
    text = f"{within} vs {SERVED_FRACTION:.0%} of {base:.0f} ({base_name})"
    out.append(Target("served", within, bound, within >= bound - EPS, text))

    slo_name, slo_bound = better_baseline(runs, "slo_attainment")
    slo = v["slo_attainment"] or 0.0
    text = f"{slo:.1%} vs {slo_bound:.1%} ({slo_name})"
    out.append(Target("slo", slo, slo_bound, slo >= slo_bound - EPS, text))

    top = top_unpinned(unbounded)
    if top is None:
        out.append(Target("top-p99", None, None, True, "no unpinned service has requests"))
    else:
        p99 = v["by_priority_unpinned"].get(top, {}).get("latency_s", {}).get("p99")
        base_p99 = unbounded["by_priority_unpinned"][top]["latency_s"]["p99"]
        p99_bound = None if base_p99 is None else top_factor * base_p99
        met = p99_bound is None or (p99 is not None and p99 <= p99_bound + EPS)
        text = f"priority {top}: {_s(p99)} vs {top_factor}x{_s(base_p99)}"
        out.append(Target("top-p99", p99, p99_bound, met, text))

    cold_bound = cold_fraction * lru["cold_starts"]
    cold = v["cold_starts"]
    text = f"{cold} vs {cold_fraction}x{lru['cold_starts']}"
    out.append(Target("cold", cold, cold_bound, cold <= cold_bound + EPS, text))

    held = shares(runs)
    if not held:
        out.append(Target("fair", None, FAIR_FRACTION, True, "no service to hold"))
    else:
        worst = held[0]
        ratio = None if math.isinf(worst.ratio) else worst.ratio
        met = all(s.met for s in held)
        out.append(Target("fair", ratio, FAIR_FRACTION, met, f"worst {worst.text()}"))
    return out


def why_lost(report: Mapping[str, Any], targets: list[Target]) -> list[str]:
    """Reasons the report's own figures give for each target vramd missed."""
    runs = report["policies"]
    v, lru = runs["vramd"], runs["lru-count"]
    lost = {t.name for t in targets if not t.met}
    out = []
    if "no-oom" in lost:
        by_service = {n: f["oom_loads"] for n, f in v["by_service"].items() if f.get("oom_loads")}
        failed = {n: f["failed_oom"] for n, f in v["by_service"].items() if f["failed_oom"]}
        out.append(
            f"no-oom: OOM loads by service {by_service or '{}'} "
            f"({v.get('oom_loads_after_ready', 0)} after the service had been ready); "
            f"requests failed by OOM {failed or '{}'}"
        )
    if "served" in lost:
        refusals = ", ".join(f"{n} {code}" for code, n in sorted(v["refused"].items())) or "none"
        base_name, _ = better_baseline(runs, "served_within_timeout")
        short = _deficits(v, runs[base_name], "served_within_timeout")
        text = f"served: vramd's refusals: {refusals}; fewer than {base_name} within timeout: "
        text += ", ".join(f"{n} {mine} vs {theirs}" for n, mine, theirs in short) or "none"
        late = lru.get("served_past_timeout", 0)
        if late:
            text += f"; lru-count also served {late} only after their queue.timeout"
        out.append(text)
    if "slo" in lost:
        base_name, _ = better_baseline(runs, "slo_attainment")
        short = _deficits(v, runs[base_name], "slo_attainment")
        out.append(
            f"slo: fewer requests within their SLO than {base_name}: "
            + (", ".join(f"{n} {mine:.0%} vs {theirs:.0%}" for n, mine, theirs in short) or "-")
        )
    if "top-p99" in lost:
        top = top_unpinned(runs["unbounded"])
        floor = runs["unbounded"]["by_service"]
        parts = [
            f"{name} p99 {_s(fig['latency_s']['p99'])} (unbounded "
            f"{_s(floor[name]['latency_s']['p99'])}), {fig['cold_starts']} cold starts, "
            f"{fig['refused_total']} refused"
            for name, fig in v["by_service"].items()
            if fig["requests"]
            and not _pinned(report, name)
            and str(_priority_of(report, name)) == top
        ]
        out.append(f"top-p99: priority {top}: " + ("; ".join(parts) or "-"))
    if "cold" in lost:
        mine = {n: f["cold_starts"] for n, f in v["by_service"].items()}
        theirs = {n: f["cold_starts"] for n, f in lru["by_service"].items()}
        most = sorted(mine, key=lambda n: (-mine[n], n))[:4]
        out.append(
            f"cold: vramd loaded {v['cold_starts']} times, lru-count {lru['cold_starts']}; "
            "most loaded: " + ", ".join(f"{n} {mine[n]} (lru {theirs.get(n, 0)})" for n in most)
        )
    if "fair" in lost:
        starved = [s for s in shares(runs) if not s.met]
        out.append(
            "fair: served within timeout, vramd vs lru-count: "
            + ", ".join(s.text() for s in starved)
        )
    return out


def _deficits(
    mine: Mapping[str, Any], theirs: Mapping[str, Any], key: str, top: int = 4
) -> list[tuple[str, Any, Any]]:
    """The services where ``mine`` trails ``theirs`` by ``key``, in requests, largest first."""
    rows = []
    for name, fig in mine["by_service"].items():
        a, b = fig[key] or 0, theirs["by_service"][name][key] or 0
        weight = 1 if key.startswith("served") else fig["requests"]
        if a < b:
            rows.append(((b - a) * weight, name, a, b))
    rows.sort(key=lambda r: (-r[0], r[1]))
    return [(name, a, b) for _, name, a, b in rows[:top]]


def _pinned(report: Mapping[str, Any], service: str) -> bool:
    residencies: Mapping[str, str] = report.get("residencies", {})
    return residencies.get(service) == "pinned"


def _priority_of(report: Mapping[str, Any], service: str) -> int | None:
    priorities: Mapping[str, int] = report.get("priorities", {})
    return priorities.get(service)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"
