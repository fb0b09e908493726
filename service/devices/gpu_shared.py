"""What both GPU probes (``nvml``, ``amdsmi``) share: which GPUs, and the last good reading.

``selected`` turns ``device.gpus`` into the indexes to open, with the same errors for
every driver library.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from service.devices.tree import TreeSample, instance_memory
from service.domain import DeviceSnapshot, ProbeReading
from service.errors import ProbeError

log = logging.getLogger("vramd.devices")


def selected(gpus: Sequence[int] | Literal["all"], count: int, library: str) -> list[int]:
    """The GPU indexes ``device.gpus`` names, each once, in its order; ``ProbeError`` for
    an empty list or an index the machine does not have (``library`` reports ``count``)."""
    wanted = list(range(count)) if gpus == "all" else list(dict.fromkeys(gpus))
    if not wanted:
        raise ProbeError("device.gpus is an empty list: name at least one GPU index")
    unknown = [index for index in wanted if not 0 <= index < count]
    if unknown:
        raise ProbeError(
            f"device.gpus names GPU index {', '.join(map(str, unknown))}, but {library} "
            f"reports {count} GPU(s) (indexes 0..{count - 1})"
        )
    return wanted


class LastGood:
    """``library`` names the driver library in messages (``NVML``, ``amdsmi``).

    Both probes share one failure policy (``nvml`` module docstring): after a good start
    nothing raises; a read that fails returns the last good device figures, with
    ``degraded`` saying why, and the next good read recovers. ``LastGood`` keeps those
    figures and says each change of state once in the log, not once per sample.
    """

    def __init__(self, library: str) -> None:
        self._library = library
        self._devices: dict[int, DeviceSnapshot] = {}
        self._device_bytes: dict[str, dict[int, int]] = {}
        self._failing = False

    def keep(
        self, devices: Iterable[DeviceSnapshot], device_bytes: Mapping[str, dict[int, int]]
    ) -> None:
        """A good read: remember it (and say that reads recovered, if they had failed)."""
        if self._failing:
            log.info("%s reads recovered", self._library)
            self._failing = False
        self._devices = {snapshot.index: snapshot for snapshot in devices}
        self._device_bytes = dict(device_bytes)

    def serve(
        self,
        backend: str,
        gpus: Mapping[int, str],
        trees: Mapping[str, TreeSample],
        error: str,
    ) -> ProbeReading:
        """The last good figures (zeros before the first) for ``gpus`` (index -> name),
        flagged with ``error``."""
        if not self._failing:
            log.warning("%s read failed: %s; serving the last good figures", self._library, error)
            self._failing = True
        devices = tuple(
            self._devices.get(index, DeviceSnapshot(index, 0, 0, 0, name=name))
            for index, name in gpus.items()
        )
        what = "last good device figures" if self._devices else "no good reading yet: zeros"
        return ProbeReading(
            backend=backend,
            devices=devices,
            instances=instance_memory(trees, self._device_bytes),
            degraded=f"{self._library} read failed ({error}); showing {what}",
        )
