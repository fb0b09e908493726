"""A stand-in for the ``pynvml`` module: the same names, scripted answers, recorded calls.

``FakeNvml`` is a real ``types.ModuleType`` so it can be passed wherever the probe takes
the module. Its error classes *are* pynvml's (``NVMLError`` and every ``NVMLError_*``
subclass, ``NVMLLibraryMismatchError``), so the probe's ``except nvml.NVMLError`` is tested
against the exact hierarchy it meets in production. Importing pynvml loads no library.

What can be scripted:

- GPUs (``FakeGpu``): total, used, driver-reserved memory, name (str or bytes), and the
  compute and graphics process lists (``FakeProcess``; ``used_gpu_memory=None`` is what
  NVML reports where per-process memory is unavailable). Mutate them between reads.
- ``init_error``: the class ``nvmlInit`` raises (e.g. ``NVMLError_LibraryNotFound``, which
  is what the real binding raises on a machine without the driver).
- ``memory_v2``: ``"supported"``, ``"function-not-found"`` (the v2 call raises
  ``NVMLError_FunctionNotFound``, an older driver) or ``"absent"`` (an older binding:
  no ``nvmlMemory_v2`` constant, and no ``version`` argument).
- ``process_abi="v2"``: a driver older than the binding, whose unversioned process-list
  functions raise ``NVMLLibraryMismatchError``; the ``_v2`` functions answer.
- ``fail(function, error, on_call=N, times=K)``: the Nth..N+K-1th calls of ``function``
  raise ``error`` (default: the next call).

``calls`` counts every call by function name (``calls["nvmlShutdown"]``); ``initialised``
is NVML's reference count, which must be back at 0 once a probe is closed.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import pynvml

GiB = 2**30

V2Support = Literal["supported", "function-not-found", "absent"]
ProcessAbi = Literal["v3", "v2"]


@dataclass
class FakeProcess:
    pid: int
    used_gpu_memory: int | None


@dataclass
class FakeGpu:
    total: int = 24 * GiB
    used: int = 0
    reserved: int = 0
    name: str | bytes = "NVIDIA Fake 24GB"
    compute: list[FakeProcess] = field(default_factory=list)
    graphics: list[FakeProcess] = field(default_factory=list)


@dataclass(frozen=True)
class FakeHandle:
    index: int


class FakeNvml(types.ModuleType):
    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: type[pynvml.NVMLError] | None = None,
        memory_v2: V2Support = "supported",
        process_abi: ProcessAbi = "v3",
    ) -> None:
        super().__init__("fake_pynvml")
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.memory_v2 = memory_v2
        self.process_abi = process_abi
        self.calls: Counter[str] = Counter()
        self.initialised = 0
        self._failures: dict[str, dict[int, type[BaseException]]] = {}
        if memory_v2 != "absent":
            self.nvmlMemory_v2 = pynvml.nvmlMemory_v2

    # -- scripting -------------------------------------------------------------------

    def fail(
        self,
        function: str,
        error: type[BaseException],
        *,
        on_call: int | None = None,
        times: int = 1,
    ) -> None:
        """Make calls ``on_call`` .. ``on_call + times - 1`` (1-based) of ``function`` raise."""
        first = self.calls[function] + 1 if on_call is None else on_call
        for number in range(first, first + times):
            self._failures.setdefault(function, {})[number] = error

    def _enter(self, function: str, *, needs_init: bool = True) -> None:
        self.calls[function] += 1
        error = self._failures.get(function, {}).pop(self.calls[function], None)
        if error is not None:
            raise error()
        if needs_init and self.initialised == 0:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: FakeHandle) -> FakeGpu:
        return self.gpus[handle.index]

    # -- the pynvml surface the probe uses ----------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        if self.init_error is not None:
            raise self.init_error()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return FakeHandle(index)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        self._enter("nvmlDeviceGetName")
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        gpu = self._gpu(handle)
        if version is not None and self.memory_v2 == "absent":
            raise TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword 'version'")
        self._enter("nvmlDeviceGetMemoryInfo")
        free = gpu.total - gpu.reserved - gpu.used
        if not version:
            # What current drivers answer to v1: the reserve is folded into "used".
            return types.SimpleNamespace(total=gpu.total, free=free, used=gpu.used + gpu.reserved)
        if self.memory_v2 == "function-not-found":
            raise pynvml.NVMLError_FunctionNotFound()
        return types.SimpleNamespace(
            version=version, total=gpu.total, reserved=gpu.reserved, free=free, used=gpu.used
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        self._check_newest_abi("nvmlDeviceGetComputeRunningProcesses")
        return _process_infos(self._gpu(handle).compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses")
        self._check_newest_abi("nvmlDeviceGetGraphicsRunningProcesses")
        return _process_infos(self._gpu(handle).graphics)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses_v2")
        return _process_infos(self._gpu(handle).compute)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses_v2")
        return _process_infos(self._gpu(handle).graphics)

    def _check_newest_abi(self, function: str) -> None:
        if self.process_abi != "v3":
            # What pynvml's @throwOnVersionMismatch raises when the driver lacks _v3.
            raise pynvml.NVMLLibraryMismatchError(f"{function}: use {function}_v2")


def _process_infos(processes: list[FakeProcess]) -> list[Any]:
    # Shaped like pynvml's nvmlFriendlyObject for c_nvmlProcessInfo_t.
    return [
        types.SimpleNamespace(
            pid=proc.pid,
            usedGpuMemory=proc.used_gpu_memory,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
        for proc in processes
    ]


# The real exception hierarchy, as module attributes like pynvml's own.
for _name in dir(pynvml):
    if _name.startswith("NVMLError") or _name == "NVMLLibraryMismatchError":
        setattr(FakeNvml, _name, getattr(pynvml, _name))
del _name
