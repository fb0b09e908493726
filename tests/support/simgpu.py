"""Simulated GPUs for tests: a state in the test's directory, and what runs against it.

    gpus = simulated_gpus(tmp_path, "24GiB", "24GiB", release_lag=1.0)
    with gpus.hold(0, "20GiB"):                        # a foreign process holding memory
        with running_daemon(gpus.policy(services), tmp_path, env=gpus.env) as daemon:
            ...
    gpus.state().used(1)

``env`` is what ``start_daemon(env=...)`` (or any process) needs to see the simulation
(``VRAMD_SIMULATED_GPUS``). The daemon's runtimes need nothing more: the probe's
placement environment names the state file for them, beside ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.simgpu import ENV, State, StateFile, new_state
from service.simgpu.state import ScriptedError
from service.units import parse_size

from .daemon import REPO_ROOT, policy_yaml

SIMGPU = [sys.executable, "-m", "service.simgpu"]


@dataclass(frozen=True)
class SimulatedGpus:
    path: Path

    @property
    def env(self) -> dict[str, str]:
        return {ENV: str(self.path)}

    @property
    def file(self) -> StateFile:
        return StateFile(self.path)

    def state(self) -> State:
        """The state now, dead processes accounted for."""
        return self.file.current()

    def fail(self, function: str, error: str, calls: int = 1) -> None:
        """The next ``calls`` calls of NVML ``function`` raise ``error`` (e.g. GPU_IS_LOST)."""
        with self.file.update() as state:
            state.errors[function] = ScriptedError(error, calls)

    def hang(self, seconds: float) -> None:
        """Every NVML call blocks for ``seconds`` from now (0: answer again at once)."""
        with self.file.update() as state:
            state.hang_until = time.time() + seconds if seconds > 0 else 0.0

    def policy(self, services: dict[str, dict[str, Any]], **keys: Any) -> str:
        """An ``nvml`` policy; ``keys`` go to ``policy_yaml`` (no ``budget``: each GPU's total)."""
        return policy_yaml(services, **{"budget": None, **keys, "backend": "nvml"})

    @contextmanager
    def hold(self, device: int, size: str, kind: str = "compute") -> Iterator[int]:
        """A process vramd did not start, holding ``size`` on NVML ``device``; its pid."""
        argv = ["hold", "--state", str(self.path), "--device", str(device), "--bytes", size]
        proc = subprocess.Popen(
            [*SIMGPU, *argv, "--kind", kind],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("holding"):
                proc.wait(10)
                raise AssertionError(
                    f"hold failed: {line}{proc.stderr.read() if proc.stderr else ''}"
                )
            yield proc.pid
        finally:
            proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def wait_released(self, pid: int, timeout: float = 10.0) -> None:
        """Until no allocation of ``pid`` is listed any more (its release lag is over)."""
        deadline = time.monotonic() + timeout
        while any(a.pid == pid for a in self.state().allocations):
            if time.monotonic() > deadline:
                raise AssertionError(f"pid {pid} still holds simulated memory after {timeout}s")
            time.sleep(0.05)


def simulated_gpus(
    directory: Path,
    *totals: str,
    reserved: str = "0",
    release_lag: float = 0.5,
    context: str = "16MiB",
    fastest_first: Sequence[int] | None = None,
    max_block: Sequence[str | None] | None = None,
) -> SimulatedGpus:
    """A fresh state at ``directory/gpus.json`` with one GPU per total (PCI order)."""
    state = new_state(
        [parse_size(total) for total in totals],
        reserved=parse_size(reserved),
        release_lag=release_lag,
        context_bytes=parse_size(context),
        fastest_first=fastest_first,
        max_block=None
        if max_block is None
        else [None if block is None else parse_size(block) for block in max_block],
    )
    path = directory / "gpus.json"
    StateFile(path).write(state)
    return SimulatedGpus(path)
