"""A sweep of generated traces over boxes and priority mixes, each held to the targets.

    python -m bench.sweep [--policies 12gib,24gib/home-box,equal,...] [--quick]
        [--jobs N] [--duration 3600] [--protect warm=10m,on-demand=2m]
        [--json bench/out/sweep.json] [--markdown bench/out/sweep.md]

The cases are the priority mixes of every box (``bench.boxes``: 12, 24 and 48 GiB
cards and a box of two 24 GiB cards; popular-below, tiered, equal and inverted, plus
the 24 GiB box's committed policies). Each case has its own trace points over Zipf
alpha 0.6-2.1, gap CV 1-5 and the box's quiet, busy and saturating rates, each with its
own seed. For each trace it generates the requests (``bench.traces.generate``), replays
vramd and the baselines the targets need (``bench.replay``) and checks vramd against
the targets (``bench.targets``). It prints one line of targets per trace, then per
target how many traces met it, how many met all of them, and the reasons the figures
give for every miss; ``--json`` writes every report (per-service shares included) and
the summary, ``--markdown`` the tables. ``--quick`` runs every fifth trace, for
iteration. ``--jobs`` replays that many traces at once (default: one per CPU); the
results do not depend on it. ``--protect`` replaces the residency defaults of
``protect`` for services that do not set it themselves (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bench import targets
from bench.boxes import POLICY_DIR, Case, Point, points, select
from bench.replay import build_report, replay
from bench.report import write_outputs
from bench.sweep_tables import line, markdown, summarize
from bench.traces.generate import TraceParams, generate, models_of_policy, parse_groups
from service.domain import Residency
from service.policy import ProtectValue, load_policy, parse_protect
from service.replay.benchdata import parse_bench_data
from service.replay.setup import Setup, build_setup
from service.replay.trace import TraceRequest

BENCH_DATA = POLICY_DIR / "ten-services.bench.yaml"
QUICK_EVERY = 5
# A box's three rates, in order (bench.boxes.Box.rates).
LOADS = ("quiet", "busy", "saturating")

Task = tuple[Case, Point]
R = TypeVar("R")


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


def setup_of(policy_text: str, bench_text: str, protect: dict[Residency, ProtectValue]) -> Setup:
    """The policy's setup, with ``protect`` defaults replaced where the policy sets none."""
    data = yaml.safe_load(policy_text)
    written = {
        name
        for name, svc in data.get("services", {}).items()
        if "protect" in svc or "protect" in (data.get("defaults") or {})
    }
    policy = load_policy(policy_text)
    for name, service in policy.services.items():
        if service.residency in protect and name not in written:
            service.protect = protect[service.residency]
    return build_setup(policy, parse_bench_data(bench_text))


def setup_with(
    policy_path: Path, protect: dict[Residency, ProtectValue], bench_path: Path = BENCH_DATA
) -> Setup:
    """``setup_of`` for policy and bench data files (the 24 GiB box's by default)."""
    return setup_of(
        policy_path.read_text(encoding="utf-8"), bench_path.read_text(encoding="utf-8"), protect
    )


def case_setup(case: Case, protect: dict[Residency, ProtectValue]) -> Setup:
    return setup_of(case.policy_text(), case.box.read(case.box.bench), protect)


def trace_of(case: Case, point: Point, duration: float) -> list[TraceRequest]:
    """The generated trace of ``point`` for the case's services (popularity in order)."""
    models = models_of_policy(case.policy_text())
    params = TraceParams(
        alpha=point.alpha, cv=point.cv, seed=point.seed, duration=duration, rate=point.rate
    )
    groups = parse_groups(case.groups(), [m.service for m in models])
    return generate(models, params, groups)


def tasks_of(cases: Sequence[Case], *, quick: bool) -> list[Task]:
    """Every (case, point) in order; every ``QUICK_EVERY``-th with ``quick``."""
    tasks = [(case, point) for case in cases for point in points(case)]
    return tasks[::QUICK_EVERY] if quick else tasks


def run_point(
    case: Case, point: Point, duration: float, protect: dict[Residency, ProtectValue]
) -> dict[str, Any]:
    trace = trace_of(case, point, duration)
    setup = case_setup(case, protect)
    results = replay(setup, trace, targets.NEEDED)
    report = build_report(
        setup,
        trace,
        results,
        trace_name=point.name,
        policy_name=case.name,
        bench_name=case.box.bench,
    )
    load = LOADS[case.box.rates.index(point.rate)]
    return {"case": case.name, "box": case.box.name, "mix": case.mix, "load": load, **report}


def run_all(fn: Callable[..., R], jobs: Sequence[tuple[Any, ...]], workers: int) -> Iterator[R]:
    """``fn(*job)`` for every job, in order; ``workers`` processes at once (1: in this one)."""
    if workers <= 1:
        for job in jobs:
            yield fn(*job)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        for future in futures:
            yield future.result()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__.split("\n")[0])
    p.add_argument(
        "--policies",
        default="",
        help="cases, boxes, mixes or committed policies, comma-separated (default: all)",
    )
    p.add_argument("--quick", action="store_true", help=f"every {QUICK_EVERY}th trace")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="traces at once")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of each trace")
    p.add_argument("--protect", default="", help="protect defaults, e.g. warm=5m,on-demand=1m")
    p.add_argument("--json", help="write every report, its targets and the summary here")
    p.add_argument("--markdown", help="write the tables as Markdown to this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    try:
        cases = select(args.policies)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        protect = parse_protect_overrides(args.protect)
    except ValueError as exc:
        p.error(str(exc))
    started = time.perf_counter()
    jobs = [
        (case, point, args.duration, protect) for case, point in tasks_of(cases, quick=args.quick)
    ]
    reports = []
    for report in run_all(run_point, jobs, args.jobs):
        reports.append(report)
        print(line(report), flush=True)
    summary = summarize(reports)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    print()
    print(markdown(reports, summary, per_trace=False), end="")
    write_outputs(
        {"summary": summary, "reports": reports},
        markdown(reports, summary),
        json_path=args.json,
        markdown_path=args.markdown,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
