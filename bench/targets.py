"""The scheduling targets vramd is held to on every trace (docs/benchmarks.md).

``check(report)`` reads one ``bench.replay`` report (it needs the runs of ``NEEDED``:
vramd as the daemon runs it, with ``yielding: auto``; each fixed setting,
``vramd:<setting>``; lru-count, static and unbounded) and returns one ``Target`` per
goal, in this order:

- ``no-oom``: 0 requests failed by out-of-memory and 0 out-of-memory loads of a service
  whose peak had been measured (one that had been ready before in the run): a load may
  run out of memory only while a peak is still being learned;
- ``served``: requests served within their ``queue.timeout`` >= 98 % of the better of
  ``lru-count``'s and ``static``'s (a baseline's request served after it would have
  timed out in vramd's queue does not count);
- ``slo``: SLO attainment >= the better of ``lru-count``'s and ``static``'s;
- ``weighted``: priority-weighted SLO >= 98 % of the best fixed setting's, among the
  fixed settings that serve within timeout >= 98 % of the better baseline's (the best
  of all four where none does): ``auto`` loses little to the setting an owner would
  have had to find by hand;
- ``fair``: every service with >= 1 % of the trace's requests is served within its
  timeout at least 80 % as often (its share of its own requests) as under ``lru-count``.

``costs(report)`` gives what is reported but not a target: loads against lru-count's,
the top unpinned priority's SLO and p99 against unbounded's, and SLO against the
unbounded box's (the limit). Each target carries the figures it compared, so a table can
say by how much vramd missed, and ``why_lost`` offers the reasons the figures show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.systems import FIXED_SYSTEMS as FIXED_SYSTEMS

BASELINES = ("lru-count", "static", "unbounded")
NEEDED = ("vramd", *FIXED_SYSTEMS, *BASELINES)
NAMES = ("no-oom", "served", "slo", "weighted", "fair")
SERVED_FRACTION = 0.98
WEIGHTED_FRACTION = 0.98
FAIR_MIN_SHARE = 0.01  # of the trace's requests: smaller services are not held to `fair`
FAIR_FRACTION = 0.8
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


def best_fixed(runs: Mapping[str, Any]) -> tuple[str, float]:
    """The fixed setting ``weighted`` compares with: the highest weighted SLO among those
    that serve within timeout >= 98 % of the better baseline (of all, where none does)."""
    _, base = better_baseline(runs, "served_within_timeout")
    fixed = [name for name in FIXED_SYSTEMS if name in runs]
    ok = [n for n in fixed if runs[n]["served_within_timeout"] >= SERVED_FRACTION * base - EPS]
    best = max(ok or fixed, key=lambda n: (runs[n]["weighted_slo"] or 0.0, -fixed.index(n)))
    return best, runs[best]["weighted_slo"] or 0.0


def check(report: Mapping[str, Any]) -> list[Target]:
    """The targets, in ``NAMES`` order."""
    runs = report["policies"]
    missing = [name for name in NEEDED if name not in runs]
    if missing:
        raise ValueError(f"the targets need runs of {', '.join(missing)} too")
    v = runs["vramd"]
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

    fixed_name, fixed = best_fixed(runs)
    weighted = v["weighted_slo"] or 0.0
    w_bound = WEIGHTED_FRACTION * fixed
    text = f"{weighted:.3f} vs {WEIGHTED_FRACTION:.0%} of {fixed:.3f} ({fixed_name})"
    out.append(Target("weighted", weighted, w_bound, weighted >= w_bound - EPS, text))

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
    if "weighted" in lost:
        fixed_name, _ = best_fixed(runs)
        chosen = [e for e in report.get("tuning", []) if e.get("changed")]
        path = " -> ".join(["balanced", *(str(e["current"]) for e in chosen)])
        short = _deficits(v, runs[fixed_name], "slo_attainment")
        out.append(
            f"weighted: auto went {path}; fewer within their SLO than {fixed_name}: "
            + (", ".join(f"{n} {mine:.0%} vs {theirs:.0%}" for n, mine, theirs in short) or "-")
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


def costs(report: Mapping[str, Any]) -> dict[str, Any]:
    """What the targets no longer bound but a report shows: loads against lru-count's,
    the top unpinned priority's SLO and p99 against unbounded's, SLO against unbounded's."""
    runs = report["policies"]
    v, lru, unbounded = runs["vramd"], runs["lru-count"], runs["unbounded"]
    top = top_unpinned(unbounded)
    mine = v["by_priority_unpinned"].get(top, {}) if top is not None else {}
    floor = unbounded["by_priority_unpinned"].get(top, {}) if top is not None else {}
    return {
        "loads": v["cold_starts"],
        "lru_count_loads": lru["cold_starts"],
        "top_priority": top,
        "top_slo": mine.get("slo_attainment"),
        "top_slo_unbounded": floor.get("slo_attainment"),
        "top_p99": mine.get("latency_s", {}).get("p99"),
        "top_p99_unbounded": floor.get("latency_s", {}).get("p99"),
        "slo": v["slo_attainment"],
        "slo_unbounded": unbounded["slo_attainment"],
    }
