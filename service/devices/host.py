"""The host-memory probe: the machine's RAM as the one device, for machines without a GPU.

This is what the demo and the tests run against (docs/policy.md, "No GPU: host memory
and the demo runtime"): runtimes there are real processes holding real memory, so the
budget arithmetic is exercised end to end.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import psutil

from service.devices.tree import Footprints, sample_trees
from service.domain import DeviceSnapshot, InstanceMemory, ProbeReading


class HostProbe:
    """One device (index 0, ``"host"``); an instance's footprint is its tree's PSS.

    The device's ``free`` is the kernel's *available* figure, not its *free* one: page cache
    and reclaimable slabs are handed back on demand, so counting them as used would make
    every long-running machine look full. ``used = total - available`` follows from it, and
    ``foreign`` (what other programs hold) is ``used`` less our instances' footprints.
    """

    backend: str = "host"

    def __init__(self) -> None:
        self._footprints = Footprints()

    def read(self, instances: Mapping[str, int]) -> ProbeReading:
        trees = sample_trees(instances, self._footprints)
        memory = psutil.virtual_memory()
        measured = {
            key: InstanceMemory(
                device_bytes=tree.host_bytes,
                host_bytes=tree.host_bytes,
                pids=tree.pids,
                per_device={0: tree.host_bytes},
            )
            for key, tree in trees.items()
        }
        device = DeviceSnapshot(
            index=0,
            name="host",
            total=memory.total,
            used=memory.total - memory.available,
            free=memory.available,
            managed=sum(tree.host_bytes for tree in trees.values()),
        )
        return ProbeReading(backend=self.backend, devices=(device,), instances=measured)

    def holding(self, pids: Collection[int]) -> set[int]:
        """Host memory is back when the process is gone (a zombie holds none)."""
        alive = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return alive

    def placement_env(self, devices: Sequence[int]) -> dict[str, str]:
        """Host memory has no device to choose: nothing to set."""
        return {}

    def close(self) -> None:
        """Nothing to release; here so every probe can be closed the same way."""
