"""What ``bench.sweep`` prints and writes: a line per trace, the tables, the summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench import targets

TRACE_COLUMNS = (
    "case",
    "trace",
    "requests",
    "within timeout: vramd / lru / static / unb.",
    "SLO: vramd / lru / static / unb.",
    "weighted SLO: auto / best fixed",
    "top unpinned p99: vramd / unb.",
    "loads: vramd / lru",
    "vramd OOM loads (after ready) / reqs",
    "worst share within timeout: vramd vs lru",
    "missed",
)
SYSTEMS = ("vramd", "lru-count", "static", "unbounded")
# Per load level (a box's quiet, busy or saturating rate): what ``by_load`` counts.
LOAD_FIELDS = (
    "traces",
    "all_met",
    "vramd_loads",
    "vramd_within_timeout",
    "lru_count_loads",
    "lru_count_within_timeout",
)


def line(report: Mapping[str, Any]) -> str:
    cells = [f"{'ok  ' if t['met'] else 'MISS'} {t['name']} {t['text']}" for t in report["targets"]]
    return f"{report['policy']:<26} {report['trace']:<26} " + " | ".join(cells)


def missed(report: Mapping[str, Any]) -> list[str]:
    return [t["name"] for t in report["targets"] if not t["met"]]


def summarize(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per target how many traces met it; how many met all; per case; every miss."""
    by_case: dict[str, dict[str, Any]] = {}
    starved = []
    for r in reports:
        case = by_case.setdefault(
            r["policy"], {"traces": 0, "all_met": 0, "missed": dict.fromkeys(targets.NAMES, 0)}
        )
        case["traces"] += 1
        case["all_met"] += not missed(r)
        for name in missed(r):
            case["missed"][name] += 1
        for share in targets.shares(r["policies"]):
            if not share.met:
                starved.append(
                    {
                        "case": r["policy"],
                        "trace": r["trace"],
                        "service": share.service,
                        "requests": share.requests,
                        "vramd": share.vramd,
                        "lru_count": share.lru,
                    }
                )
    starved.sort(key=lambda s: (s["vramd"] - s["lru_count"], s["case"], s["trace"]))
    by_load: dict[str, dict[str, int]] = {}
    for r in reports:
        row = by_load.setdefault(r.get("load", "-"), dict.fromkeys(LOAD_FIELDS, 0))
        lost = set(missed(r))
        row["traces"] += 1
        row["all_met"] += not lost
        for system, key in (("vramd", "vramd"), ("lru-count", "lru_count")):
            run = r["policies"][system]
            row[f"{key}_loads"] += run["cold_starts"]
            row[f"{key}_within_timeout"] += run["served_within_timeout"]
    all_met = sum(1 for r in reports if not missed(r))
    return {
        "traces": len(reports),
        "met": {name: sum(name not in missed(r) for r in reports) for name in targets.NAMES},
        "all_met": all_met,
        "all_met_fraction": all_met / len(reports) if reports else None,
        "by_case": by_case,
        "by_load": by_load,
        "yielding": _yielding(reports),
        "starved": starved,
        "misses": [
            {"case": r["policy"], "trace": r["trace"], "missed": missed(r), "why": r["why_lost"]}
            for r in reports
            if missed(r)
        ],
    }


def _yielding(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per fixed setting, on how many traces it was the best (``weighted``'s reference);
    what ``auto`` ended on; and the frontier totals of every vramd system."""
    best: dict[str, int] = {}
    ended: dict[str, int] = {}
    totals: dict[str, dict[str, float]] = {}
    for r in reports:
        name, _ = targets.best_fixed(r["policies"])
        best[name] = best.get(name, 0) + 1
        last = r.get("tuning", [])
        end = str(last[-1]["current"]) if last else "balanced"
        ended[end] = ended.get(end, 0) + 1
        for system in ("vramd", *targets.FIXED_SYSTEMS):
            run = r["policies"][system]
            row = totals.setdefault(system, dict.fromkeys(FRONTIER, 0.0))
            row["within_timeout"] += run["served_within_timeout"]
            row["weighted_slo"] += run["weighted_slo"] or 0.0
            row["loads"] += run["cold_starts"]
            row["wall_s"] += run.get("wall_s", 0.0)
    for row in totals.values():
        row["weighted_slo"] = round(row["weighted_slo"] / max(1, len(reports)), 4)
        row["wall_s"] = round(row["wall_s"], 1)
    return {"best_fixed": best, "auto_ended_on": ended, "frontier": totals}


FRONTIER = ("within_timeout", "weighted_slo", "loads", "wall_s")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _per_100(loads: int, served: int) -> str:
    return "-" if served == 0 else f"{100 * loads / served:.1f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def trace_row(r: Mapping[str, Any]) -> list[str]:
    runs = [r["policies"][name] for name in SYSTEMS]
    v, lru, unbounded = runs[0], runs[1], runs[3]
    fixed_name, fixed = targets.best_fixed(r["policies"])
    top = targets.top_unpinned(unbounded)
    if top is None:
        p99 = "-"
    else:
        mine = v["by_priority_unpinned"].get(top, {}).get("latency_s", {}).get("p99")
        floor = unbounded["by_priority_unpinned"][top]["latency_s"]["p99"]
        p99 = f"{top}: {_s(mine)} / {_s(floor)}"
    fair = next(t for t in r["targets"] if t["name"] == "fair")
    return [
        r["policy"],
        r["trace"],
        str(r["requests"]),
        " / ".join(str(run["served_within_timeout"]) for run in runs),
        " / ".join(_pct(run["slo_attainment"]) for run in runs),
        f"{v['weighted_slo'] or 0:.3f} / {fixed:.3f} ({fixed_name.removeprefix('vramd:')})",
        p99,
        f"{v['cold_starts']} / {lru['cold_starts']}",
        f"{v['oom_loads']} ({v['oom_loads_after_ready']}) / {v['failed_oom']}",
        fair["text"].removeprefix("worst "),
        ", ".join(f"**{name}**" for name in missed(r)) or "-",
    ]


def _shares(starved: Mapping[str, Any]) -> list[str]:
    return [_pct(starved["vramd"]), _pct(starved["lru_count"])]


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(
    reports: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], *, per_trace: bool = True
) -> str:
    out: list[str] = []
    if per_trace:
        out += ["## Per trace", ""]
        out += _table(TRACE_COLUMNS, [trace_row(r) for r in reports])
        out += [""]
    n = summary["traces"]
    out += ["## Summary", ""]
    out += _table(
        ("target", "traces met", "of"),
        [[name, str(met), str(n)] for name, met in summary["met"].items()],
    )
    fraction = summary["all_met_fraction"]
    out += ["", f"All {len(targets.NAMES)} targets met on {summary['all_met']} of {n} traces"]
    out[-1] += f" ({_pct(fraction)})." if fraction is not None else "."
    out += ["", "Per case:", ""]
    out += _table(
        ("case", "traces", "all met", "missed"),
        [
            [
                name,
                str(case["traces"]),
                str(case["all_met"]),
                ", ".join(f"{t} {k}" for t, k in case["missed"].items() if k) or "-",
            ]
            for name, case in summary["by_case"].items()
        ],
    )
    if summary.get("by_load"):
        out += ["", "By load (loads per 100 requests served within their timeout):", ""]
        out += _table(
            ("load", "traces", "all met", "vramd", "lru"),
            [
                [
                    load,
                    *(str(row[k]) for k in LOAD_FIELDS[:2]),
                    _per_100(row["vramd_loads"], row["vramd_within_timeout"]),
                    _per_100(row["lru_count_loads"], row["lru_count_within_timeout"]),
                ]
                for load, row in summary["by_load"].items()
            ],
        )
    if summary.get("yielding"):
        y = summary["yielding"]
        out += ["", "The frontier: `auto` and each fixed setting, over every trace:", ""]
        out += _table(
            ("system", "within timeout", "mean weighted SLO", "loads", "replay wall s"),
            [
                [name, f"{row['within_timeout']:.0f}", f"{row['weighted_slo']:.4f}",
                 f"{row['loads']:.0f}", f"{row['wall_s']:.1f}"]
                for name, row in y["frontier"].items()
            ],
        )  # fmt: skip
        best = ", ".join(f"{k} {n}" for k, n in sorted(y["best_fixed"].items()))
        ended = ", ".join(f"{k} {n}" for k, n in sorted(y["auto_ended_on"].items()))
        out += ["", f"Best fixed setting per trace: {best}. `auto` ended on: {ended}."]
    if summary["starved"]:
        out += ["", "Services under `fair`'s bound, largest gap first (at most 20):", ""]
        out += _table(
            ("case", "trace", "service", "requests", "within timeout: vramd", "lru-count"),
            [
                [s["case"], s["trace"], s["service"], str(s["requests"]), *_shares(s)]
                for s in summary["starved"][:20]
            ],
        )
    if summary["misses"]:
        out += ["", "Misses:", ""]
        for miss in summary["misses"]:
            out.append(f"- {miss['case']} {miss['trace']}: {', '.join(miss['missed'])}")
            out += [f"  - {reason}" for reason in miss["why"]]
    if "wall_s" in summary:
        out += ["", f"Sweep wall time: {summary['wall_s']} s."]
    return "\n".join(out) + "\n"
