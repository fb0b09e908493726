"""Device memory on simulated GPUs: what ``--gpu-memory`` holds and each request adds."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from service.demo_runtime.log import log
from service.demo_runtime.options import Options

if TYPE_CHECKING:
    from service.simgpu import CudaProcess


class GpuMemory:
    """This runtime's simulated device memory; ``CudaError`` from the constructor when it
    cannot see a device (no state, or a ``CUDA_VISIBLE_DEVICES`` that shows nothing).

    With ``--gpu-memory SIZE`` the runtime allocates SIZE at the end of its load on the
    simulated GPUs (``service.simgpu``, the state named by ``VRAMD_SIMULATED_GPUS``) that its
    ``CUDA_VISIBLE_DEVICES`` shows, numbered as CUDA numbers them (fastest first unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), split over them by ``--gpu-split`` (even by default).
    ``--gpu-leak-per-request SIZE`` adds device memory per inference request, split the same
    way, and never frees it. An allocation that does not fit raises ``OutOfMemory``; the
    caller prints the runtime's line. Nothing is freed at exit: the simulation sees the pid
    gone and releases its memory after the release lag, as the driver does.

    ``service.simgpu`` is imported only here, and only when one of the flags is given, so a
    runtime without them starts as fast as before.
    """

    def __init__(self, opts: Options) -> None:
        from service.simgpu import CudaError, CudaProcess, NoDevice, StateError, StateFile

        self.opts = opts
        try:
            self._process: CudaProcess = CudaProcess(StateFile.from_env())
        except StateError as exc:
            raise NoDevice(str(exc)) from exc
        seen = len(self._process.devices)
        # As a CUDA program does: every device CUDA_VISIBLE_DEVICES lists, or cuda:0 alone.
        used = seen if "CUDA_VISIBLE_DEVICES" in os.environ else 1
        self._weights = opts.gpu_split or (1.0,) * used
        if len(self._weights) > seen:
            raise CudaError(
                f"CUDA error: invalid device ordinal (--gpu-split has {len(self._weights)} "
                f"shares, CUDA shows {seen} device(s))"
            )
        self.ordinals = list(range(len(self._weights)))
        self._lock = threading.Lock()
        self._weights_ids: list[int] = []

    def _split(self, size: int) -> dict[int, int]:
        """``size`` over the devices in proportion to the split; the rest on the last."""
        total = sum(self._weights)
        shares = [int(size * weight / total) for weight in self._weights]
        shares[-1] += size - sum(shares)
        return dict(zip(self.ordinals, shares, strict=True))

    def load(self) -> None:
        """The weights: ``--gpu-memory`` over the devices used (``OutOfMemory``)."""
        ids = self._process.allocate(self._split(self.opts.gpu_memory))
        with self._lock:
            self._weights_ids = ids

    def release(self) -> None:
        """vLLM's level-1 sleep: the weights leave the device; leaks and contexts stay."""
        with self._lock:
            ids, self._weights_ids = self._weights_ids, []
        self._process.free(ids)

    def reload(self) -> str | None:
        """Waking: the weights again; CUDA's out-of-memory message when they do not fit."""
        return self._answer(self.load)

    def leak(self) -> str | None:
        """``--gpu-leak-per-request`` more, for good; CUDA's message when it does not fit."""
        if self.opts.gpu_leak_per_request <= 0:
            return None
        return self._answer(
            lambda: self._process.allocate(self._split(self.opts.gpu_leak_per_request))
        )

    def _answer(self, allocate: Callable[[], object]) -> str | None:
        from service.simgpu import OutOfMemory

        try:
            allocate()
        except OutOfMemory as exc:
            return exc.torch_message()
        return None

    def describe(self) -> dict[str, object]:
        """What ``GET /debug/gpu`` answers: where this runtime's memory landed."""
        held = self._process.held()
        devices = [
            {"ordinal": ordinal, "index": index, "bytes": held.get(index, 0)}
            for ordinal, index in enumerate(self._process.devices)
            if ordinal in self.ordinals
        ]
        return {
            "pid": self._process.pid,
            "state": str(self._process.file.path),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
            "devices": devices,
            "bytes": sum(device["bytes"] for device in devices),
        }


def start(opts: Options) -> GpuMemory | None:
    """Allocate ``--gpu-memory`` as a runtime does at the end of its load.

    None when it cannot: the runtime's own lines are on stderr then (llama.cpp's for an
    allocation that does not fit, which vramd's adapters read as out-of-memory).
    """
    from service.simgpu import CudaError, OutOfMemory

    try:
        gpu = GpuMemory(opts)
        if opts.gpu_memory > 0:
            gpu.load()
    except OutOfMemory as exc:
        for line in exc.ggml_lines():
            log(line, sys.stderr)
        return None
    except CudaError as exc:
        log(str(exc), sys.stderr)
        return None
    return gpu
