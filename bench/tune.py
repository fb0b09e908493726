"""How the ``protect`` defaults were chosen: the sweep's traces, one vramd run per choice.

    python -m bench.tune [--warm 2m,5m,10m,30m] [--on-demand 0,30s,1m,2m,5m] [--quick]
        [--policies 12gib,24gib/home-box,...] [--jobs N] [--json bench/out/tune.json]

For every trace of ``bench.sweep`` (each case, each of its points) the baselines run
once; then vramd runs once per pair of defaults (warm, on-demand), each pair applied to
the services that do not set ``protect`` themselves. It prints, per pair, how many
targets were met over all traces, on how many traces all of them were, the misses per
target, and the figures behind them: requests served within timeout, mean SLO
attainment and cold starts. ``--jobs`` tunes that many traces at once (default: one per
CPU). docs/benchmarks.md explains the choice it led to.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import targets
from bench.boxes import Case, Point, select
from bench.replay import build_report, replay
from bench.sweep import case_setup, run_all, tasks_of, trace_of
from bench.systems import FIXED_SYSTEMS
from service.domain import Residency
from service.policy import ProtectValue, parse_protect
from service.units import format_duration

Pair = tuple[ProtectValue, ProtectValue]


def _choices(text: str) -> list[ProtectValue]:
    return [parse_protect(part.strip()) for part in text.split(",") if part.strip()]


def _label(value: float | str) -> str:
    return str(value) if isinstance(value, str) else format_duration(value) if value else "0"


def tune_trace(
    case: Case, point: Point, duration: float, pairs: Sequence[Pair]
) -> list[dict[str, Any]]:
    """One trace: the baselines once, vramd (auto and each fixed setting) once per pair; per
    pair its targets and figures."""
    trace = trace_of(case, point, duration)
    baselines = replay(case_setup(case, {}), trace, ("lru-count", "static", "unbounded"))
    out = []
    for warm, on_demand in pairs:
        setup = case_setup(case, {Residency.WARM: warm, Residency.ON_DEMAND: on_demand})
        results = {**replay(setup, trace, ("vramd", *FIXED_SYSTEMS)), **baselines}
        report = build_report(
            setup, trace, results, trace_name=point.name, policy_name=case.name, bench_name=None
        )
        v = report["policies"]["vramd"]
        out.append(
            {
                "case": case.name,
                "trace": point.name,
                "targets": {t.name: [t.met, t.text] for t in targets.check(report)},
                "served_within_timeout": v["served_within_timeout"],
                "slo": v["slo_attainment"] or 0.0,
                "cold_starts": v["cold_starts"],
            }
        )
    return out


def _summary(
    warm: ProtectValue, on_demand: ProtectValue, traces: list[dict[str, Any]]
) -> dict[str, Any]:
    """One pair's row: how many targets it met over the traces, and which it missed."""
    checks = [ok for t in traces for ok, _ in t["targets"].values()]
    misses: dict[str, int] = {}
    for t in traces:
        for name, (ok, _) in t["targets"].items():
            if not ok:
                misses[name] = misses.get(name, 0) + 1
    return {
        "warm": warm,
        "on_demand": on_demand,
        "traces": traces,
        "met": sum(checks),
        "targets": len(checks),
        "all_met": sum(all(ok for ok, _ in t["targets"].values()) for t in traces),
        "served_within_timeout": sum(t["served_within_timeout"] for t in traces),
        "mean_slo": sum(t["slo"] for t in traces) / len(traces) if traces else 0.0,
        "cold_starts": sum(t["cold_starts"] for t in traces),
        "misses": misses,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tune", description=__doc__.split("\n")[0])
    p.add_argument("--warm", default="2m,5m,10m,30m", help="warm protect defaults to try")
    p.add_argument("--on-demand", default="0,30s,1m,2m,5m", help="on-demand defaults to try")
    p.add_argument("--policies", default="", help="cases, boxes or mixes (default: all)")
    p.add_argument("--quick", action="store_true", help="every fifth trace of the sweep")
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="traces at once")
    p.add_argument("--json", help="write the per-pair figures to this file")
    args = p.parse_args(argv)
    try:
        pairs: list[Pair] = list(itertools.product(_choices(args.warm), _choices(args.on_demand)))
        cases = select(args.policies)
    except ValueError as exc:
        p.error(str(exc))
    jobs = [
        (case, point, args.duration, pairs) for case, point in tasks_of(cases, quick=args.quick)
    ]
    per_pair: list[list[dict[str, Any]]] = [[] for _ in pairs]
    for done, results in enumerate(run_all(tune_trace, jobs, args.jobs), start=1):
        for traces, result in zip(per_pair, results, strict=True):
            traces.append(result)
        print(f"{done}/{len(jobs)} {results[0]['case']} {results[0]['trace']}", file=sys.stderr)
    print(
        f"{'warm':>6} {'on-demand':>9} {'targets met':>12} {'all met':>8} {'served':>8} "
        f"{'SLO':>7} {'cold':>6}  misses"
    )
    rows = [
        _summary(warm, on_demand, traces)
        for (warm, on_demand), traces in zip(pairs, per_pair, strict=True)
    ]
    for row in rows:
        print(
            f"{_label(row['warm']):>6} {_label(row['on_demand']):>9} "
            f"{row['met']:>5}/{row['targets']:<6} {row['all_met']:>4}/{len(row['traces']):<3} "
            f"{row['served_within_timeout']:>8} {row['mean_slo']:>7.1%} {row['cold_starts']:>6}  "
            + (", ".join(f"{k} {v}" for k, v in sorted(row["misses"].items())) or "-")
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
