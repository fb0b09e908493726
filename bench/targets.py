"""The scheduling targets vramd is held to on every trace (docs/benchmarks.md).

``check(report)`` reads one ``bench.replay`` report (it needs the vramd, lru-count,
static and unbounded runs) and returns one ``Target`` per goal:

- ``no-oom``: 0 loads that ran out of memory and 0 requests failed for it;
- ``served``: requests served >= 98 % of what ``lru-count`` serves;
- ``slo``: SLO attainment >= max(``lru-count``, ``static``);
- ``top-p99``: p99 latency of the top priority class <= 1.2 x ``unbounded``'s;
- ``cold``: cold starts <= 0.5 x ``lru-count``'s.

Each target carries the figures it compared, so a table can say by how much vramd
missed, and ``why_lost`` offers the reasons the figures themselves show (a baseline
that served requests after they would have timed out in vramd's queue, say).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NEEDED = ("vramd", "lru-count", "static", "unbounded")
SERVED_FRACTION = 0.98
TOP_P99_FACTOR = 1.2
COLD_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float | None
    bound: float | None
    met: bool
    text: str


def top_priority(run: Mapping[str, Any]) -> str | None:
    classes = [p for p, fig in run["by_priority"].items() if fig["served"]]
    return max(classes, key=int) if classes else None


def check(report: Mapping[str, Any]) -> list[Target]:
    runs = report["policies"]
    missing = [name for name in NEEDED if name not in runs]
    if missing:
        raise ValueError(f"the targets need runs of {', '.join(missing)} too")
    v, lru, static, unbounded = (runs[name] for name in NEEDED)
    out = []
    oom = v["oom_loads"] + v["failed_oom"]
    out.append(
        Target("no-oom", oom, 0, oom == 0, f"{v['oom_loads']} OOM loads, {v['failed_oom']} reqs")
    )
    bound = SERVED_FRACTION * lru["served"]
    out.append(
        Target(
            "served",
            v["served"],
            bound,
            v["served"] >= bound,
            f"{v['served']} vs {SERVED_FRACTION:.0%} of {lru['served']}",
        )
    )
    slo_bound = max(lru["slo_attainment"] or 0.0, static["slo_attainment"] or 0.0)
    slo = v["slo_attainment"] or 0.0
    out.append(Target("slo", slo, slo_bound, slo >= slo_bound, f"{slo:.1%} vs {slo_bound:.1%}"))
    top = top_priority(unbounded)
    p99 = v["by_priority"].get(top, {}).get("latency_s", {}).get("p99") if top else None
    base = unbounded["by_priority"][top]["latency_s"]["p99"] if top else None
    p99_bound = None if base is None else TOP_P99_FACTOR * base
    met = p99 is not None and p99_bound is not None and p99 <= p99_bound + 1e-9
    text = f"priority {top}: {_s(p99)} vs {TOP_P99_FACTOR}x{_s(base)}"
    out.append(Target("top-p99", p99, p99_bound, met, text))
    cold_bound = COLD_FRACTION * lru["cold_starts"]
    out.append(
        Target(
            "cold",
            v["cold_starts"],
            cold_bound,
            v["cold_starts"] <= cold_bound,
            f"{v['cold_starts']} vs {COLD_FRACTION}x{lru['cold_starts']}",
        )
    )
    return out


def why_lost(report: Mapping[str, Any], targets: list[Target]) -> list[str]:
    """Reasons the report's own figures give for each target vramd missed."""
    runs = report["policies"]
    v, lru = runs["vramd"], runs["lru-count"]
    lost = {t.name for t in targets if not t.met}
    out = []
    if "served" in lost:
        refusals = ", ".join(f"{n} {code}" for code, n in sorted(v["refused"].items())) or "none"
        late = lru.get("served_past_timeout", 0)
        text = f"served: vramd's refusals: {refusals}"
        if late:
            text += (
                f"; lru-count served {late} of its {lru['served']} only after they had "
                f"waited past their queue.timeout (vramd answers those 503): within the "
                f"timeouts it served {lru['served'] - late}, vramd {v['served']}"
            )
        out.append(text)
    if "top-p99" in lost:
        top = top_priority(runs["unbounded"])
        svc_cold = {
            name: fig["cold_starts"]
            for name, fig in v["by_service"].items()
            if fig["requests"] and top is not None and _priority_of(report, name) == int(top)
        }
        out.append(
            f"top-p99: the top priority's requests that waited for a reload set its p99 "
            f"(cold starts: {svc_cold}); unbounded never unloads anything"
        )
    if "cold" in lost:
        out.append(f"cold: vramd loaded {v['cold_starts']} times; lru-count {lru['cold_starts']}")
    if "slo" in lost:
        out.append("slo: requests that waited for memory behind a swap (or timed out) miss the SLO")
    return out


def _priority_of(report: Mapping[str, Any], service: str) -> int | None:
    priorities: Mapping[str, int] = report.get("priorities", {})
    return priorities.get(service)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"
