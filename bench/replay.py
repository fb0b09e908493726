"""Replay a trace against vramd's scheduler and the baselines, on a simulated box.

    python -m bench.replay --policy POLICY.yaml --trace TRACE.jsonl \\
        [--bench-data BENCH.yaml] [--policies vramd,vramd:eager,...,lru-count,static] \\
        [--device-total SIZE] [--devices N] [--json OUT] [--markdown OUT]
    python -m bench.replay --live --url http://127.0.0.1:8400 --policy POLICY.yaml \\
        --trace TRACE.jsonl [--speed 10] [--live-duration 180] [--tune] [--json OUT]

Each system runs the whole trace on a virtual clock (no sleeps; an hour of trace takes
seconds): ``vramd`` is the daemon's own scheduler core fed the events the orchestrator
would feed it (``service.replay.vramd``), with ``yielding: auto`` tuned as the daemon
tunes it; ``vramd:<setting>`` holds one fixed setting instead. The others are models of the systems
they are named for (``bench.systems.*``, each documented with what it simplifies). The
figures are defined in ``service.replay.metrics``; ``--json`` writes them all, the tables
show the main ones. ``--live`` drives a running daemon instead (``bench.live``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import targets
from bench.report import markdown, print_report, write_outputs
from bench.systems import FIXED_SYSTEMS, SYSTEMS
from service.policy import load_policy
from service.replay.benchdata import parse_bench_data
from service.replay.harness import RunResult, run_system
from service.replay.setup import Setup, build_setup
from service.replay.trace import TraceRequest, load_trace
from service.units import parse_size

DEFAULT_SYSTEMS = ("vramd", *FIXED_SYSTEMS, "swap-one", "lru-count", "static", "unbounded")


def load_setup(
    policy_path: str | Path,
    bench_path: str | Path | None,
    device_total: int | None = None,
    devices: int | None = None,
) -> Setup:
    policy = load_policy(Path(policy_path).read_text(encoding="utf-8"))
    raw = None
    if bench_path is not None:
        raw = parse_bench_data(Path(bench_path).read_text(encoding="utf-8"))
    return build_setup(policy, raw, device_total=device_total, devices=devices)


def replay(
    setup: Setup, trace: Sequence[TraceRequest], systems: Sequence[str] = DEFAULT_SYSTEMS
) -> dict[str, RunResult]:
    return {name: run_system(SYSTEMS[name], setup, trace) for name in systems}


def build_report(
    setup: Setup,
    trace: Sequence[TraceRequest],
    results: dict[str, RunResult],
    *,
    trace_name: str,
    policy_name: str,
    bench_name: str | None,
) -> dict[str, Any]:
    """The ``--json`` document (its keys are listed in docs/benchmarks.md)."""
    device = setup.policy.device
    report: dict[str, Any] = {
        "trace": trace_name,
        "policy": policy_name,
        "bench_data": bench_name,
        "requests": len(trace),
        "horizon_s": max((r.t for r in trace), default=0.0),
        "device": {
            "count": setup.devices,
            "total_bytes": setup.device_total,
            "plan_bytes": setup.plan_bytes,
            "budget_bytes": device.budget,
            "headroom_bytes": device.headroom,
        },
        "priorities": {name: info.priority for name, info in setup.services.items()},
        "residencies": {name: info.residency.value for name, info in setup.services.items()},
        "policies": {
            name: {**result.summary, "wall_s": round(result.wall_s, 3)}
            for name, result in results.items()
        },
    }
    if "vramd" in results:
        report["tuning"] = [
            {"t": e["t"], **e["data"]} for e in results["vramd"].events if e["kind"] == "tuning"
        ]
    if all(name in results for name in targets.NEEDED):
        report["costs"] = targets.costs(report)
        checked = targets.check(report)
        report["targets"] = [
            {"name": t.name, "value": t.value, "bound": t.bound, "met": t.met, "text": t.text}
            for t in checked
        ]
        report["why_lost"] = targets.why_lost(report, checked)
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n")[0])
    p.add_argument("--policy", required=True, help="vramd policy YAML")
    p.add_argument("--trace", required=True, help="trace JSONL (one request per line)")
    p.add_argument("--bench-data", help="YAML: service -> {load_s, true_peak, unload_s}")
    p.add_argument(
        "--policies",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated systems to compare (default {','.join(DEFAULT_SYSTEMS)})",
    )
    p.add_argument("--device-total", type=parse_size, help="simulated device size, e.g. 26GiB")
    p.add_argument(
        "--devices",
        type=int,
        help="simulated devices of that size (default: 1, or as many as device.gpus lists)",
    )
    p.add_argument("--json", help="write the full report as JSON to this file")
    p.add_argument("--markdown", help="write the tables as Markdown to this file")
    live = p.add_argument_group("live check (bench.live)")
    live.add_argument("--live", action="store_true", help="drive a running vramd instead")
    live.add_argument("--url", default="http://127.0.0.1:8400", help="the daemon's base URL")
    live.add_argument("--speed", type=float, default=10.0, help="time compression of the trace")
    live.add_argument(
        "--live-duration", type=float, default=180.0, help="wall seconds of trace to replay"
    )
    live.add_argument("--api-key", help="bearer key for /v1 (and /api unless --admin-key)")
    live.add_argument("--admin-key", help="bearer key for /api")
    live.add_argument(
        "--tune",
        action="store_true",
        help="then compare a yielding: auto round, live and sim",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.devices is not None and args.devices < 1:
        print("--devices must be at least 1", file=sys.stderr)
        return 2
    setup = load_setup(args.policy, args.bench_data, args.device_total, args.devices)
    trace = load_trace(args.trace)
    if args.live:
        from bench.live import run_live_cli

        return run_live_cli(args, setup, trace)
    systems = [s.strip() for s in args.policies.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        print(f"unknown policies {unknown}; known: {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    results = replay(setup, trace, systems)
    report = build_report(
        setup,
        trace,
        results,
        trace_name=Path(args.trace).name,
        policy_name=Path(args.policy).name,
        bench_name=Path(args.bench_data).name if args.bench_data else None,
    )
    print_report(report)
    write_outputs(report, markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
