"""Check vramd's view of a real NVIDIA GPU: ``python -m service.gpucheck [--json]``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from service.clock import SystemClock
from service.devices import DeviceProbe
from service.domain import DeviceSnapshot, ProbeReading
from service.settings import Settings
from service.supervisor import wait_settled
from service.units import format_duration, format_size, parse_size

MiB = 2**20
ALLOCATORS = ("torch", "cupy")
SIMULATED, SIMULATED_ENV = "simulated", "VRAMD_SIMULATED_GPUS"  # service.simgpu
DEFAULT_SIZES = ("256MiB", "1GiB")
EXIT_PASSED, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2


class CannotRun(Exception):
    """The checks cannot run here at all (exit 2), as opposed to a check that failed."""


@dataclass(frozen=True)
class CheckResult:
    """One row of the report; ``ok`` is None for a check that was skipped."""

    name: str
    ok: bool | None
    measured: str
    expected: str
    detail: str = ""
    data: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "SKIP" if self.ok is None else "PASS" if self.ok else "FAIL"


@dataclass(frozen=True)
class Report:
    gpu: dict[str, Any]
    allocator: str
    checks: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(check.ok is not False for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "gpu": self.gpu,
            "allocator": self.allocator,
            "checks": [asdict(check) | {"verdict": check.verdict} for check in self.checks],
        }


class Child(Protocol):
    """A running allocation: ``pid`` is what vramd would be told (the group leader),
    ``holder`` the process that holds the memory (the same, unless nested)."""

    @property
    def pid(self) -> int: ...

    @property
    def holder(self) -> int: ...

    def kill(self) -> None:
        """SIGKILL the whole process group (as the supervisor's last resort does)."""
        ...


class Launcher(Protocol):
    """Starts children that hold ``nbytes`` on the GPU under test (plus a CUDA context)."""

    @property
    def allocator(self) -> str: ...

    def start(self, nbytes: int, *, nested: bool = False) -> Child: ...


# --- the checks ------------------------------------------------------------------------


@dataclass
class GpuCheck:
    """Runs the checks against ``probe`` (one GPU selected) with children from ``launcher``.

    ``tolerance`` is the absolute slack in bytes for comparisons of footprints;
    ``settle_timeout`` the barrier's limit, the daemon's ``settle_timeout`` by default.

    vramd's memory arithmetic stands on three things NVML must get right on *this* machine,
    driver and container setup: which process holds how much (per-pid ``usedGpuMemory``),
    that a stopped process's memory comes back (the settle barrier waits on it), and that
    memory vramd did not start shows up as foreign. The unit tests prove the code against a
    scripted NVML; this proves the machine. It starts child processes that allocate known
    amounts with PyTorch (or CuPy), reads them through the same ``NvmlProbe`` and the same
    ``wait_settled`` barrier the daemon uses, and prints one row per check:

        context        a child with only a CUDA context is listed under its own pid
        attribution N  the child's footprint is its allocation plus that context
        device used N  the device's ``used`` rose by the footprint (nothing unattributed)
        process tree   memory held by a grandchild counts for the instance's root pid
        foreign        memory of a process vramd was not told about is foreign, not managed
        settle         after SIGKILL the pids leave NVML's list within the settle timeout,
                       and the device's free memory comes back

    With ``VRAMD_SIMULATED_GPUS`` set it checks simulated GPUs (``service.simgpu``) the same
    way, its children allocating there instead of through torch or cupy.

    Exit status: 0 every check passed, 1 a check failed, 2 the checks could not run (no
    NVIDIA GPU, or neither torch nor cupy installed). ``--json`` prints the same report as
    JSON. A failing ``context`` row inside a container usually means NVML reports host pids
    that the container cannot see: run it with ``pid: host`` (docs/deployment.md).

    Children run as ``python -m service.gpucheck --child ...`` in their own process group;
    each prints one JSON line once its allocation is done and holds it until its stdin
    closes or it is killed.

    Nothing in the daemon imports this package.
    """

    probe: DeviceProbe
    launcher: Launcher
    sizes: Sequence[int] = tuple(parse_size(size) for size in DEFAULT_SIZES)
    tolerance: int = 32 * MiB
    settle_timeout: float = Settings.model_fields["settle_timeout"].default
    monotonic: Callable[[], float] = time.monotonic
    results: list[CheckResult] = field(default_factory=list, init=False)
    _settle_times: list[float] = field(default_factory=list, init=False)
    _settle_failures: list[str] = field(default_factory=list, init=False)

    def run(self) -> tuple[CheckResult, ...]:
        baseline = self._check_context()
        if baseline is not None:
            for nbytes in self.sizes:
                self._check_size(nbytes, baseline)
            self._check_tree_and_foreign(baseline)
            self._report_settle()
        return tuple(self.results)

    def _add(self, result: CheckResult) -> None:
        self.results.append(result)

    def _device(self, reading: ProbeReading) -> DeviceSnapshot:
        return reading.devices[0]

    def _read(self, **instances: int) -> ProbeReading:
        return self.probe.read(instances)

    @contextmanager
    def _child(self, nbytes: int, *, nested: bool = False) -> Iterator[Child]:
        child = self.launcher.start(nbytes, nested=nested)
        try:
            yield child
        finally:
            child.kill()

    def _within(self, measured: int, expected: int) -> bool:
        return abs(measured - expected) <= self.tolerance

    def _check_context(self) -> int | None:
        """A context-only child; its footprint is the baseline the other checks add to."""
        with self._child(0) as child:
            reading = self._read(ctx=child.pid)
            footprint = reading.instances["ctx"].device_bytes
            self._settle(child, "context")
        ok = footprint > 0
        detail = "CUDA context plus the allocator's first block"
        if not ok:
            detail = (
                f"NVML does not list pid {child.pid} as holding memory"
                + (f" ({reading.degraded})" if reading.degraded else "")
                + "; in a container, NVML reports host pids: run it with pid: host"
            )
        self._add(
            CheckResult(
                "context",
                ok,
                format_size(footprint),
                "> 0",
                detail,
                {"footprint_bytes": footprint},
            )
        )
        return footprint if ok else None

    def _check_size(self, nbytes: int, baseline: int) -> None:
        label = format_size(nbytes)
        before = self._device(self._read())
        if nbytes + baseline + self.tolerance > before.free:
            reason = f"needs {format_size(nbytes + baseline)}, {format_size(before.free)} free"
            self._add(CheckResult(f"attribution {label}", None, "-", "-", reason))
            return
        with self._child(nbytes) as child:
            reading = self._read(alloc=child.pid)
            footprint = reading.instances["alloc"].device_bytes
            after = self._device(reading)
            self._settle(child, f"attribution {label}")
        expected = baseline + nbytes
        self._add(
            CheckResult(
                f"attribution {label}",
                self._within(footprint, expected),
                format_size(footprint),
                f"{format_size(expected)} ± {format_size(self.tolerance)}",
                f"allocation {label} + context {format_size(baseline)}",
                {"footprint_bytes": footprint, "expected_bytes": expected},
            )
        )
        rise = after.used - before.used
        self._add(
            CheckResult(
                f"device used {label}",
                self._within(rise, footprint),
                format_size(rise),
                f"{format_size(footprint)} ± {format_size(self.tolerance)}",
                "device used rose by the child's footprint (other GPU users disturb this)",
                {"used_rise_bytes": rise, "footprint_bytes": footprint},
            )
        )

    def _check_tree_and_foreign(self, baseline: int) -> None:
        nbytes = min(self.sizes, default=64 * MiB)
        expected = baseline + nbytes
        with self._child(nbytes, nested=True) as tree:
            reading = self._read(tree=tree.pid)
            footprint = reading.instances["tree"].device_bytes
            self._add(
                CheckResult(
                    "process tree",
                    tree.holder != tree.pid and self._within(footprint, expected),
                    format_size(footprint),
                    f"{format_size(expected)} ± {format_size(self.tolerance)}",
                    f"held by grandchild {tree.holder}, read through root pid {tree.pid}",
                    {"footprint_bytes": footprint, "expected_bytes": expected},
                )
            )
            before = self._device(self._read(tree=tree.pid))
            with self._child(nbytes) as stranger:
                reading = self._read(tree=tree.pid)
                after = self._device(reading)
                rise = after.foreign - before.foreign
                managed = reading.instances["tree"].device_bytes
                ok = self._within(rise, expected) and self._within(managed, footprint)
                self._add(
                    CheckResult(
                        "foreign",
                        ok,
                        format_size(rise),
                        f"{format_size(expected)} ± {format_size(self.tolerance)}",
                        f"pid {stranger.pid} (not an instance) raised foreign; managed "
                        f"stayed {format_size(managed)}",
                        {"foreign_rise_bytes": rise, "managed_bytes": managed},
                    )
                )
                self._settle(stranger, "foreign")
            self._settle(tree, "process tree")

    def _settle(self, child: Child, label: str) -> None:
        """Kill ``child`` and time the barrier the daemon waits on before the next load."""
        pids = tuple(dict.fromkeys((child.pid, child.holder)))
        free_before = self._device(self._read()).free
        held = self._read(c=child.pid).instances["c"].device_bytes
        started = self.monotonic()
        child.kill()

        async def released() -> bool:
            return not self.probe.holding(pids)

        settled = asyncio.run(
            wait_settled(
                released, clock=SystemClock(), timeout_s=self.settle_timeout, interval_s=0.05
            )
        )
        elapsed = self.monotonic() - started
        if not settled:
            self._settle_failures.append(f"{label}: pids {list(pids)} still listed")
            return
        self._settle_times.append(elapsed)
        free_after = self._device(self._read()).free
        if free_after - free_before < held - self.tolerance:
            self._settle_failures.append(
                f"{label}: free rose {format_size(free_after - free_before)}, "
                f"child held {format_size(held)}"
            )

    def _report_settle(self) -> None:
        slowest = max(self._settle_times, default=0.0)
        count = len(self._settle_times) + len(self._settle_failures)
        detail = "; ".join(self._settle_failures) or (
            f"{count} kills; pids left NVML's list and free memory came back"
        )
        self._add(
            CheckResult(
                "settle",
                not self._settle_failures,
                f"slowest {format_duration(slowest)}",
                f"< {format_duration(self.settle_timeout)}",
                detail,
                {"slowest_s": slowest, "kills": count},
            )
        )
