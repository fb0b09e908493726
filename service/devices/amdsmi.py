"""The amdsmi probe: AMD GPUs through ROCm's ``amdsmi`` Python library.

Per GPU it reports total/used/free and what each instance's process tree holds there
(summed over the tree's pids from ``amdsmi_get_gpu_process_list``); ``foreign`` is what
is left. Each instance's host memory is sampled beside it (PSS of the tree), as on NVML.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psutil

from service.devices.gpu_shared import LastGood, selected
from service.devices.tree import Footprints, TreeSample, instance_memory, sample_trees
from service.domain import DeviceSnapshot, ProbeReading
from service.errors import ProbeError

log = logging.getLogger("vramd.devices")

# The largest VRAM an unknown-type GPU may have and still be read as an APU's carve-out.
CARVE_OUT_MAX = 4 * 2**30

# amdsmi_vram_type_t (amdsmi.h); the values have been stable since the enum appeared.
_VRAM_TYPES = {
    0: "UNKNOWN", 1: "HBM", 2: "HBM2", 3: "HBM2E", 4: "HBM3", 5: "HBM3E",
    10: "DDR2", 11: "DDR3", 12: "DDR4", 13: "DDR5",
    17: "GDDR1", 18: "GDDR2", 19: "GDDR3", 20: "GDDR4", 21: "GDDR5", 22: "GDDR6", 23: "GDDR7",
    30: "LPDDR4", 31: "LPDDR5",
}  # fmt: skip
_SYSTEM_DRAM = frozenset({"DDR2", "DDR3", "DDR4", "DDR5", "LPDDR4", "LPDDR5"})

# amdsmi_status_t codes (AmdSmiLibraryException.err_code).
_NOT_SUPPORTED, _NOT_YET_IMPLEMENTED, _NO_PERM, _NOT_FOUND = 2, 3, 10, 31
_UNLISTABLE = frozenset({_NOT_SUPPORTED, _NOT_YET_IMPLEMENTED, _NO_PERM})
# A field amdsmi could not read may come back as the type's maximum.
_UINT64_MAX = 2**64 - 1
# ROCm's UUID form; "GPU-XX" is what ROCr shows for a GPU without a unique id.
_ROCM_UUID = re.compile(r"GPU-[0-9A-Fa-f]{8,}")


class AmdsmiUnavailable(ProbeError):
    """amdsmi cannot be used here at all: no library, no amdgpu driver, or no GPU."""


@dataclass(frozen=True, slots=True)
class _Gpu:
    index: int
    name: str
    handle: Any
    unified: bool  # an APU: its memory is the VRAM carve-out plus GTT
    vram_total: int
    gtt_total: int
    uuid: str | None  # ROCm's "GPU-<hex>", for ROCR_VISIBLE_DEVICES

    @property
    def total(self) -> int:
        return self.vram_total + self.gtt_total if self.unified else self.vram_total


class AmdsmiProbe:
    """Reads the selected AMD GPUs; ``close()`` shuts amdsmi down once.

    ``host_available`` answers the host's available memory, which caps an APU's free
    GTT (tests pass a fixed figure; the default asks psutil).

    **Discrete cards and APUs count differently.** A discrete card's memory is its VRAM:
    ``amdsmi_get_gpu_memory_total/usage(handle, AmdSmiMemoryType.VRAM)``, and a process's
    footprint is its ``vram_mem``. On an APU (Ryzen AI, Strix Halo: unified memory) the VRAM
    amdsmi reports is only the carve-out the firmware set aside (often 512 MiB to a few GiB),
    while the runtime's allocations live mostly in GTT, system RAM mapped for the GPU, which
    the driver hands out in place of the carve-out once it is full. A budget of the carve-out
    alone would say a 128 GiB machine has room for nothing. So on an APU the device's total
    is VRAM + GTT total, ``used`` is VRAM + GTT used, and a process's footprint is
    ``vram_mem + gtt_mem``. GTT is only a ceiling on ordinary RAM that the CPU's processes
    share: its free part is capped at the host's available memory, so memory held by CPU
    programs makes the device's ``free`` (and the ledger's view of what fits) smaller, as it
    does for the runtime. ``used + free`` can then be below ``total``.

    **Telling them apart.** The kernel knows (``AMD_IS_APU``), but amdsmi does not pass that
    flag on. The rule here, decided once per GPU when the probe opens it:

    1. ``amdsmi_get_gpu_vram_info(handle)["vram_type"]``: system DRAM (DDR2-5, LPDDR4/5) is
       an APU, whose "VRAM" is a slice of the machine's RAM; GDDR and HBM are a discrete
       card. This is what the memory is, not a guess from its size, so a Strix Halo whose
       firmware carves out 96 GiB is still an APU.
    2. Where the type is unknown (older amdsmi releases lack the DDR5 and LPDDR values and
       report ``UNKNOWN`` for them, or the call fails): an APU when the VRAM is at most
       ``CARVE_OUT_MAX`` and smaller than GTT, the carve-out's shape. No ROCm-capable
       discrete card has that little VRAM; a wrong "discrete" verdict (a large carve-out of
       unknown type) undercounts, which is the safe side.

    The verdict is logged per GPU at startup.

    **Placement.** ``placement_env`` sets ``ROCR_VISIBLE_DEVICES`` alone. ROCr is the layer
    below HIP, and HIP numbers what ROCr left visible: setting ``HIP_VISIBLE_DEVICES`` as
    well would filter twice, and ROCr and HIP may even order GPUs differently (ROCr groups
    GPUs of one architecture), so the same number in both can select nothing. Each GPU is
    named by its ROCm UUID (``GPU-<hex>``, ``hip_uuid`` from
    ``amdsmi_get_gpu_enumeration_info``, ROCm 6.4 and later), which ROCr accepts in place
    of an index and which does not depend on any enumeration order. Where no UUID is to be
    had (older ROCm, or a GPU without a unique id) the GPU is named by its amdsmi index,
    which assumes amdsmi and ROCr number GPUs alike (they do on a machine whose GPUs are one
    model); the probe logs that assumption once. A service whose ``env`` selects devices
    itself (``ROCR_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``, or ``CUDA_VISIBLE_DEVICES``,
    which HIP honours too) is filtered by both, so such a service should set
    ``ROCR_VISIBLE_DEVICES`` (which then replaces this one) and nothing else.

    **Library versions.** ROCm 6.1 and later return one dict per process (``pid``,
    ``memory_usage`` with ``gtt_mem``, ``cpu_mem``, ``vram_mem`` in bytes); the 5.7/6.0
    bindings returned process handles (a ``c_uint32`` holding the pid) to pass to
    ``amdsmi_get_gpu_process_info``, which returns the same dict. Both are read. The init
    flag is ``AmdSmiInitFlags.INIT_AMD_GPUS`` (``AMD_GPUS`` in 5.x).

    Failure policy, as on NVML: amdsmi failing to start at all raises ``AmdsmiUnavailable``
    (``create_probe`` then tries the next backend in ``auto``). After a good start nothing
    raises: a failed read returns the last good device figures with ``degraded`` saying why,
    and the next good read recovers. Per-process memory amdsmi cannot report (a process list
    refused with ``NOT_SUPPORTED``/``NO_PERM``, a field that reads ``N/A``, a process whose
    info cannot be read) makes attribution partial: the reading says so in ``degraded`` and
    that memory counts as foreign rather than guessed. Without the rights to read another
    user's ``/proc/PID/fdinfo``, amdsmi reports such processes' GTT as 0: vramd's own
    runtimes run as the daemon's user, so their figures stay whole.
    """

    backend: str = "amdsmi"

    def __init__(
        self,
        amdsmi: Any,
        gpus: Sequence[int] | Literal["all"] = "all",
        *,
        host_available: Callable[[], int] | None = None,
    ) -> None:
        self._smi = amdsmi
        self._error: type[BaseException] = amdsmi.AmdSmiException
        self._host_available = host_available or _host_available
        self._lock = threading.Lock()
        self._closed = False
        self._footprints = Footprints()
        self._vram = amdsmi.AmdSmiMemoryType.VRAM
        self._gtt = amdsmi.AmdSmiMemoryType.GTT
        try:
            amdsmi.amdsmi_init(_gpu_init_flag(amdsmi))
        except self._error as exc:
            raise AmdsmiUnavailable(f"amdsmi did not initialise: {_describe(exc)}") from exc
        try:
            self._gpus = self._open(gpus)
        except BaseException:
            self.close()
            raise
        self._by_index = {gpu.index: gpu for gpu in self._gpus}
        self._last_good = LastGood("amdsmi")

    @property
    def indexes(self) -> tuple[int, ...]:
        return tuple(gpu.index for gpu in self._gpus)

    def _open(self, gpus: Sequence[int] | Literal["all"]) -> tuple[_Gpu, ...]:
        smi = self._smi
        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except self._error as exc:
            raise AmdsmiUnavailable(f"amdsmi could not list GPUs: {_describe(exc)}") from exc
        count = len(handles)
        if count == 0:
            raise AmdsmiUnavailable("amdsmi initialised but reports no GPU")
        wanted = selected(gpus, count, "amdsmi")
        opened = []
        for index in wanted:
            handle = handles[index]
            try:
                vram_total = int(smi.amdsmi_get_gpu_memory_total(handle, self._vram))
                gtt_total = int(smi.amdsmi_get_gpu_memory_total(handle, self._gtt))
            except self._error as exc:
                raise ProbeError(f"GPU {index} could not be opened: {_describe(exc)}") from exc
            unified, why = _is_unified(self._vram_type(handle), vram_total, gtt_total)
            gpu = _Gpu(
                index=index,
                name=self._name(handle, index),
                handle=handle,
                unified=unified,
                vram_total=vram_total,
                gtt_total=gtt_total,
                uuid=self._uuid(handle),
            )
            log.info("amdsmi GPU %d (%s): %s", index, gpu.name, why)
            if gpu.uuid is None and count > 1:
                log.info(
                    "amdsmi GPU %d has no ROCm UUID; ROCR_VISIBLE_DEVICES names it by its "
                    "amdsmi index, assuming ROCm numbers the GPUs alike",
                    index,
                )
            opened.append(gpu)
        return tuple(opened)

    def _name(self, handle: Any, index: int) -> str:
        try:
            name = self._smi.amdsmi_get_gpu_asic_info(handle).get("market_name")
        except self._error:
            name = None
        return name if isinstance(name, str) and name not in ("", "N/A") else f"AMD GPU {index}"

    def _vram_type(self, handle: Any) -> str | None:
        try:
            value = self._smi.amdsmi_get_gpu_vram_info(handle).get("vram_type")
        except self._error:
            return None
        if isinstance(value, str):  # a name, in case a release spells it out
            return value.upper().removeprefix("AMDSMI_VRAM_TYPE_")
        if isinstance(value, int):  # the C enum's value (an int or an IntEnum)
            return _VRAM_TYPES.get(int(value), "UNKNOWN")
        return None

    def _uuid(self, handle: Any) -> str | None:
        enumeration = getattr(self._smi, "amdsmi_get_gpu_enumeration_info", None)
        if enumeration is None:  # before ROCm 6.4
            return None
        try:
            uuid = enumeration(handle).get("hip_uuid")
        except self._error:
            return None
        return uuid if isinstance(uuid, str) and _ROCM_UUID.fullmatch(uuid) else None

    def read(self, instances: Mapping[str, int]) -> ProbeReading:
        with self._lock:
            if self._closed:
                raise ProbeError("the amdsmi probe is closed")
            trees = sample_trees(instances, self._footprints)
            try:
                return self._read(trees)
            except self._error as exc:
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
            used, free = self._memory(gpu)
            managed = 0
            for pid, usage in self._processes(gpu, gaps).items():
                instance = owner.get(pid)
                if instance is None:
                    continue
                if usage is None:
                    gaps.append(f"GPU {gpu.index} does not report memory of pid {pid} ({instance})")
                    continue
                if usage == 0:
                    # Older releases list every KFD process under every GPU; one that
                    # holds nothing here is not placed here.
                    continue
                managed += usage
                on = device_bytes[instance]
                on[gpu.index] = on.get(gpu.index, 0) + usage
            snapshots.append(
                DeviceSnapshot(gpu.index, gpu.total, used, free, managed, name=gpu.name)
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

    def _memory(self, gpu: _Gpu) -> tuple[int, int]:
        """(used, free) of one GPU: VRAM, or on an APU VRAM + GTT (the module docstring)."""
        smi = self._smi
        vram_used = int(smi.amdsmi_get_gpu_memory_usage(gpu.handle, self._vram))
        vram_free = max(0, gpu.vram_total - vram_used)
        if not gpu.unified:
            return vram_used, vram_free
        gtt_used = int(smi.amdsmi_get_gpu_memory_usage(gpu.handle, self._gtt))
        gtt_free = max(0, min(gpu.gtt_total - gtt_used, self._host_available()))
        return vram_used + gtt_used, vram_free + gtt_free

    def _processes(self, gpu: _Gpu, gaps: list[str]) -> dict[int, int | None]:
        """pid -> bytes on this GPU (None: unknown); a pid listed twice counts once, at most."""
        found: dict[int, int | None] = {}
        for entry in self._list(gpu, gaps):
            if isinstance(entry, Mapping):
                info: Any = entry
            else:  # a process handle (5.7/6.0 bindings): its info is a second call
                try:
                    info = self._smi.amdsmi_get_gpu_process_info(gpu.handle, entry)
                except self._error as exc:
                    pid = _handle_pid(entry)
                    if _code(exc) != _NOT_FOUND and pid is not None:  # NOT_FOUND: it exited
                        found.setdefault(pid, None)
                    continue
            pid, usage = int(info["pid"]), _footprint(info.get("memory_usage"), gpu.unified)
            before = found.get(pid)
            if before is not None:
                usage = before if usage is None else max(before, usage)
            found[pid] = usage
        return found

    def _list(self, gpu: _Gpu, gaps: list[str]) -> list[Any]:
        try:
            return list(self._smi.amdsmi_get_gpu_process_list(gpu.handle))
        except self._error as exc:
            if _code(exc) not in _UNLISTABLE:
                raise
            gaps.append(f"GPU {gpu.index} cannot list processes ({_describe(exc)})")
            return []

    def holding(self, pids: Collection[int]) -> set[int]:
        """The pids that any selected GPU still lists.

        On an amdsmi error the answer is "all of them": a barrier must not open on a
        reading it could not take.
        """
        wanted = set(pids)
        with self._lock:
            if self._closed:
                raise ProbeError("the amdsmi probe is closed")
            listed: set[int] = set()
            try:
                for gpu in self._gpus:
                    for entry in self._list(gpu, []):
                        pid = (
                            int(entry["pid"]) if isinstance(entry, Mapping) else _handle_pid(entry)
                        )
                        if pid is not None:
                            listed.add(pid)
            except self._error:
                return wanted
        return wanted & listed

    def placement_env(self, devices: Sequence[int]) -> dict[str, str]:
        """``ROCR_VISIBLE_DEVICES``: each GPU's ROCm UUID, else its index (module docstring)."""
        names = []
        for device in devices:
            gpu = self._by_index.get(device)
            names.append(gpu.uuid if gpu is not None and gpu.uuid else str(device))
        return {"ROCR_VISIBLE_DEVICES": ",".join(names)}

    def _stale(self, trees: Mapping[str, TreeSample], exc: BaseException) -> ProbeReading:
        gpus = {gpu.index: gpu.name for gpu in self._gpus}
        return self._last_good.serve(self.backend, gpus, trees, _describe(exc))

    def close(self) -> None:
        """Shut amdsmi down, once; later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._smi.amdsmi_shut_down()
            except self._error as exc:
                log.warning("amdsmi_shut_down failed: %s", _describe(exc))


def _is_unified(kind: str | None, vram_total: int, gtt_total: int) -> tuple[bool, str]:
    """Whether a GPU is an APU, and why (the rule in the module docstring)."""
    if kind in _SYSTEM_DRAM:
        return True, f"{kind} system memory: an APU; counting VRAM carve-out + GTT"
    if kind is not None and kind != "UNKNOWN":
        return False, f"{kind}: a discrete card; counting VRAM"
    if vram_total <= CARVE_OUT_MAX and gtt_total > vram_total:
        return True, "memory type unknown, VRAM a carve-out below GTT: an APU; counting VRAM + GTT"
    return False, "memory type unknown: counting VRAM as a discrete card's"


def _footprint(memory: Any, unified: bool) -> int | None:
    """A process's bytes from its ``memory_usage`` dict; None where a figure is unknown."""
    if not isinstance(memory, Mapping):
        return None
    total = 0
    for key in ("vram_mem", "gtt_mem") if unified else ("vram_mem",):
        value = memory.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _UINT64_MAX:
            return None  # missing, "N/A", or the not-available sentinel
        total += value
    return total


def _gpu_init_flag(amdsmi: Any) -> Any:
    flags = amdsmi.AmdSmiInitFlags
    return flags.INIT_AMD_GPUS if hasattr(flags, "INIT_AMD_GPUS") else flags.AMD_GPUS


def _handle_pid(handle: Any) -> int | None:
    """The pid a 5.7/6.0 process handle (a ctypes ``c_uint32``) carries."""
    try:
        return int(getattr(handle, "value", handle))
    except (TypeError, ValueError):
        return None


def _host_available() -> int:
    return int(psutil.virtual_memory().available)


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "err_code", None)
    return code if isinstance(code, int) else None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
