"""The NVML probe: NVIDIA GPUs through ``pynvml`` (nvidia-ml-py).

Per GPU it reports total/used/free and what each instance's process tree holds there
(the sum of ``usedGpuMemory`` over the tree's pids, from both the compute and the
graphics process lists); ``foreign`` is what is left. Each instance's host memory is
sampled beside it (PSS of the tree), since host-side creep is invisible on the GPU.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from service.devices.gpu_shared import LastGood, selected
from service.devices.tree import Footprints, TreeSample, instance_memory, sample_trees
from service.domain import DeviceSnapshot, ProbeReading
from service.errors import ProbeError

log = logging.getLogger("vramd.devices")

_PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")


class NvmlUnavailable(ProbeError):
    """NVML cannot be used here at all: no library, no driver, or no GPU."""


@dataclass(frozen=True, slots=True)
class _Gpu:
    index: int
    name: str
    handle: Any


class NvmlProbe:
    """Reads the selected GPUs; ``close()`` shuts NVML down once.

    Why ``nvmlDeviceGetMemoryInfo_v2``: on current drivers v1 reports ``used = total - free``,
    which includes the memory the driver and firmware reserve for themselves. That reserve
    would then look like a foreign process holding memory. v2 reports it apart, and since no
    process can ever get it, the snapshot's ``total`` is the usable ``total - reserved``, so
    ``used + free == total`` here as on the host backend and the budget never hands the
    reserve out. Where v2 is missing (older driver or binding) the probe falls back to v1 for
    good: slightly pessimistic, still correct.

    Failure policy: NVML failing to start at all raises ``NvmlUnavailable`` (``create_probe``
    then falls back to the host probe in ``auto``). After a good start nothing raises: a
    failed read (GPU lost, driver hiccup) returns the last good device figures with
    ``degraded`` saying why, and the next good read recovers. Per-process memory that NVML
    cannot report (``usedGpuMemory`` None, or a process list the GPU does not support) makes
    attribution partial: the reading says so in ``degraded`` and that memory counts as
    foreign rather than guessed.
    """

    backend: str = "nvml"

    def __init__(self, nvml: Any, gpus: Sequence[int] | Literal["all"] = "all") -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._closed = False
        self._footprints = Footprints()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML did not initialise: {_describe(exc)}") from exc
        try:
            self._gpus = self._open(gpus)
        except BaseException:
            self.close()
            raise
        self._use_v2 = hasattr(nvml, "nvmlMemory_v2")
        # TypeError: a binding whose nvmlDeviceGetMemoryInfo takes no version argument.
        self._v2_missing: tuple[type[BaseException], ...] = (
            *_error_classes(
                nvml,
                "NVMLError_FunctionNotFound",
                "NVMLError_NotSupported",
                "NVMLError_ArgumentVersionMismatch",
            ),
            TypeError,
        )
        self._abi_missing = _error_classes(
            nvml, "NVMLError_FunctionNotFound", "NVMLLibraryMismatchError"
        )
        self._unlistable = (
            *self._abi_missing,
            *_error_classes(nvml, "NVMLError_NotSupported", "NVMLError_NoPermission"),
        )
        self._list_functions = {name: getattr(nvml, name) for name in _PROCESS_LISTS}
        self._last_good = LastGood("NVML")

    @property
    def indexes(self) -> tuple[int, ...]:
        return tuple(gpu.index for gpu in self._gpus)

    def _open(self, gpus: Sequence[int] | Literal["all"]) -> tuple[_Gpu, ...]:
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not count GPUs: {_describe(exc)}") from exc
        if count == 0:
            raise NvmlUnavailable("NVML initialised but reports no GPU")
        wanted = selected(gpus, count, "NVML")
        opened = []
        for index in wanted:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = _text(nvml.nvmlDeviceGetName(handle))
            except nvml.NVMLError as exc:
                raise ProbeError(f"GPU {index} could not be opened: {_describe(exc)}") from exc
            opened.append(_Gpu(index=index, name=name, handle=handle))
        return tuple(opened)

    def read(self, instances: Mapping[str, int]) -> ProbeReading:
        with self._lock:
            if self._closed:
                raise ProbeError("the NVML probe is closed")
            trees = sample_trees(instances, self._footprints)
            try:
                return self._read(trees)
            except self._nvml.NVMLError as exc:
                return self._stale(trees, exc)

    def _read(self, trees: Mapping[str, TreeSample]) -> ProbeReading:
        owner: dict[int, str] = {}
        for key, tree in trees.items():
            for pid in tree.pids:
                owner.setdefault(pid, key)
        device_bytes: defaultdict[str, dict[int, int]] = defaultdict(dict)
        gaps: list[str] = []
        snapshots = []
        for gpu in self._gpus:
            visible, total, used, free = self._memory(gpu.handle)
            managed = 0
            for pid, usage in self._processes(gpu, gaps).items():
                instance = owner.get(pid)
                if instance is None:
                    continue
                if usage is None:
                    gaps.append(f"GPU {gpu.index} does not report memory of pid {pid} ({instance})")
                    continue
                managed += usage
                on = device_bytes[instance]
                on[gpu.index] = on.get(gpu.index, 0) + usage
            snapshots.append(
                DeviceSnapshot(
                    gpu.index, total, used, free, managed, name=gpu.name, visible_total=visible
                )
            )
        self._last_good.keep(snapshots, device_bytes)
        degraded: str | None = None
        if gaps:
            degraded = "partial attribution (counted as foreign): " + "; ".join(gaps)
        return ProbeReading(
            backend=self.backend,
            devices=tuple(snapshots),
            instances=instance_memory(trees, device_bytes),
            degraded=degraded,
        )

    def holding(self, pids: Collection[int]) -> set[int]:
        """The pids that any selected GPU still lists as holding memory.

        On an NVML error the answer is "all of them": a barrier must not open on a
        reading it could not take.
        """
        wanted = set(pids)
        with self._lock:
            if self._closed:
                raise ProbeError("the NVML probe is closed")
            try:
                listed: set[int] = set()
                for gpu in self._gpus:
                    listed.update(self._processes(gpu, []))
            except self._nvml.NVMLError:
                return wanted
        return wanted & listed

    def placement_env(self, devices: Sequence[int]) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` in NVML's numbering, which is PCI bus order.

        CUDA numbers devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a
        box whose cards differ, index 0 would then be another GPU than NVML's 0, and the
        runtime would allocate on a device vramd did not admit it to.
        """
        # Simulated GPUs (service.simgpu) name their state file for the runtime too.
        simulated = getattr(self._nvml, "vramd_runtime_env", None)
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in devices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            **(simulated() if callable(simulated) else {}),
        }

    def _memory(self, handle: Any) -> tuple[int, int, int, int]:
        """(total a runtime sees, usable total, used, free) of one GPU."""
        nvml = self._nvml
        if self._use_v2:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            except self._v2_missing as exc:
                log.info("NVML memory info v2 unavailable (%s); using v1", _describe(exc))
                self._use_v2 = False
            else:
                total = int(info.total)
                return total, total - int(info.reserved), int(info.used), int(info.free)
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.total), int(info.used), int(info.free)

    def _processes(self, gpu: _Gpu, gaps: list[str]) -> dict[int, int | None]:
        """pid -> bytes on this GPU (None: unknown), merged over the compute and graphics lists.

        A process with both kinds of context appears in both lists with its whole use, so
        a pid is counted once, at the larger known figure.
        """
        found: dict[int, int | None] = {}
        for name in _PROCESS_LISTS:
            for proc in self._list(name, gpu, gaps):
                pid, usage = int(proc.pid), proc.usedGpuMemory
                before = found.get(pid)
                if before is not None:
                    usage = before if usage is None else max(before, int(usage))
                found[pid] = None if usage is None else int(usage)
        return found

    def _list(self, name: str, gpu: _Gpu, gaps: list[str]) -> list[Any]:
        function = self._list_functions[name]
        try:
            return list(function(gpu.handle))
        except self._unlistable as exc:
            # The unversioned functions call the newest ABI; an older driver lacks it and
            # pynvml says so with FunctionNotFound or NVMLLibraryMismatchError. Step down
            # to the _v2 ABI once. Past that, or when the GPU refuses (NotSupported, e.g.
            # a MIG parent; NoPermission in some containers), the list is not available.
            older = getattr(self._nvml, f"{name}_v2", None)
            if isinstance(exc, self._abi_missing) and older is not None and function is not older:
                self._list_functions[name] = older
                return self._list(name, gpu, gaps)
            gaps.append(f"GPU {gpu.index} cannot list processes ({_describe(exc)})")
            return []

    def _stale(self, trees: Mapping[str, TreeSample], exc: BaseException) -> ProbeReading:
        gpus = {gpu.index: gpu.name for gpu in self._gpus}
        return self._last_good.serve(self.backend, gpus, trees, _describe(exc))

    def close(self) -> None:
        """Shut NVML down, once; later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", _describe(exc))


def _error_classes(nvml: Any, *names: str) -> tuple[type[BaseException], ...]:
    """The named exception classes this binding has (older bindings lack some)."""
    return tuple(getattr(nvml, name) for name in names if hasattr(nvml, name))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
