"""A sweep of generated traces and policies, each replayed and held to the targets.

    python -m bench.sweep [--policies home-box,inverted,ten-services] [--quick]
        [--protect warm=10m,on-demand=2m] [--json bench/out/sweep.json]
        [--markdown bench/out/sweep.md]

For each policy it generates traces (``bench.traces.generate``) over a grid that varies
what users' boxes vary -- popularity skew (Zipf alpha 0.7-2.1), burstiness (gap CV 1-5),
load (0.3-1.0 requests per second), with the default bursty correlated groups -- each
with its own seed, replays every system on it (``bench.replay``) and checks vramd
against the targets (``bench.targets``). It prints one line of targets per trace, then
the traces where vramd missed one with the reasons the figures give, and writes
everything as JSON. ``--quick`` runs a third of the grid, for a first look.
``--protect`` replaces the residency defaults of ``protect`` for services that do not
set it themselves: how the defaults were tuned (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import targets
from bench.replay import build_report, replay
from bench.report import write_outputs
from bench.sim.benchdata import parse_bench_data
from bench.sim.setup import Setup, build_setup
from bench.sim.trace import TraceRequest
from bench.traces.generate import (
    DEFAULT_GROUPS,
    TraceParams,
    generate,
    models_of_policy,
    parse_groups,
)
from service.domain import Residency
from service.policy import ProtectValue, load_policy, parse_protect

POLICY_DIR = Path(__file__).parent / "policies"
BENCH_DATA = POLICY_DIR / "ten-services.bench.yaml"
DEFAULT_POLICIES = ("home-box", "inverted", "ten-services", "ten-services-tiered")


@dataclass(frozen=True, slots=True)
class Point:
    alpha: float
    cv: float
    rate: float
    seed: int

    @property
    def name(self) -> str:
        return f"a{self.alpha:g}-cv{self.cv:g}-r{self.rate:g}-s{self.seed}"


# Corners and middles of the space, each with its own seed (the seed moves the bursts).
GRID = (
    Point(0.7, 1, 0.3, 11),
    Point(0.7, 5, 1.0, 12),
    Point(1.2, 3, 0.6, 13),
    Point(1.2, 1, 1.0, 14),
    Point(2.1, 5, 0.3, 15),
    Point(2.1, 1, 0.6, 16),
    Point(1.6, 2, 0.8, 17),
    Point(0.9, 4, 0.5, 18),
    Point(1.4, 5, 1.0, 19),
)
QUICK = GRID[::3]


def parse_protect_overrides(text: str) -> dict[Residency, ProtectValue]:
    """``warm=10m,on-demand=2m`` -> {Residency.WARM: 600.0, ...}."""
    out: dict[Residency, ProtectValue] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            residency = Residency(name.strip())
        except ValueError:
            raise ValueError(f"--protect: unknown residency {name!r}") from None
        if residency is Residency.PINNED:
            raise ValueError("--protect: pinned services are never evicted")
        out[residency] = parse_protect(value.strip())
    return out


def setup_with(policy_path: Path, protect: dict[Residency, ProtectValue]) -> Setup:
    """The policy's setup, with ``protect`` defaults replaced where the file sets none."""
    raw = policy_path.read_text(encoding="utf-8")
    data = yaml.safe_load(raw)
    written = {
        name
        for name, svc in data.get("services", {}).items()
        if "protect" in svc or "protect" in (data.get("defaults") or {})
    }
    policy = load_policy(raw)
    for name, service in policy.services.items():
        if service.residency in protect and name not in written:
            service.protect = protect[service.residency]
    return build_setup(policy, parse_bench_data(BENCH_DATA.read_text(encoding="utf-8")))


def trace_of(policy_path: Path, point: Point, duration: float) -> list[TraceRequest]:
    """The generated trace of ``point`` for the policy's services (popularity in order)."""
    models = models_of_policy(policy_path.read_text(encoding="utf-8"))
    params = TraceParams(
        alpha=point.alpha, cv=point.cv, seed=point.seed, duration=duration, rate=point.rate
    )
    groups = parse_groups(DEFAULT_GROUPS, [m.service for m in models])
    return generate(models, params, groups)


def run_point(
    policy_path: Path, point: Point, duration: float, protect: dict[Residency, ProtectValue]
) -> dict[str, Any]:
    trace = trace_of(policy_path, point, duration)
    setup = setup_with(policy_path, protect)
    results = replay(setup, trace, targets.NEEDED)
    report = build_report(
        setup,
        trace,
        results,
        trace_name=point.name,
        policy_name=policy_path.name,
        bench_name=BENCH_DATA.name,
    )
    return report


def line(report: dict[str, Any]) -> str:
    cells = [f"{'ok ' if t['met'] else 'MISS'} {t['name']} {t['text']}" for t in report["targets"]]
    return f"{report['policy']:<26} {report['trace']:<24} " + " | ".join(cells)


def markdown(reports: Sequence[dict[str, Any]]) -> str:
    names = [t["name"] for t in reports[0]["targets"]] if reports else []
    out = ["| policy | trace | " + " | ".join(names) + " |"]
    out.append("|---|---|" + "|".join("---" for _ in names) + "|")
    for r in reports:
        cells = [("" if t["met"] else "**miss** ") + t["text"] for t in r["targets"]]
        out.append(f"| {r['policy']} | {r['trace']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__.split("\n")[0])
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="names in bench/policies")
    p.add_argument("--quick", action="store_true", help="a third of the grid")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of each trace")
    p.add_argument("--protect", default="", help="protect defaults, e.g. warm=5m,on-demand=1m")
    p.add_argument("--json", help="write every report and its targets to this file")
    p.add_argument("--markdown", help="write the targets table as Markdown to this file")
    args = p.parse_args(argv)
    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    missing = [name for name in policies if not (POLICY_DIR / f"{name}.yaml").exists()]
    if missing:
        print(f"no such policies in {POLICY_DIR}: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        protect = parse_protect_overrides(args.protect)
    except ValueError as exc:
        p.error(str(exc))
    reports = []
    for name in policies:
        for point in QUICK if args.quick else GRID:
            report = run_point(POLICY_DIR / f"{name}.yaml", point, args.duration, protect)
            reports.append(report)
            print(line(report), flush=True)
    lost = [r for r in reports if r["why_lost"]]
    met = sum(1 for r in reports for t in r["targets"] if t["met"])
    total = sum(len(r["targets"]) for r in reports)
    print(f"\n{met}/{total} targets met over {len(reports)} traces")
    for r in lost:
        print(f"- {r['policy']} {r['trace']}:")
        for reason in r["why_lost"]:
            print(f"    {reason}")
    write_outputs(reports, markdown(reports), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
