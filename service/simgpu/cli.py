"""``python -m service.simgpu``: make simulated GPUs, hold memory on them, look at them."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from service.simgpu.cuda import CudaError, CudaProcess
from service.simgpu.state import ENV, ScriptedError, State, StateError, StateFile, new_state
from service.units import format_size, parse_size


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _blocks(text: str) -> list[int | None]:
    """``4GiB`` (every device) or ``4GiB,none`` (one per device)."""
    return [None if part.strip() in ("none", "-") else _size(part) for part in text.split(",")]


def _order(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: NVML indexes, e.g. 1,0") from None


def init(args: argparse.Namespace) -> int:
    blocks = args.max_block
    if blocks is not None and len(blocks) == 1:
        blocks = blocks * len(args.gpu)
    try:
        state = new_state(
            args.gpu,
            reserved=args.reserved,
            release_lag=args.release_lag,
            context_bytes=args.context,
            fastest_first=args.fastest_first,
            max_block=blocks,
        )
    except ValueError as exc:
        print(f"simgpu: {exc}", file=sys.stderr)
        return 2
    Path(args.state).parent.mkdir(parents=True, exist_ok=True)
    StateFile(args.state).write(state)
    print(f"{len(state.devices)} simulated GPU(s) in {args.state}")
    print(f"export {ENV}={Path(args.state).resolve()}")
    return 0


def hold(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        process = CudaProcess(_file(args), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, kind=args.kind)
        process.allocate({args.device: args.bytes})
    except CudaError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"holding {format_size(args.bytes)} on GPU {args.device} (pid {process.pid})", flush=True)
    while not stop.wait(0.5):  # a timeout, so the signal handler always gets to run
        pass
    return 0


def fail(args: argparse.Namespace) -> int:
    from service.simgpu.nvml import error  # imports pynvml: only for this command

    try:
        error(args.error)
    except ValueError as exc:
        print(f"simgpu: {exc}", file=sys.stderr)
        return 2
    with _file(args).update() as state:
        state.errors[args.function] = ScriptedError(args.error, args.calls)
    return 0


def hang(args: argparse.Namespace) -> int:
    with _file(args).update() as state:
        state.hang_until = time.time() + args.seconds
    return 0


def show(args: argparse.Namespace) -> int:
    state = _file(args).current()
    if args.json:
        print(json.dumps(state.to_json(), indent=2))
        return 0
    print(describe(state))
    return 0


def describe(state: State, now: float | None = None) -> str:
    """The state as an operator reads it: devices, then who holds what."""
    now = time.time() if now is None else now
    lines = [f"release lag {state.release_lag:g}s, context {format_size(state.context_bytes)}"]
    lines.append(f"CUDA order without PCI_BUS_ID (fastest first): {state.fastest_first}")
    for index, device in enumerate(state.devices):
        block = (
            "" if device.max_block is None else f", largest block {format_size(device.max_block)}"
        )
        lines.append(
            f"GPU {index} {device.name} [{device.pci_bus_id}]: total {format_size(device.total)}, "
            f"reserved {format_size(device.reserved)}, used {format_size(state.used(index))}, "
            f"free {format_size(state.free(index))}{block}"
        )
    for alloc in state.allocations:
        what = "context" if alloc.context else alloc.kind
        dying = ""
        if alloc.died_at is not None:
            left = alloc.died_at + state.release_lag - now
            dying = f" (exited; released in {max(0.0, left):.1f}s)"
        lines.append(
            f"  pid {alloc.pid} GPU {alloc.device}: {format_size(alloc.bytes)} {what}{dying}"
        )
    for function, scripted in state.errors.items():
        lines.append(
            f"  scripted: {function} raises {scripted.error} {scripted.calls} more time(s)"
        )
    return "\n".join(lines)


def _file(args: argparse.Namespace) -> StateFile:
    return StateFile(args.state) if args.state else StateFile.from_env()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m service.simgpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = p.add_subparsers(dest="command", required=True)
    make = commands.add_parser("init", help="write a fresh state")
    make.add_argument("--state", required=True, help="the state file to write")
    make.add_argument("--gpu", type=_size, action="append", required=True, help="a GPU's total")
    make.add_argument("--reserved", type=_size, default=0, help="the driver's reserve per GPU")
    make.add_argument("--release-lag", type=float, default=0.5, help="seconds (default 0.5)")
    make.add_argument("--context", type=_size, default=parse_size("16MiB"), help="per context")
    make.add_argument("--fastest-first", type=_order, help="CUDA's default order, e.g. 1,0")
    make.add_argument("--max-block", type=_blocks, help="largest free block when shared")
    make.set_defaults(run=init)
    keep = commands.add_parser("hold", help="hold memory until killed (a foreign process)")
    keep.add_argument("--device", type=int, required=True, help="NVML index")
    keep.add_argument("--bytes", type=_size, required=True)
    keep.add_argument("--kind", choices=("compute", "graphics"), default="compute")
    keep.set_defaults(run=hold)
    script = commands.add_parser("fail", help="make the next calls of an NVML function fail")
    script.add_argument("--function", required=True, help="e.g. nvmlDeviceGetMemoryInfo")
    script.add_argument("--error", required=True, help="e.g. GPU_IS_LOST, UNKNOWN")
    script.add_argument("--calls", type=int, default=1)
    script.set_defaults(run=fail)
    stall = commands.add_parser("hang", help="make every NVML call block for a while")
    stall.add_argument("--seconds", type=float, required=True)
    stall.set_defaults(run=hang)
    look = commands.add_parser("show", help="print the state")
    look.add_argument("--json", action="store_true")
    look.set_defaults(run=show)
    for sub in (keep, script, stall, look):
        sub.add_argument("--state", help=f"the state file (default: ${ENV})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """    python -m service.simgpu init --state /tmp/gpus.json --gpu 24GiB --gpu 24GiB \
            [--reserved 512MiB] [--release-lag 0.5] [--context 16MiB] \
            [--fastest-first 1,0] [--max-block 4GiB | --max-block 4GiB,none]
        export VRAMD_SIMULATED_GPUS=/tmp/gpus.json
        python -m service.simgpu hold --device 0 --bytes 2GiB    # a foreign process, until killed
        python -m service.simgpu fail --function nvmlDeviceGetMemoryInfo --error GPU_IS_LOST
        python -m service.simgpu hang --seconds 10   # every NVML call blocks until then
        python -m service.simgpu show [--json]

    Every command but ``init`` finds the state through ``--state`` or ``VRAMD_SIMULATED_GPUS``.
    ``hold --device`` is an NVML index (PCI order); it prints one line once the memory is
    held and keeps it until SIGTERM, SIGINT or SIGKILL, and exits 1 with CUDA's
    out-of-memory line when it does not fit.
    """
    args = parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except StateError as exc:
        print(f"simgpu: {exc}", file=sys.stderr)
        return 2
    return code
