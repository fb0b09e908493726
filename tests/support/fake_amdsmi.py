"""A stand-in for ROCm's ``amdsmi`` module: the same names, scripted answers, recorded calls.

``FakeAmdsmi`` is a real ``types.ModuleType`` so it can be passed wherever the probe takes
the module. Its surface copies the real library's (``py-interface/amdsmi_interface.py``
and ``amdsmi_exception.py`` in ROCm/amdsmi): the enums ``AmdSmiInitFlags`` and
``AmdSmiMemoryType`` with amdsmi.h's values, the exception tree (``AmdSmiException`` >
``AmdSmiLibraryException(err_code)`` > ``AmdSmiRetryException``/``AmdSmiTimeoutException``;
``AmdSmiParameterException``), and the argument checks the real functions make: a
processor handle must be one the library handed out, a memory type must be an
``AmdSmiMemoryType`` (the real functions raise ``AmdSmiParameterException`` otherwise), and
every call but ``amdsmi_init`` raises ``NOT_INIT`` before initialisation.

What can be scripted:

- GPUs (``FakeGpu``): VRAM and GTT totals and use, ``vram_type`` (an amdsmi.h value, see
  ``VRAM_*``), ``market_name``, ``hip_uuid`` (None: the GPU answers no enumeration
  info), and its process list (``FakeProcess``; a ``None`` figure is what the library
  shows as ``"N/A"``). Mutate them between reads.
- ``process_api``: ``"dicts"`` (ROCm 6.1+: ``amdsmi_get_gpu_process_list`` returns one
  dict per process) or ``"handles"`` (5.7/6.0: it returns ``c_uint32`` handles holding the
  pid, and ``amdsmi_get_gpu_process_info(handle, process)`` returns the dict).
- ``enumeration=False``: a release before ROCm 6.4, without
  ``amdsmi_get_gpu_enumeration_info``.
- ``init_error``: the ``err_code`` ``amdsmi_init`` fails with (e.g. ``DRIVER_NOT_LOADED``).
- ``fail(function, code, on_call=N, times=K)``: the Nth..N+K-1th calls of ``function``
  raise ``AmdSmiLibraryException(code)`` (default: the next call).

``calls`` counts every call by function name; ``initialised`` is the library's reference
count, which must be back at 0 once a probe is closed.
"""

from __future__ import annotations

import ctypes
import types
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

GiB = 2**30
MiB = 2**20

# amdsmi_status_t
SUCCESS, INVAL, NOT_SUPPORTED, NO_PERM, IO, NOT_FOUND, NOT_INIT, DRIVER_NOT_LOADED = (
    0, 1, 2, 10, 12, 31, 32, 34,
)  # fmt: skip
_STATUS_NAMES = {
    INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    IO: "AMDSMI_STATUS_IO - I/O Error",
    NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}

# amdsmi_vram_type_t
VRAM_UNKNOWN, VRAM_HBM3, VRAM_DDR5, VRAM_GDDR6, VRAM_LPDDR5 = 0, 4, 13, 22, 31

ProcessApi = Literal["dicts", "handles"]


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _STATUS_NAMES.get(
            err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"
        )

    def __str__(self) -> str:
        return f"An error occured with code: {self.err_code}({self.err_info})"

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(9)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(8)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: object, expected: type) -> None:
        super().__init__(f"Invalid parameter: {type(received)}, expected {expected}")


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1
    INIT_NON_AMD_CPUS = 1 << 2
    INIT_NON_AMD_GPUS = 1 << 3
    INIT_AMD_APUS = (1 << 0) | (1 << 1)


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


@dataclass
class FakeProcess:
    pid: int
    vram: int | None
    gtt: int | None = 0


@dataclass
class FakeGpu:
    vram_total: int = 24 * GiB
    vram_used: int = 0
    gtt_total: int = 32 * GiB
    gtt_used: int = 0
    vram_type: int = VRAM_GDDR6
    market_name: str = "AMD Radeon RX 7900 XTX"
    hip_uuid: str | None = None
    processes: list[FakeProcess] = field(default_factory=list)


def apu(**overrides: Any) -> FakeGpu:
    """A Strix Halo-like APU: a 512 MiB carve-out beside 96 GiB of GTT."""
    values: dict[str, Any] = {
        "vram_total": 512 * MiB,
        "gtt_total": 96 * GiB,
        "vram_type": VRAM_LPDDR5,
        "market_name": "AMD Radeon 8060S Graphics",
    }
    return FakeGpu(**(values | overrides))


@dataclass(frozen=True)
class FakeHandle:
    """What ``amdsmi_get_processor_handles`` hands out (an opaque pointer in the library)."""

    index: int


class FakeAmdsmi(types.ModuleType):
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiParameterException = AmdSmiParameterException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiMemoryType = AmdSmiMemoryType

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        process_api: ProcessApi = "dicts",
        enumeration: bool = True,
    ) -> None:
        super().__init__("fake_amdsmi")
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.process_api = process_api
        self.calls: Counter[str] = Counter()
        self.initialised = 0
        self.init_flags: list[object] = []
        self._failures: dict[str, dict[int, int]] = {}
        if enumeration:
            self.amdsmi_get_gpu_enumeration_info = self._enumeration_info

    # -- scripting -------------------------------------------------------------------

    def fail(self, function: str, code: int, *, on_call: int | None = None, times: int = 1) -> None:
        """Make calls ``on_call`` .. ``on_call + times - 1`` (1-based) of ``function`` raise."""
        first = self.calls[function] + 1 if on_call is None else on_call
        for number in range(first, first + times):
            self._failures.setdefault(function, {})[number] = code

    def _enter(self, function: str, *, needs_init: bool = True) -> None:
        self.calls[function] += 1
        code = self._failures.get(function, {}).pop(self.calls[function], None)
        if code is not None:
            raise AmdSmiLibraryException(code)
        if needs_init and self.initialised == 0:
            raise AmdSmiLibraryException(NOT_INIT)

    def _gpu(self, handle: object) -> FakeGpu:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise AmdSmiParameterException(handle, FakeHandle)
        return self.gpus[handle.index]

    # -- the amdsmi surface the probe uses ---------------------------------------------

    def amdsmi_init(self, flag: object = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        self._enter("amdsmi_init", needs_init=False)
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.init_flags.append(flag)
        self.initialised += 1

    def amdsmi_shut_down(self) -> None:
        self._enter("amdsmi_shut_down")
        self.initialised -= 1

    def amdsmi_get_processor_handles(self) -> list[FakeHandle]:
        self._enter("amdsmi_get_processor_handles")
        return [FakeHandle(index) for index in range(len(self.gpus))]

    def amdsmi_get_gpu_asic_info(self, processor_handle: object) -> dict[str, Any]:
        self._enter("amdsmi_get_gpu_asic_info")
        gpu = self._gpu(processor_handle)
        return {
            "market_name": gpu.market_name or "N/A",
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "device_id": "0x744c",
            "target_graphics_version": "gfx1100",
        }

    def amdsmi_get_gpu_vram_info(self, processor_handle: object) -> dict[str, Any]:
        self._enter("amdsmi_get_gpu_vram_info")
        gpu = self._gpu(processor_handle)
        return {
            "vram_type": gpu.vram_type,
            "vram_vendor": "SAMSUNG",
            "vram_size": gpu.vram_total // MiB,
            "vram_bit_width": 256,
            "vram_max_bandwidth": "N/A",
        }

    def amdsmi_get_gpu_memory_total(self, processor_handle: object, mem_type: object) -> int:
        self._enter("amdsmi_get_gpu_memory_total")
        gpu = self._gpu(processor_handle)
        kind = _memory_type(mem_type)
        return gpu.gtt_total if kind is AmdSmiMemoryType.GTT else gpu.vram_total

    def amdsmi_get_gpu_memory_usage(self, processor_handle: object, mem_type: object) -> int:
        self._enter("amdsmi_get_gpu_memory_usage")
        gpu = self._gpu(processor_handle)
        kind = _memory_type(mem_type)
        return gpu.gtt_used if kind is AmdSmiMemoryType.GTT else gpu.vram_used

    def _enumeration_info(self, processor_handle: object) -> dict[str, Any]:
        self._enter("amdsmi_get_gpu_enumeration_info")
        gpu = self._gpu(processor_handle)
        if gpu.hip_uuid is None:
            raise AmdSmiLibraryException(NOT_SUPPORTED)
        index = self.gpus.index(gpu)
        return {
            "drm_render": 128 + index,
            "drm_card": index,
            "hsa_id": index + 1,
            "hip_id": index,
            "hip_uuid": gpu.hip_uuid,
        }

    def amdsmi_get_gpu_process_list(self, processor_handle: object) -> list[Any]:
        self._enter("amdsmi_get_gpu_process_list")
        gpu = self._gpu(processor_handle)
        if self.process_api == "handles":
            return [ctypes.c_uint32(proc.pid) for proc in gpu.processes]
        return [_process_info(proc) for proc in gpu.processes]

    def amdsmi_get_gpu_process_info(self, processor_handle: object, process: object) -> Any:
        self._enter("amdsmi_get_gpu_process_info")
        gpu = self._gpu(processor_handle)
        if not isinstance(process, ctypes.c_uint32):
            raise AmdSmiParameterException(process, ctypes.c_uint32)
        for proc in gpu.processes:
            if proc.pid == process.value:
                return _process_info(proc)
        raise AmdSmiLibraryException(NOT_FOUND)


def _memory_type(mem_type: object) -> AmdSmiMemoryType:
    if not isinstance(mem_type, AmdSmiMemoryType):
        raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
    return mem_type


def _process_info(proc: FakeProcess) -> dict[str, Any]:
    # Shaped like amdsmi_interface.amdsmi_get_gpu_process_list's dicts (ROCm 6.1+).
    return {
        "name": "N/A",
        "pid": proc.pid,
        "mem": 0,
        "engine_usage": {"gfx": 0, "enc": 0},
        "memory_usage": {
            "gtt_mem": "N/A" if proc.gtt is None else proc.gtt,
            "cpu_mem": 0,
            "vram_mem": "N/A" if proc.vram is None else proc.vram,
        },
        "cu_occupancy": "N/A",
    }
