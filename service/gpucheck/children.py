"""The checks' children: processes that allocate a known amount on one GPU and hold it.

Each runs as ``python -m service.gpucheck --child ...`` in its own process group, prints
one JSON line once its allocation is done, and holds it until its stdin closes or it is
killed. It allocates with PyTorch or CuPy, or on simulated GPUs (``service.simgpu``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any

from service.gpucheck.checks import ALLOCATORS, SIMULATED, SIMULATED_ENV, CannotRun, Child

# --- real children ---------------------------------------------------------------------


def find_allocator(preferred: str = "auto") -> str:
    """``torch`` if importable, else ``cupy``; ``CannotRun`` when neither is.

    On simulated GPUs (``VRAMD_SIMULATED_GPUS``) ``auto`` means ``simulated``.
    """
    if preferred == SIMULATED or (preferred == "auto" and os.environ.get(SIMULATED_ENV)):
        return SIMULATED
    candidates = ALLOCATORS if preferred == "auto" else (preferred,)
    for name in candidates:
        if importlib.util.find_spec(name) is not None:
            return name
    wanted = " or ".join(candidates)
    raise CannotRun(
        f"no GPU allocator: install {wanted} with CUDA support into this environment "
        "(e.g. pip install torch, or pip install cupy-cuda12x)"
    )


@dataclass
class ChildProcess:
    proc: subprocess.Popen[bytes]
    holder: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        # Once the leader is reaped its pid (and group id) may be reused: signal only before.
        if self.proc.returncode is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class ChildLauncher:
    """Children running ``python -m service.gpucheck --child`` on one GPU."""

    allocator: str
    gpu: int
    ready_timeout: float = 180.0

    def start(self, nbytes: int, *, nested: bool = False) -> Child:
        argv = [sys.executable, "-m", "service.gpucheck", "--child", "--allocator"]
        argv += [self.allocator, "--bytes", str(nbytes)] + (["--nested"] if nested else [])
        # NVML numbers GPUs by PCI bus; CUDA by speed unless told otherwise.
        env = os.environ | {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": str(self.gpu),
        }
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True
        )
        child = ChildProcess(proc, holder=proc.pid)
        try:
            assert proc.stdout is not None
            answer = _read_answer(proc.stdout, self.ready_timeout)
        except BaseException:
            child.kill()
            raise
        if "error" in answer:
            child.kill()
            raise CannotRun(f"the {self.allocator} child failed: {answer['error']}")
        child.holder = int(answer["pid"])
        return child


def _read_answer(stream: IO[bytes], timeout: float) -> dict[str, Any]:
    """The child's JSON line, skipping anything a library printed to stdout before it."""
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise CannotRun(f"a child did not allocate within {timeout:g}s")
        line = stream.readline()
        if not line:
            return {"error": "exited before allocating (its stderr is above)"}
        with suppress(ValueError):
            answer = json.loads(line)
            if isinstance(answer, dict) and ("pid" in answer or "error" in answer):
                return answer


def child_main(allocator: str, nbytes: int, nested: bool) -> int:
    """The child: allocate, say so on stdout, hold until stdin closes."""
    if nested:
        # The grandchild inherits our stdin and stdout, so it answers the parent itself.
        argv = [sys.executable, "-m", "service.gpucheck", "--child", "--allocator", allocator]
        return subprocess.call([*argv, "--bytes", str(nbytes)])
    try:
        keep = _allocate(allocator, nbytes)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"pid": os.getpid(), "bytes": nbytes, "allocator": allocator}), flush=True)
    sys.stdin.buffer.read()
    del keep
    return 0


def _allocate(allocator: str, nbytes: int) -> object:
    # Every child makes the same one-element array first, so that the context-only child
    # and the others differ by exactly the large allocation. Imported by name: neither
    # library is a dependency of vramd.
    if allocator == SIMULATED:
        from service.simgpu.cuda import simulated_allocation  # not needed on a real box

        return simulated_allocation(nbytes)
    lib: Any = importlib.import_module(allocator)
    if allocator == "torch":
        if not lib.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False (a CPU-only torch build?)")
        held = [lib.ones(1, device="cuda")]
        if nbytes:
            held.append(lib.ones(nbytes, dtype=lib.uint8, device="cuda"))
        lib.cuda.synchronize()
        return held
    held = [lib.ones(1)]
    if nbytes:
        held.append(lib.ones(nbytes, dtype=lib.uint8))
    lib.cuda.Device().synchronize()
    return held
