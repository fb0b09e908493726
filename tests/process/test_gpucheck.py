"""``python -m service.gpucheck``: the no-GPU exit, and the checks against a scripted NVML.

This machine has no GPU, so the checks' logic runs against the fake pynvml
(tests/support/fake_pynvml.py) through the real ``NvmlProbe``. The children are real
processes (attribution walks the real process table); what the fake GPU lists for them
is what ``ScriptedLauncher`` scripts: a CUDA context plus the allocation, optionally
under a pid the container cannot see, under-reported, or never released.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.fake_pynvml import FakeGpu, FakeNvml, FakeProcess

from service.devices import create_probe
from service.gpucheck.checks import CannotRun, GpuCheck, Report
from service.gpucheck.children import ChildLauncher, find_allocator

MiB, GiB = 2**20, 2**30
CONTEXT = 500 * MiB
REPO_ROOT = Path(__file__).resolve().parents[2]

SLEEPER = "import time; time.sleep(120)"
# A parent that starts a sleeping grandchild and prints the grandchild's pid.
NESTER = (
    "import subprocess, sys, time; "
    f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
    "print(p.pid, flush=True); p.wait()"
)


class TeardownNvml(FakeNvml):
    """A fake NVML where a killed process leaves the lists only after a few more reads,
    as the driver's context teardown does."""

    def __init__(self, gpu: FakeGpu) -> None:
        super().__init__([gpu])
        self.pending: list[tuple[int, FakeProcess, int]] = []  # (reads left, process, bytes)

    def release_later(self, process: FakeProcess, held: int, after_reads: int) -> None:
        self.pending.append((after_reads, process, held))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        still: list[tuple[int, FakeProcess, int]] = []
        for left, process, held in self.pending:
            if left <= 0:
                self.gpus[0].compute.remove(process)
                self.gpus[0].used -= held
            else:
                still.append((left - 1, process, held))
        self.pending = still
        return super().nvmlDeviceGetComputeRunningProcesses(handle)


@dataclass
class ScriptedChild:
    proc: subprocess.Popen[bytes]
    holder: int
    on_kill: Any

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        if self.proc.returncode is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.on_kill()


@dataclass
class ScriptedLauncher:
    """Real sleeping processes; the fake GPU lists them as holding ``CONTEXT + nbytes``."""

    nvml: TeardownNvml
    pid_offset: int = 0  # NVML in another pid namespace: pids the probe cannot match
    reported: float = 1.0  # the fraction of its memory NVML reports per process
    release_after_reads: int | None = 3  # None: never released
    allocator: str = "scripted"
    children: list[ScriptedChild] = field(default_factory=list)

    def start(self, nbytes: int, *, nested: bool = False) -> ScriptedChild:
        code = NESTER if nested else "print(0, flush=True); " + SLEEPER
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
        )
        assert proc.stdout is not None
        holder = int(proc.stdout.readline()) if nested else proc.pid
        held = CONTEXT + nbytes
        gpu = self.nvml.gpus[0]
        process = FakeProcess(holder + self.pid_offset, int(held * self.reported))
        gpu.compute.append(process)
        gpu.used += held

        def released() -> None:
            if self.release_after_reads is not None:
                self.nvml.release_later(process, held, self.release_after_reads)

        child = ScriptedChild(proc, holder, released)
        self.children.append(child)
        return child


def run_checks(launcher: ScriptedLauncher, **options: Any) -> Report:
    with closing(create_probe("nvml", [0], nvml=launcher.nvml)) as probe:
        check = GpuCheck(probe, launcher, sizes=[256 * MiB, GiB], **options)
        try:
            checks = check.run()
        finally:
            for child in launcher.children:
                child.kill()
    return Report(gpu={"index": 0}, allocator=launcher.allocator, checks=checks)


@pytest.fixture
def nvml() -> Iterator[TeardownNvml]:
    fake = TeardownNvml(FakeGpu(total=24 * GiB, used=2 * GiB, name="NVIDIA Fake"))
    yield fake
    assert fake.initialised == 0, "the probe shut NVML down"


def verdicts(report: Report) -> dict[str, str]:
    return {check.name: check.verdict for check in report.checks}


def test_every_check_passes_where_nvml_attributes_and_releases(nvml: TeardownNvml) -> None:
    report = run_checks(ScriptedLauncher(nvml))
    assert verdicts(report) == {
        "context": "PASS",
        "attribution 256MiB": "PASS",
        "device used 256MiB": "PASS",
        "attribution 1GiB": "PASS",
        "device used 1GiB": "PASS",
        "process tree": "PASS",
        "foreign": "PASS",
        "settle": "PASS",
    }
    assert report.passed
    by_name = {check.name: check for check in report.checks}
    assert by_name["context"].data["footprint_bytes"] == CONTEXT
    assert by_name["attribution 1GiB"].data["footprint_bytes"] == CONTEXT + GiB
    assert by_name["foreign"].data["foreign_rise_bytes"] == CONTEXT + 256 * MiB
    assert by_name["settle"].data["kills"] == 5  # context, two sizes, tree, stranger
    assert nvml.gpus[0].compute == [] and nvml.gpus[0].used == 2 * GiB
    document = json.loads(json.dumps(report.to_json()))
    assert document["passed"] is True
    assert [c["verdict"] for c in document["checks"]] == ["PASS"] * 8


def test_pids_from_another_namespace_fail_with_the_pid_host_hint(nvml: TeardownNvml) -> None:
    report = run_checks(ScriptedLauncher(nvml, pid_offset=1_000_000))
    assert verdicts(report) == {"context": "FAIL"}
    assert "pid: host" in report.checks[0].detail
    assert not report.passed


def test_under_reported_process_memory_fails_attribution(nvml: TeardownNvml) -> None:
    report = run_checks(ScriptedLauncher(nvml, reported=0.5))
    result = verdicts(report)
    assert result["context"] == "PASS"
    assert result["attribution 1GiB"] == "FAIL"
    # The device's own figure rose by the whole allocation, more than was attributed.
    assert result["device used 1GiB"] == "FAIL"


def test_memory_never_released_fails_the_settle_barrier(nvml: TeardownNvml) -> None:
    report = run_checks(ScriptedLauncher(nvml, release_after_reads=None), settle_timeout=0.2)
    settle = report.checks[-1]
    assert settle.name == "settle" and settle.verdict == "FAIL"
    assert "still listed" in settle.detail


def test_sizes_that_do_not_fit_are_skipped(nvml: TeardownNvml) -> None:
    nvml.gpus[0].total = 3 * GiB  # 1GiB free
    report = run_checks(ScriptedLauncher(nvml))
    result = verdicts(report)
    assert result["attribution 1GiB"] == "SKIP" and "device used 1GiB" not in result
    assert result["attribution 256MiB"] == "PASS"
    assert report.passed, "a skipped size is not a failure"


def test_no_gpu_exits_2_with_the_nvml_reason() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service.gpucheck"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 2 or "no NVIDIA GPU found" not in done.stderr:
        pytest.skip(f"this machine has a GPU NVML can use: {done.stderr or done.stdout}")
    assert "no NVIDIA GPU found (NVML: " in done.stderr
    as_json = subprocess.run(
        [sys.executable, "-m", "service.gpucheck", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert as_json.returncode == 2
    document = json.loads(as_json.stdout)
    assert document["passed"] is False
    assert document["error"].startswith("no NVIDIA GPU found (NVML: ")


def test_without_torch_or_cupy_it_says_what_to_install() -> None:
    if any(importlib.util.find_spec(name) for name in ("torch", "cupy")):
        pytest.skip("torch or cupy is installed here")
    with pytest.raises(CannotRun, match="install torch or cupy"):
        find_allocator("auto")


def test_a_child_that_cannot_allocate_is_reported_not_hung() -> None:
    if importlib.util.find_spec("cupy"):
        pytest.skip("cupy is installed here")
    launcher = ChildLauncher("cupy", gpu=0, ready_timeout=60)
    with pytest.raises(CannotRun, match="cupy child failed: ModuleNotFoundError"):
        launcher.start(0)
