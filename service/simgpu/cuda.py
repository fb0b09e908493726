"""The CUDA side of the simulation: which devices a process sees, and its allocations."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from service.simgpu.state import Allocation, Kind, State, StateFile, own_start_time

MiB, GiB = 2**20, 2**30


class CudaError(Exception):
    """What a CUDA call would have failed with; ``str()`` is the runtime's line."""


class NoDevice(CudaError):
    def __init__(self, why: str) -> None:
        super().__init__(f"CUDA error: no CUDA-capable device is detected ({why})")


class OutOfMemory(CudaError):
    """An allocation that did not fit: too little free memory, or no block large enough."""

    def __init__(self, *, ordinal: int, requested: int, total: int, free: int, block: int):
        self.ordinal, self.requested = ordinal, requested
        self.total, self.free, self.block = total, free, block
        super().__init__(self.torch_message())

    def torch_message(self) -> str:
        """PyTorch's wording, which vLLM and diffusers servers print and answer with."""
        fragmented = (
            f" (largest free block {_cuda_size(self.block)})" if self.block < self.free else ""
        )
        return (
            f"CUDA out of memory. Tried to allocate {_cuda_size(self.requested)}. GPU "
            f"{self.ordinal} has a total capacity of {_cuda_size(self.total)} of which "
            f"{_cuda_size(self.free)} is free{fragmented}. (simulated GPU)"
        )

    def ggml_lines(self) -> list[str]:
        """llama.cpp's lines when a model's buffers do not fit at load."""
        return [
            f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating "
            f"{self.requested / MiB:.2f} MiB on device {self.ordinal}: "
            "cudaMalloc failed: out of memory",
            f"llama_model_load: error loading model: unable to allocate CUDA{self.ordinal} buffer",
            "CUDA error: out of memory",
        ]


def _cuda_size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.2f} MiB"


def visible_devices(state: State, environ: Mapping[str, str]) -> list[int]:
    """NVML indexes by CUDA ordinal: ``result[i]`` is the device ``cuda:i`` is.

    Unset ``CUDA_VISIBLE_DEVICES`` shows every device; an entry is an ordinal in the
    enumeration order or a UUID (``GPU-...``, a prefix is enough), and as in CUDA an
    entry that names no device hides it and every entry after it.

    A process on a real box reaches its GPUs through the CUDA runtime, which numbers them by
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``: the default order is fastest first,
    and only ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA's ordinal ``i`` NVML's index ``i``.
    ``visible_devices`` applies those rules to the simulated devices, so a runtime started
    without ``PCI_BUS_ID`` on a box whose cards differ allocates on another GPU than the
    one it was placed on, as it would for real.

    ``CudaProcess`` allocates for the calling process: every allocation is checked against
    the device's free memory and largest free block under the state's lock, and fails with
    ``OutOfMemory`` the way ``cudaMalloc`` does. Nothing is freed at exit on purpose: the
    simulation sees the pid gone and releases its memory after the release lag, as the
    driver does. Used by the demo runtime (``--gpu-memory``), ``python -m service.simgpu
    hold`` and gpucheck's children (``simulated_allocation``).
    """
    count = len(state.devices)
    pci = environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID"
    order = list(range(count)) if pci else list(state.fastest_first)
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return order
    devices: list[int] = []
    for entry in (part.strip() for part in listed.split(",")):
        index = _device(entry, order, state)
        if index is None or index in devices:
            break
        devices.append(index)
    return devices


def _device(entry: str, order: list[int], state: State) -> int | None:
    if entry.isdigit():
        return order[int(entry)] if int(entry) < len(order) else None
    if entry.startswith("GPU-"):
        matches = [i for i, d in enumerate(state.devices) if d.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


class CudaProcess:
    """This process as the simulated driver sees it: its visible devices and allocations.

    ``devices`` maps CUDA ordinals to NVML indexes (``visible_devices``); ``NoDevice``
    when it shows none. Allocation methods take CUDA ordinals.
    """

    def __init__(
        self, file: StateFile, environ: Mapping[str, str] = os.environ, kind: Kind = "compute"
    ) -> None:
        self.file = file
        self.kind: Kind = kind
        self.pid = os.getpid()
        self.start_time = own_start_time()
        self.devices = visible_devices(file.read(), environ)
        if not self.devices:
            shown = environ.get("CUDA_VISIBLE_DEVICES")
            raise NoDevice(f"CUDA_VISIBLE_DEVICES={shown!r}")

    def allocate(self, sizes: Mapping[int, int]) -> list[int]:
        """Allocate ``sizes`` (ordinal -> bytes) all at once, or nothing (``OutOfMemory``).

        A device this process has not touched yet gets its CUDA context first; a size of
        0 creates just the context. Returns the ids of the sized allocations.
        """
        with self.file.update() as state:
            ids = []
            for ordinal, nbytes in sizes.items():
                if not 0 <= ordinal < len(self.devices):
                    raise CudaError(f"CUDA error: invalid device ordinal {ordinal}")
                index = self.devices[ordinal]
                self._check(state, ordinal, index, nbytes)
                if not self._has_context(state, index):
                    self._add(state, index, state.context_bytes, context=True)
                if nbytes > 0:
                    ids.append(self._add(state, index, nbytes, context=False))
            return ids

    def free(self, ids: list[int]) -> None:
        """``cudaFree``: immediate, unlike a dead process's memory. The context stays."""
        gone = set(ids)
        with self.file.update() as state:
            state.allocations = [a for a in state.allocations if a.id not in gone]

    def held(self) -> dict[int, int]:
        """NVML index -> bytes this process allocated there (contexts left out)."""
        out: dict[int, int] = {}
        for alloc in self.file.read().allocations:
            if self._mine(alloc) and not alloc.context:
                out[alloc.device] = out.get(alloc.device, 0) + alloc.bytes
        return out

    def _check(self, state: State, ordinal: int, index: int, nbytes: int) -> None:
        context = 0 if self._has_context(state, index) else state.context_bytes
        free = state.free(index) - context
        block = min(free, state.largest_block(index, self.pid))
        if nbytes > block or free < 0:
            device = state.devices[index]
            raise OutOfMemory(
                ordinal=ordinal,
                requested=nbytes or context,
                total=device.usable,
                free=max(0, free),
                block=max(0, block),
            )

    def _has_context(self, state: State, index: int) -> bool:
        return any(a.device == index and a.context and self._mine(a) for a in state.allocations)

    def _mine(self, alloc: Allocation) -> bool:
        return alloc.pid == self.pid and alloc.start_time == self.start_time

    def _add(self, state: State, index: int, nbytes: int, *, context: bool) -> int:
        alloc = Allocation(
            id=state.next_id,
            pid=self.pid,
            start_time=self.start_time,
            device=index,
            bytes=nbytes,
            kind=self.kind,
            context=context,
        )
        state.next_id += 1
        state.allocations.append(alloc)
        return alloc.id


def simulated_allocation(nbytes: int) -> Any:
    """gpucheck's child on simulated GPUs: a context, then ``nbytes`` on ``cuda:0``.

    What it returns is held for as long as the caller keeps it, as a tensor would be.
    """
    process = CudaProcess(StateFile.from_env())
    return process, process.allocate({0: nbytes})
