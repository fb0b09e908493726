"""``python -m service.gpucheck``: run the checks and print the report (or be a child)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from service.devices import NvmlUnavailable, create_probe
from service.errors import ProbeError
from service.gpucheck.checks import (
    ALLOCATORS,
    DEFAULT_SIZES,
    EXIT_CANNOT_RUN,
    EXIT_FAILED,
    EXIT_PASSED,
    SIMULATED,
    CannotRun,
    GpuCheck,
    Report,
)
from service.gpucheck.children import ChildLauncher, child_main, find_allocator
from service.settings import Settings
from service.units import format_size, parse_size

# --- output ----------------------------------------------------------------------------


def print_table(report: Report) -> None:
    gpu = report.gpu
    title = (
        f"vramd GPU check: GPU {gpu['index']} {gpu['name']} "
        f"({format_size(gpu['total'])}), allocator {report.allocator}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("check", "result", "measured", "expected", "detail"):
        table.add_column(column, overflow="fold")
    styles = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
    for check in report.checks:
        table.add_row(
            Text(check.name),
            Text(check.verdict, style=styles[check.verdict]),
            Text(check.measured),
            Text(check.expected),
            Text(check.detail),
        )
    console = Console()
    console.print(table)
    console.print("[green]all checks passed[/]" if report.passed else "[bold red]FAILED[/]")


def run(args: argparse.Namespace) -> int:
    try:
        probe = create_probe("nvml", [args.gpu])
    except ProbeError as exc:
        reason = exc.__cause__ if isinstance(exc.__cause__, NvmlUnavailable) else exc
        return _cannot_run(args, f"no NVIDIA GPU found (NVML: {reason})")
    try:
        allocator = find_allocator(args.allocator)
        device = probe.read({}).devices[0]
        check = GpuCheck(
            probe,
            ChildLauncher(allocator, args.gpu),
            sizes=[parse_size(size) for size in args.sizes],
            tolerance=parse_size(args.tolerance),
            settle_timeout=args.settle_timeout,
        )
        checks = check.run()
    except CannotRun as exc:
        return _cannot_run(args, str(exc))
    finally:
        probe.close()
    gpu = {"index": args.gpu, "name": device.name, "total": device.total, "free": device.free}
    report = Report(gpu=gpu, allocator=allocator, checks=checks)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print_table(report)
    return EXIT_PASSED if report.passed else EXIT_FAILED


def _cannot_run(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"passed": False, "error": message}))
    print(f"gpucheck: {message}", file=sys.stderr)
    return EXIT_CANNOT_RUN


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m service.gpucheck",
        description="Verify NVML attribution, the settle barrier and footprints on a GPU.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (default 0)")
    p.add_argument("--allocator", choices=("auto", *ALLOCATORS, SIMULATED), default="auto")
    p.add_argument(
        "--sizes", nargs="+", default=list(DEFAULT_SIZES), help="allocations to attribute"
    )
    p.add_argument("--tolerance", default="32MiB", help="slack for footprint comparisons")
    p.add_argument(
        "--settle-timeout",
        type=float,
        default=Settings.model_fields["settle_timeout"].default,
        help="seconds the barrier may wait (the daemon's settle_timeout)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--nested", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        return child_main(args.allocator, args.bytes, args.nested)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
