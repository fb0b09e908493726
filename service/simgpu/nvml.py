"""``pynvml`` over the simulated GPUs: the names, answers and errors the probe expects."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import pynvml

from service.simgpu.state import ENV, State, StateError, StateFile

NVMLError = pynvml.NVMLError
NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
nvmlMemory_v2 = pynvml.nvmlMemory_v2
DRIVER_VERSION = "simulated"

# Every NVMLError_* subclass and NVML_ERROR_* code, as attributes like pynvml's own.
globals().update(
    {
        name: getattr(pynvml, name)
        for name in dir(pynvml)
        if name.startswith(("NVMLError_", "NVML_ERROR_"))
    }
)

_lock = threading.Lock()
_initialised = 0
_file: StateFile | None = None


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass(frozen=True)
class Memory:
    """``c_nvmlMemory_t`` (v1: ``version`` and ``reserved`` are 0) or its v2."""

    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass(frozen=True)
class ProcessInfo:
    """pynvml's friendly object for ``c_nvmlProcessInfo_t``."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(frozen=True)
class PciInfo:
    busId: str
    busIdLegacy: str
    domain: int
    bus: int
    device: int


def error(name: str) -> pynvml.NVMLError:
    """The pynvml exception for an NVML error name, in any of the ways it is written:
    ``GPU_IS_LOST``, ``NVML_ERROR_GPU_IS_LOST`` or ``NVMLError_GpuIsLost``."""
    if name.startswith("NVMLError_") and hasattr(pynvml, name):
        exc: pynvml.NVMLError = getattr(pynvml, name)()
        return exc
    code = getattr(pynvml, "NVML_ERROR_" + name.upper().removeprefix("NVML_ERROR_"), None)
    if not isinstance(code, int):
        raise ValueError(f"{name!r} is not an NVML error name (e.g. GPU_IS_LOST, UNKNOWN)")
    return pynvml.NVMLError(code)


def _enter(function: str, *, needs_init: bool = True) -> State:
    """The settled state for one call, after any scripted error for ``function``."""
    if needs_init and _initialised == 0:
        raise pynvml.NVMLError_Uninitialized()
    file = _file or StateFile.from_env()
    try:
        state = file.current()
        while (hang := state.hang_until - time.time()) > 0:
            time.sleep(min(hang, 0.1))  # until then, or until the hang is lifted
            state = file.current()
        if function in state.errors:
            with file.update() as state:
                scripted = state.errors.get(function)
                if scripted is not None:
                    scripted.calls -= 1
                    if scripted.calls <= 0:
                        del state.errors[function]
            if scripted is not None:
                raise error(scripted.error)
    except StateError as exc:
        raise pynvml.NVMLError_DriverNotLoaded() from exc
    return state


def _device(state: State, handle: Handle) -> int:
    if not isinstance(handle, Handle) or not 0 <= handle.index < len(state.devices):
        raise pynvml.NVMLError_InvalidArgument()
    return handle.index


# --- the pynvml surface ----------------------------------------------------------------


def nvmlInit() -> None:
    """``service.devices`` imports this module in place of ``pynvml`` when
    ``VRAMD_SIMULATED_GPUS`` is set, and ``NvmlProbe`` reads it unchanged. Each call reads
    the shared state (``service.simgpu.state``) afresh, so what demo runtimes, foreign
    holders and dead processes do shows up at the next sample, as it does through the real
    driver:

    - ``nvmlInit``/``nvmlShutdown`` keep a per-process reference count; any other call
      before ``nvmlInit`` raises ``NVMLError_Uninitialized``. ``nvmlInit`` raises
      ``NVMLError_DriverNotLoaded`` when the state file cannot be read.
    - ``nvmlDeviceGetMemoryInfo`` answers v1 (``used`` includes the driver's reserve, as on
      current drivers) and, with ``version=nvmlMemory_v2``, v2 (``reserved`` apart).
      ``used`` is the sum of the allocations listed, contexts and the dead processes still
      inside their release lag included.
    - The compute and graphics process lists hold one entry per pid with an allocation of
      that kind on the device; ``usedGpuMemory`` is the pid's whole use there (a pid with both
      kinds appears in both lists with the same figure, as NVML reports it).
    - Scripted errors (``errors`` in the state) make the next N calls of a function raise.
    - A scripted hang (``hang_until``) blocks every call until then: a driver that stopped
      answering, which must stall nothing but the probe's own thread.

    The error classes and codes are ``pynvml``'s own, re-exported, so ``except
    nvml.NVMLError`` and ``NVMLError(code)`` mapping to a subclass behave as in production.
    """
    global _initialised, _file
    with _lock:
        try:
            file = StateFile.from_env()
            file.read()
        except StateError as exc:
            raise pynvml.NVMLError_DriverNotLoaded() from exc
        _file = file
        _enter("nvmlInit", needs_init=False)
        _initialised += 1


def nvmlShutdown() -> None:
    global _initialised
    with _lock:
        _enter("nvmlShutdown")
        _initialised -= 1


def nvmlSystemGetDriverVersion() -> str:
    _enter("nvmlSystemGetDriverVersion")
    return DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    return len(_enter("nvmlDeviceGetCount").devices)


def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
    state = _enter("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < len(state.devices):
        raise pynvml.NVMLError_InvalidArgument()
    return Handle(index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> Handle:
    state = _enter("nvmlDeviceGetHandleByUUID")
    wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index, device in enumerate(state.devices):
        if device.uuid == wanted:
            return Handle(index)
    raise pynvml.NVMLError_NotFound()


def nvmlDeviceGetHandleByPciBusId(bus_id: str | bytes) -> Handle:
    state = _enter("nvmlDeviceGetHandleByPciBusId")
    wanted = (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).upper()
    for index, device in enumerate(state.devices):
        if device.pci_bus_id.upper() in (wanted, "0000" + wanted):
            return Handle(index)
    raise pynvml.NVMLError_NotFound()


def nvmlDeviceGetIndex(handle: Handle) -> int:
    return _device(_enter("nvmlDeviceGetIndex"), handle)


def nvmlDeviceGetName(handle: Handle) -> str:
    state = _enter("nvmlDeviceGetName")
    return state.devices[_device(state, handle)].name


def nvmlDeviceGetUUID(handle: Handle) -> str:
    state = _enter("nvmlDeviceGetUUID")
    return state.devices[_device(state, handle)].uuid


def nvmlDeviceGetPciInfo(handle: Handle) -> PciInfo:
    state = _enter("nvmlDeviceGetPciInfo")
    bus_id = state.devices[_device(state, handle)].pci_bus_id
    domain, bus, rest = bus_id.split(":")
    return PciInfo(bus_id, bus_id[4:], int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16))


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetMemoryInfo(handle: Handle, version: int | None = None) -> Memory:
    state = _enter("nvmlDeviceGetMemoryInfo")
    index = _device(state, handle)
    device = state.devices[index]
    used, free = state.used(index), state.free(index)
    if not version:
        return Memory(total=device.total, free=free, used=used + device.reserved)
    if version != nvmlMemory_v2:
        raise pynvml.NVMLError_ArgumentVersionMismatch()
    return Memory(
        total=device.total, free=free, used=used, reserved=device.reserved, version=version
    )


def _processes(function: str, handle: Handle, kind: str) -> list[ProcessInfo]:
    state = _enter(function)
    index = _device(state, handle)
    use: dict[int, int] = {}
    kinds: set[int] = set()
    for alloc in state.allocations:
        if alloc.device == index:
            use[alloc.pid] = use.get(alloc.pid, 0) + alloc.bytes
            if alloc.kind == kind:
                kinds.add(alloc.pid)
    return [ProcessInfo(pid, use[pid]) for pid in use if pid in kinds]


def nvmlDeviceGetComputeRunningProcesses(handle: Handle) -> list[ProcessInfo]:
    return _processes("nvmlDeviceGetComputeRunningProcesses", handle, "compute")


def nvmlDeviceGetGraphicsRunningProcesses(handle: Handle) -> list[ProcessInfo]:
    return _processes("nvmlDeviceGetGraphicsRunningProcesses", handle, "graphics")


# The versioned ABIs answer the same: the simulated driver has every version.
nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses


def vramd_runtime_env() -> dict[str, str]:
    """Not pynvml's: what a runtime needs to see these GPUs (``NvmlProbe.placement_env``
    adds it). A real driver is reached through ``/dev/nvidia*``; this one through the
    state file, which the runtime's minimal environment would otherwise not name."""
    path = os.environ.get(ENV)
    return {ENV: path} if path else {}
