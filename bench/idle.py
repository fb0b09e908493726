"""What an idle vramd costs the machine: CPU of the daemon process alone, and its memory.

    python -m bench.idle [--policies demo,twenty] [--settle 5] [--duration 30] [--json OUT]

For each policy it starts ``vramd serve`` as a subprocess (``bench.processes``), waits
until every pinned and preloaded service is ready, lets it settle, then reads the
daemon's CPU time (user + system, psutil ``cpu_times``) at the start and the end of
``--duration`` seconds in which nobody sends a request. The figure is that difference as
a percentage of one core; the runtimes vramd started are separate processes, counted
apart (``runtimes_cpu_pct``), since an idle runtime's own cost is not vramd's. RSS and
USS are read at the end.

Policies:

- ``demo``: ``config/demo.yaml`` as shipped (four services, two of them running).
- ``twenty``: twenty demo-runtime services on the host backend: three pinned, two warm
  and preloaded (so five running), fifteen on demand, ``device.sample_interval`` left at
  its default. The idle cost of a daemon grows with what it watches; this is a busy but
  plausible policy.

``--repeat`` measures each policy that many times (a new daemon each time) to show the
noise. Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from bench.processes import REPO_ROOT, demo_command, policy_text, running_vramd
from bench.report import markdown_table, rich_table, write_outputs
from service.domain import Residency
from service.policy import load_policy
from service.units import MIB

COLUMNS = ("policy", "services", "running", "run", "CPU % of a core", "runtimes CPU %", "RSS MiB")


def twenty_services() -> str:
    services: dict[str, dict[str, Any]] = {}
    for i in range(20):
        residency = "pinned" if i < 3 else "warm" if i < 5 else "on-demand"
        kind = "embedding" if i % 4 == 3 else "chat"
        spec: dict[str, Any] = {
            "kind": kind,
            "models": [f"model-{i:02d}"],
            "command": demo_command("--memory", "8MiB"),
            "memory": {"estimate": "48MiB"},
            "residency": residency,
        }
        if residency == "warm":
            spec["preload"] = True
        services[f"svc-{i:02d}"] = spec
    return policy_text(services, budget="2GiB", sample_interval=None)


POLICIES: dict[str, Callable[[], Path | str]] = {
    "demo": lambda: REPO_ROOT / "config" / "demo.yaml",
    "twenty": twenty_services,
}


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def measure(name: str, *, settle: float, duration: float) -> dict[str, Any]:
    source = POLICIES[name]()
    policy = load_policy(source.read_text(encoding="utf-8") if isinstance(source, Path) else source)
    wanted = [
        svc_name
        for svc_name, svc in policy.services.items()
        if svc.residency is Residency.PINNED or (svc.residency is Residency.WARM and svc.preload)
    ]
    with running_vramd(source) as vramd:
        vramd.wait_ready(wanted)
        time.sleep(settle)
        daemon = psutil.Process(vramd.proc.pid)
        runtimes = daemon.children(recursive=True)
        started = time.monotonic()
        own = cpu_seconds(daemon)
        theirs = sum(_cpu_or_zero(p) for p in runtimes)
        time.sleep(duration)
        elapsed = time.monotonic() - started
        own = cpu_seconds(daemon) - own
        theirs = sum(_cpu_or_zero(p) for p in runtimes) - theirs
        memory = daemon.memory_full_info()
        running = sum(1 for s in vramd.services() if s["state"] == "ready")
    return {
        "policy": name,
        "services": len(policy.services),
        "running": running,
        "sample_interval_s": policy.device.sample_interval,
        "seconds": round(elapsed, 1),
        "cpu_pct": 100 * own / elapsed,
        "runtimes_cpu_pct": 100 * theirs / elapsed,
        "rss_mib": memory.rss / MIB,
        "uss_mib": memory.uss / MIB,
    }


def _cpu_or_zero(proc: psutil.Process) -> float:
    try:
        return cpu_seconds(proc)
    except psutil.Error:
        return 0.0


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    return [
        [
            run["policy"],
            str(run["services"]),
            str(run["running"]),
            str(run["run"]),
            f"{run['cpu_pct']:.2f}",
            f"{run['runtimes_cpu_pct']:.2f}",
            f"{run['rss_mib']:.0f}",
        ]
        for run in report["runs"]
    ]


def caption(report: dict[str, Any]) -> str:
    setup = report["setup"]
    return (
        f"bench.idle: the idle daemon over {setup['duration_s']:g} s after "
        f"{setup['settle_s']:g} s to settle, on {setup['cpus']} CPUs, load "
        f"{setup['loadavg_before'][0]:.2f} before / {setup['loadavg_after'][0]:.2f} after"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [f"**{caption(report)}**", "", *markdown_table(COLUMNS, table_rows(report))]
    return "\n".join(lines) + "\n"


def print_report(report: dict[str, Any]) -> None:
    console = Console() if sys.stdout.isatty() else Console(width=120)
    console.print(rich_table(caption(report), COLUMNS, table_rows(report)))


def _policies(text: str) -> list[str]:
    names = [part for part in text.split(",") if part]
    if bad := set(names) - set(POLICIES):
        raise argparse.ArgumentTypeError(f"unknown {sorted(bad)}; choose from {list(POLICIES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.idle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--policies", type=_policies, default=list(POLICIES))
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds measured")
    parser.add_argument("--repeat", type=int, default=1, help="daemons per policy")
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--markdown", help="write the table to this file")
    args = parser.parse_args(argv)
    loadavg_before = os.getloadavg()
    runs = []
    for run in range(1, args.repeat + 1):
        for name in args.policies:
            runs.append({"run": run, **measure(name, settle=args.settle, duration=args.duration)})
    report = {
        "setup": {
            "settle_s": args.settle,
            "duration_s": args.duration,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "processes_on_machine": len(psutil.pids()),
            "loadavg_before": loadavg_before,
            "loadavg_after": os.getloadavg(),
        },
        "runs": runs,
    }
    print_report(report)
    write_outputs(report, markdown(report), json_path=args.json, markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
