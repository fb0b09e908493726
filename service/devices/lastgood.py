"""The last good reading of a GPU probe, served (flagged) while the driver fails.

Both GPU probes share one failure policy (``nvml`` module docstring): after a good start
nothing raises; a read that fails returns the last good device figures, with
``degraded`` saying why, and the next good read recovers. ``LastGood`` keeps those
figures and says each change of state once in the log, not once per sample.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from service.devices.tree import TreeSample, instance_memory
from service.domain import DeviceSnapshot, ProbeReading

log = logging.getLogger("vramd.devices")


class LastGood:
    """``library`` names the driver library in messages (``NVML``, ``amdsmi``)."""

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
