"""How the ``protect`` defaults were chosen: the sweep's traces, one vramd run per choice.

    python -m bench.tune [--warm 2m,5m,10m,30m] [--on-demand 0,30s,1m,2m,5m] [--quick]
        [--policies home-box,inverted,...] [--json bench/out/tune.json]

For every trace of ``bench.sweep`` (each policy, each grid point) the baselines run once;
then vramd runs once per pair of defaults (warm, on-demand), each pair applied to the
services that do not set ``protect`` themselves. It prints, per pair, how many targets
were met over all traces and the figures behind them: requests served, SLO attainment,
cold starts, and the top priority's worst p99 against its bound. docs/benchmarks.md
explains the choice it led to.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import targets
from bench.replay import build_report, replay
from bench.sweep import DEFAULT_POLICIES, GRID, POLICY_DIR, QUICK, Point, setup_with, trace_of
from service.domain import Residency
from service.policy import ProtectValue, parse_protect
from service.units import format_duration


def _choices(text: str) -> list[ProtectValue]:
    return [parse_protect(part.strip()) for part in text.split(",") if part.strip()]


def _label(value: float | str) -> str:
    return str(value) if isinstance(value, str) else format_duration(value) if value else "0"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tune", description=__doc__.split("\n")[0])
    p.add_argument("--warm", default="2m,5m,10m,30m", help="warm protect defaults to try")
    p.add_argument("--on-demand", default="0,30s,1m,2m,5m", help="on-demand defaults to try")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    p.add_argument("--quick", action="store_true", help="a third of the grid")
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--json", help="write the per-pair figures to this file")
    args = p.parse_args(argv)
    try:
        pairs = list(itertools.product(_choices(args.warm), _choices(args.on_demand)))
    except ValueError as exc:
        p.error(str(exc))
    points: Sequence[Point] = QUICK if args.quick else GRID
    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    totals: dict[tuple[Any, Any], dict[str, Any]] = {
        pair: {
            "met": 0,
            "targets": 0,
            "served": 0,
            "slo": [],
            "cold": 0,
            "misses": {},
            "traces": [],
        }
        for pair in pairs
    }
    for name in policies:
        path = POLICY_DIR / f"{name}.yaml"
        for point in points:
            trace = trace_of(path, point, args.duration)
            base_setup = setup_with(path, {})
            baselines = replay(base_setup, trace, ("lru-count", "static", "unbounded"))
            for pair in pairs:
                protect = {Residency.WARM: pair[0], Residency.ON_DEMAND: pair[1]}
                setup = setup_with(path, protect)
                results = {**replay(setup, trace, ("vramd",)), **baselines}
                report = build_report(
                    setup,
                    trace,
                    results,
                    trace_name=point.name,
                    policy_name=path.name,
                    bench_name=None,
                )
                checked = targets.check(report)
                total = totals[pair]
                total["met"] += sum(t.met for t in checked)
                total["targets"] += len(checked)
                v = report["policies"]["vramd"]
                total["served"] += v["served_within_timeout"]
                total["slo"].append(v["slo_attainment"] or 0.0)
                total["cold"] += v["cold_starts"]
                for t in checked:
                    if not t.met:
                        total["misses"][t.name] = total["misses"].get(t.name, 0) + 1
                total["traces"].append(
                    {
                        "policy": name,
                        "trace": point.name,
                        "targets": {t.name: [t.met, t.text] for t in checked},
                    }
                )
            print(f"{name} {point.name} done", file=sys.stderr, flush=True)
    print(
        f"{'warm':>6} {'on-demand':>9} {'targets met':>12} {'served':>8} {'SLO':>7} "
        f"{'cold':>6}  misses"
    )
    rows = []
    for (warm, on_demand), total in totals.items():
        slo = sum(total["slo"]) / len(total["slo"]) if total["slo"] else 0.0
        misses = ", ".join(f"{k} {v}" for k, v in sorted(total["misses"].items()))
        print(
            f"{_label(warm):>6} {_label(on_demand):>9} "
            f"{total['met']:>5}/{total['targets']:<6} {total['served']:>8} {slo:>7.1%} "
            f"{total['cold']:>6}  {misses or '-'}"
        )
        rows.append(
            {
                "warm": warm,
                "on_demand": on_demand,
                "met": total["met"],
                "targets": total["targets"],
                "served": total["served"],
                "mean_slo": slo,
                "cold_starts": total["cold"],
                "misses": total["misses"],
                "traces": total["traces"],
            }
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
