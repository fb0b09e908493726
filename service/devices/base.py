"""The device-probe interface, and the one function that picks a backend.

The ledger only ever sees ``DeviceProbe.read``: every device's figures and every managed
instance's footprint in one ``ProbeReading``. Three backends implement it, ``nvml``
(NVIDIA GPUs), ``amdsmi`` (AMD GPUs and APUs through ROCm) and ``host`` (the machine's RAM,
for machines without a GPU and for the tests); anything else that implements the Protocol
(a test fake) can be handed to the app instead.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Collection, Mapping, Sequence
from types import ModuleType
from typing import Literal, Protocol

from service.devices.amdsmi import AmdsmiProbe, AmdsmiUnavailable
from service.devices.host import HostProbe
from service.devices.nvml import NvmlProbe, NvmlUnavailable
from service.domain import ProbeReading
from service.errors import ProbeError

log = logging.getLogger("vramd.devices")

BACKENDS = ("auto", "nvml", "amdsmi", "host")


class DeviceProbe(Protocol):
    """Measures device memory and what each managed instance holds.

    ``read`` blocks (it walks the process table and may call into the driver), so the
    daemon calls it from a worker thread. It never raises because a process vanished
    mid-read, and a backend that cannot read its devices reports that in
    ``ProbeReading.degraded`` instead of raising.
    """

    backend: str

    def read(self, instances: Mapping[str, int]) -> ProbeReading:
        """Sample every device, and every instance's tree.

        ``instances`` maps an instance key to its root pid (the process-group leader the
        supervisor spawned). Every key is answered; a key whose processes are gone
        gets zero bytes and no pids.
        """
        ...

    def holding(self, pids: Collection[int]) -> set[int]:
        """Which of ``pids`` still hold memory on a device (the settle barrier's question).

        A runtime's exit is not the moment its memory is free: NVML keeps listing a
        process until the driver has torn its context down. After a stop, the daemon
        waits until this returns nothing for the instance's last known pids.
        """
        ...

    def placement_env(self, devices: Sequence[int]) -> dict[str, str]:
        """The environment that shows a runtime exactly ``devices``, in that order.

        NVML: ``CUDA_VISIBLE_DEVICES`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so CUDA's
        numbering is NVML's); amdsmi: ``ROCR_VISIBLE_DEVICES`` (ROCm UUIDs where known);
        the host backend: nothing. A service's own ``env`` wins.
        """
        ...

    def close(self) -> None: ...


def create_probe(
    backend: str = "auto",
    gpus: Sequence[int] | Literal["all"] = "all",
    *,
    nvml: ModuleType | None = None,
    amdsmi: ModuleType | None = None,
) -> DeviceProbe:
    """Build the probe for ``device.backend``.

    ``auto`` uses NVML when it initialises and reports at least one GPU, else amdsmi on
    the same terms, else the host; ``nvml`` and ``amdsmi`` insist (``ProbeError`` saying
    why they cannot); ``host`` never touches a GPU library. A ``gpus`` index the machine
    does not have is a ``ProbeError`` under ``auto`` too: a GPU that was asked for by
    number is a configuration, not a guess to fall back from. ``nvml`` and ``amdsmi``
    replace the ``pynvml`` and ``amdsmi`` modules (tests pass fakes).
    """
    if backend not in BACKENDS:
        raise ProbeError(f"device.backend is {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "host":
        log.info("device backend: host (configured)")
        return HostProbe()
    probe: NvmlProbe | AmdsmiProbe
    if backend in ("auto", "nvml"):
        try:
            probe = NvmlProbe(nvml if nvml is not None else _import_pynvml(), gpus)
        except NvmlUnavailable as exc:
            if backend == "nvml":
                raise ProbeError(f"device.backend is nvml, but {exc}") from exc
            log.info("device backend: not nvml (auto: %s); trying amdsmi", exc)
        else:
            log.info("device backend: nvml (GPUs %s)", ", ".join(map(str, probe.indexes)))
            return probe
    # Here the backend is auto (NVML did not answer) or amdsmi.
    try:
        probe = AmdsmiProbe(amdsmi if amdsmi is not None else _import_amdsmi(), gpus)
    except AmdsmiUnavailable as exc:
        if backend == "amdsmi":
            raise ProbeError(f"device.backend is amdsmi, but {exc}") from exc
        log.info("device backend: host (auto: %s)", exc)
        if gpus != "all":
            log.warning("device.gpus %s is ignored: the host backend has one device", gpus)
        return HostProbe()
    log.info("device backend: amdsmi (GPUs %s)", ", ".join(map(str, probe.indexes)))
    return probe


def _import_pynvml() -> ModuleType:
    # Imported on demand so that the host backend never needs the binding.
    import os

    simulated = os.environ.get("VRAMD_SIMULATED_GPUS")
    if simulated:
        # service.simgpu: the same NVML calls, answered from a shared state file.
        log.warning("GPUs are simulated: NVML answers from %s (VRAMD_SIMULATED_GPUS)", simulated)
        return importlib.import_module("service.simgpu.nvml")
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is missing: {exc}") from exc


def _import_amdsmi() -> ModuleType:
    # ROCm ships the binding (/opt/rocm/share/amd_smi), not PyPI; importing it loads
    # libamd_smi.so, which raises OSError where the library is missing.
    try:
        return importlib.import_module("amdsmi")
    except (ImportError, OSError) as exc:
        raise AmdsmiUnavailable(f"the amdsmi module (ROCm's AMD SMI) is missing: {exc}") from exc
